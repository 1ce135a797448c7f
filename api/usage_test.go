package api_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api/projects"
	"github.com/better-compute/better-compute/api/usage"
	"github.com/better-compute/better-compute/core"
)

// usageBase is an hour in the past: windows below end before now, so the
// sums do not depend on the clock.
var usageBase = time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)

func usageAt(h float64) time.Time { return usageBase.Add(time.Duration(h * float64(time.Hour))) }

func usageMs(h float64) int64 { return usageAt(h).UnixMilli() }

// meter inserts a metering interval [start, end) in hours from usageBase;
// end < 0 leaves it open.
func (e *env) meter(rsv, tenant, project, class, model string, units int, start, end float64) {
	e.t.Helper()
	var ended *time.Time
	if end >= 0 {
		t := usageAt(end)
		ended = &t
	}
	if _, err := e.store.Pool.Exec(context.Background(), `INSERT INTO usage_intervals
		(reservation_id, tenant_id, project_id, pool_id, gpu_model, class, units, started_at, ended_at)
		VALUES ($1, $2, $3, 'pool_1', $4, $5, $6, $7, $8)`, rsv, tenant, project, model, class, units, usageAt(start), ended); err != nil {
		e.t.Fatal(err)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func TestUsageList(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, g := e.client(e.boot.UserToken), e.client(e.globex)
	p1, err := projects.Create.Call(ctx, a, projects.CreateInput{TenantID: "acme", Name: "train"})
	if err != nil {
		t.Fatal(err)
	}
	p2, err := projects.Create.Call(ctx, a, projects.CreateInput{TenantID: "acme", Name: "serve"})
	if err != nil {
		t.Fatal(err)
	}
	gp, err := projects.Create.Call(ctx, g, projects.CreateInput{TenantID: "globex", Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	// In hours from usageBase:
	e.meter("rsv_a", "acme", p1.ID, "gpu", "H100", 8, 0, 10) // [0, 10) ×8
	e.meter("rsv_b", "acme", p1.ID, "gpu", "H100", 2, 5, -1) // [5, open) ×2
	e.meter("rsv_c", "acme", p2.ID, "gpu", "L40S", 1, 2, 4)  // [2, 4) ×1
	e.meter("rsv_d", "acme", "", "mig", "A100", 7, 0, 24)    // [0, 24) ×7 MIG slices
	e.meter("rsv_g", "globex", gp.ID, "gpu", "H100", 64, 0, 10)

	// Tenant totals over [1, 6): a 5h×8=40, b 1h×2=2, c 2h×1=2, d 5h×7=35 (not GPU-hours).
	u, err := usage.List.Call(ctx, a, usage.ListInput{TenantID: "acme", From: usageMs(1), To: usageMs(6)})
	if err != nil {
		t.Fatal(err)
	}
	want := []usage.Item{
		{TenantID: "acme", Class: "gpu", GPUModel: "H100", UnitHours: 42, GPUHours: 42},
		{TenantID: "acme", Class: "gpu", GPUModel: "L40S", UnitHours: 2, GPUHours: 2},
		{TenantID: "acme", Class: "mig", GPUModel: "A100", UnitHours: 35},
	}
	checkItems(t, "tenant", u, want, 44)
	if u.GroupBy != "tenant" || u.From != usageMs(1) || u.To != usageMs(6) {
		t.Fatalf("echo = %+v", u)
	}
	// The tenant grouping names neither a project nor a reservation.
	if _, body := e.call(e.boot.UserToken, "usage.list", fmt.Sprintf(`{"tenantId":"acme","from":%d,"to":%d}`, usageMs(1), usageMs(6))); strings.Contains(body, "projectId") || strings.Contains(body, "reservationId") {
		t.Fatalf("tenant grouping = %s", body)
	}

	// By project over [0, 12): a 80, b 7h×2=14, c 2, d 12h×7=84.
	u, err = usage.List.Call(ctx, a, usage.ListInput{TenantID: "acme", From: usageMs(0), To: usageMs(12), GroupBy: "project"})
	if err != nil {
		t.Fatal(err)
	}
	byProject := map[string]usage.Item{
		"":    {TenantID: "acme", Class: "mig", GPUModel: "A100", UnitHours: 84},
		p1.ID: {TenantID: "acme", ProjectID: p1.ID, Class: "gpu", GPUModel: "H100", UnitHours: 94, GPUHours: 94},
		p2.ID: {TenantID: "acme", ProjectID: p2.ID, Class: "gpu", GPUModel: "L40S", UnitHours: 2, GPUHours: 2},
	}
	if len(u.Items) != len(byProject) || !near(u.Total, 96) {
		t.Fatalf("by project = %+v", u)
	}
	for _, it := range u.Items {
		w := byProject[it.ProjectID]
		if it.TenantID != w.TenantID || it.ProjectID != w.ProjectID || it.ReservationID != "" || it.Class != w.Class ||
			it.GPUModel != w.GPUModel || !near(it.UnitHours, w.UnitHours) || !near(it.GPUHours, w.GPUHours) {
			t.Fatalf("by project: %+v, want %+v", it, w)
		}
	}

	// By reservation, one project (decided on the project): a and b.
	u, err = usage.List.Call(ctx, a, usage.ListInput{TenantID: "acme", ProjectID: p1.ID, From: usageMs(0), To: usageMs(12), GroupBy: "reservation"})
	if err != nil {
		t.Fatal(err)
	}
	want = []usage.Item{
		{TenantID: "acme", ProjectID: p1.ID, ReservationID: "rsv_a", Class: "gpu", GPUModel: "H100", UnitHours: 80, GPUHours: 80},
		{TenantID: "acme", ProjectID: p1.ID, ReservationID: "rsv_b", Class: "gpu", GPUModel: "H100", UnitHours: 14, GPUHours: 14},
	}
	checkItems(t, "reservation", u, want, 94)
	// One project, grouped by tenant: only the project's usage.
	u, err = usage.List.Call(ctx, a, usage.ListInput{TenantID: "acme", ProjectID: p2.ID, From: usageMs(0), To: usageMs(12)})
	if err != nil {
		t.Fatal(err)
	}
	checkItems(t, "p2", u, []usage.Item{{TenantID: "acme", Class: "gpu", GPUModel: "L40S", UnitHours: 2, GPUHours: 2}}, 2)
	// A window with nothing in it.
	if u, err := usage.List.Call(ctx, a, usage.ListInput{TenantID: "acme", From: usageMs(-48), To: usageMs(-24)}); err != nil || len(u.Items) != 0 || u.Total != 0 {
		t.Fatalf("empty window = %+v, %v", u, err)
	}
	if _, body := e.call(e.boot.UserToken, "usage.list", fmt.Sprintf(`{"tenantId":"acme","from":%d,"to":%d}`, usageMs(-48), usageMs(-24))); !strings.Contains(body, `"items":[]`) {
		t.Fatalf("empty window's items are not []: %s", body)
	}

	// Tenancy: globex sees its own only and may not read acme's, nor acme's project.
	u, err = usage.List.Call(ctx, g, usage.ListInput{TenantID: "globex", From: usageMs(0), To: usageMs(12)})
	if err != nil {
		t.Fatal(err)
	}
	checkItems(t, "globex", u, []usage.Item{{TenantID: "globex", Class: "gpu", GPUModel: "H100", UnitHours: 640, GPUHours: 640}}, 640)
	if _, err := usage.List.Call(ctx, g, usage.ListInput{TenantID: "acme", From: usageMs(0), To: usageMs(12)}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex reading acme's usage = %v, want ACCESS_DENIED", err)
	}
	if _, err := usage.List.Call(ctx, g, usage.ListInput{TenantID: "acme", ProjectID: p1.ID, From: usageMs(0), To: usageMs(12)}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex reading acme's project usage = %v, want ACCESS_DENIED", err)
	}
	// acme's project is not globex's: the envelope cannot find it there.
	if _, err := usage.List.Call(ctx, g, usage.ListInput{TenantID: "globex", ProjectID: p1.ID, From: usageMs(0), To: usageMs(12)}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex naming acme's project in its own tenant = %v, want NOT_FOUND", err)
	}
	if _, err := usage.List.Call(ctx, e.client(e.stranger), usage.ListInput{TenantID: "acme", From: usageMs(0), To: usageMs(12)}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("acme's stranger reading usage = %v, want ACCESS_DENIED", err)
	}
}

func checkItems(t *testing.T, name string, got usage.Report, want []usage.Item, total float64) {
	t.Helper()
	ok := len(got.Items) == len(want) && near(got.Total, total)
	for i := 0; ok && i < len(want); i++ {
		g, w := got.Items[i], want[i]
		ok = g.TenantID == w.TenantID && g.ProjectID == w.ProjectID && g.ReservationID == w.ReservationID &&
			g.Class == w.Class && g.GPUModel == w.GPUModel && near(g.UnitHours, w.UnitHours) && near(g.GPUHours, w.GPUHours)
	}
	if !ok {
		t.Fatalf("%s:\n got %+v (total %v)\nwant %+v (total %v)", name, got.Items, got.Total, want, total)
	}
}

func TestUsageListInvalidInput(t *testing.T) {
	e := newEnv(t)
	day := int64(24 * time.Hour / time.Millisecond)
	e.wantInvalid(e.boot.UserToken, "usage.list", map[string]string{
		`{"tenantId":"acme","to":10}`:                                                        "from",
		`{"tenantId":"acme","from":10}`:                                                      "to",
		`{"tenantId":"acme","from":10,"to":10}`:                                              "to",
		`{"tenantId":"acme","from":20,"to":10}`:                                              "to",
		`{"tenantId":"acme","from":-1,"to":10}`:                                              "from",
		`{"tenantId":"acme","from":"1","to":10}`:                                             "from",
		fmt.Sprintf(`{"tenantId":"acme","from":0,"to":%d}`, 366*day+1):                       "to",
		`{"tenantId":"acme","from":0,"to":10,"groupBy":"pool"}`:                              "groupBy",
		`{"tenantId":"acme","from":0,"to":10,"projectId":"pool_01hzzzzzzzzzzzzzzzzzzzzzzz"}`: "projectId",
		`{"tenantId":"acme","from":0,"to":10,"offset":5}`:                                    "offset",
	})
	// Exactly 366 days is fine.
	if status, body := e.call(e.boot.UserToken, "usage.list", fmt.Sprintf(`{"tenantId":"acme","from":0,"to":%d}`, 366*day)); status != 200 {
		t.Fatalf("366 days = %d %s", status, body)
	}
}

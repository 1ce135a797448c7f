package api_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"

	fleetact "github.com/better-compute/better-compute/activities/fleet"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/fleet"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/core"
	dtemporal "github.com/better-compute/better-compute/deploy/temporal"
	fleetwf "github.com/better-compute/better-compute/workflows/fleet"
)

// fleetEnv is env served with a real Temporal and a worker running the
// fleet apply workflow.
func fleetEnv(t *testing.T) (*env, client.Client) {
	ctx := context.Background()
	e := newEnv(t)
	ts, err := dtemporal.Start(ctx, dtemporal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ts.Stop)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tc, err := client.DialContext(ctx, client.Options{HostPort: ts.FrontendAddr(), Logger: tlog.NewStructuredLogger(quiet)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tc.Close)
	const queue = "fleet-test-queue"
	w := worker.New(tc, queue, worker.Options{})
	fleetwf.Register(w, &fleetact.Fleet{Store: e.store, Catalog: e.catalog})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, Logger: quiet, Secrets: e.vault,
		Temporal: tc, TaskQueue: queue})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e.server, e.url = srv, hs.URL
	return e, tc
}

func fleetJSON(t *testing.T, d fleet.Document) string {
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitApply waits for the apply to leave running.
func waitApply(t *testing.T, c *api.Client, id string) fleet.Apply {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, err := fleet.StatusMethod.Call(context.Background(), c, fleet.StatusInput{TenantID: "root"})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range st.Applies {
			if a.ID == id && a.State != "running" {
				return a
			}
		}
	}
	t.Fatalf("apply %s still running", id)
	return fleet.Apply{}
}

func TestFleetAsCode(t *testing.T) {
	ctx := context.Background()
	e, tc := fleetEnv(t)
	c := e.client(e.boot.AdminToken)
	s := e.site(e.boot.AdminToken, "root", "fra-1", "shared")
	a := e.pool(e.boot.AdminToken, "root", s.ID, "a")
	e.pool(e.boot.AdminToken, "root", s.ID, "b")

	// Round trip: the export planned is no change.
	ex, err := fleet.ExportMethod.Call(ctx, c, fleet.ExportInput{TenantID: "root"})
	if err != nil || len(ex.Document.Sites) != 1 || len(ex.Document.Pools) != 2 || ex.Document.Pools[0].Name != "a" {
		t.Fatalf("export = %+v, %v", ex, err)
	}
	plan, err := fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: fleetJSON(t, ex.Document)})
	if err != nil || len(plan.Changes) != 0 || plan.Digest != ex.Digest || !core.ValidID("fplan", plan.ID) {
		t.Fatalf("round-trip plan = %+v, %v", plan, err)
	}

	// One update (a's memory), one create (c, YAML, default policy), one
	// delete (b).
	yaml := `apiVersion: better-compute/fleet/v1
sites:
- {name: fra-1, kind: shared, region: eu-central, iamRegion: eu-central-1}
pools:
- {name: a, site: fra-1, class: metal-host, gpuModel: H100, gpuMemoryGb: 94, sharing: exclusive, agent: bcd, billingMode: metered}
- {name: c, site: fra-1, class: vps-host, gpuModel: L40S, gpuMemoryGb: 48, sharing: exclusive, agent: bcd, billingMode: metered}
`
	plan, err = fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: yaml})
	if err != nil || len(plan.Changes) != 3 {
		t.Fatalf("plan = %+v, %v", plan, err)
	}
	want := []struct{ op, kind, name string }{{"update", "pool", "a"}, {"create", "pool", "c"}, {"delete", "pool", "b"}}
	for i, w := range want {
		if ch := plan.Changes[i]; ch.Op != w.op || ch.Kind != w.kind || ch.Name != w.name {
			t.Fatalf("change %d = %+v, want %v", i, ch, w)
		}
	}
	if f := plan.Changes[0].Fields; len(f) != 1 || f[0].Field != "gpuMemoryGb" || f[0].Before != float64(80) || f[0].After != float64(94) {
		t.Fatalf("update fields = %+v", f)
	}
	applied, err := fleet.ApplyMethod.Call(ctx, c, fleet.ApplyInput{TenantID: "root", PlanID: plan.ID, Digest: plan.Digest})
	if err != nil || applied.State != "running" || len(applied.Changes) != 3 {
		t.Fatalf("apply = %+v, %v", applied, err)
	}
	if done := waitApply(t, c, applied.ID); done.State != "succeeded" {
		t.Fatalf("apply ended %+v", done)
	}
	list, err := pools.List.Call(ctx, c, pools.ListInput{TenantID: "root"})
	if err != nil || len(list.Items) != 2 || list.Items[0].Name != "a" || list.Items[0].GPUMemoryGb != 94 || list.Items[1].Name != "c" ||
		list.Items[1].Class != "vps-host" {
		t.Fatalf("live pools = %+v, %v", list, err)
	}
	st, err := fleet.StatusMethod.Call(ctx, c, fleet.StatusInput{TenantID: "root"})
	if err != nil || len(st.Applies) != 1 || len(st.Drift) != 0 {
		t.Fatalf("status = %+v, %v", st, err)
	}
	for _, ch := range st.Applies[0].Changes {
		if ch.State != "done" {
			t.Fatalf("change %+v not done", ch)
		}
	}
	// A restarted workflow resumes where the rows say: nothing is left,
	// so nothing is applied twice.
	if err := fleetact.Start(ctx, tc, "fleet-test-queue", applied.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if again := waitApply(t, c, applied.ID); again.State != "succeeded" {
		t.Fatalf("restarted apply = %+v", again)
	}
	if list, err := pools.List.Call(ctx, c, pools.ListInput{TenantID: "root"}); err != nil || len(list.Items) != 2 {
		t.Fatalf("after a restart: %+v, %v", list, err)
	}
	// Applying again is stale: the live state moved on.
	if _, err := fleet.ApplyMethod.Call(ctx, c, fleet.ApplyInput{TenantID: "root", PlanID: plan.ID, Digest: plan.Digest}); codeOf(err) != core.CodeConflict {
		t.Fatalf("re-apply = %v, want CONFLICT", err)
	}

	// A pool changed directly: status shows the drift, and a plan made
	// before it is stale.
	ex, _ = fleet.ExportMethod.Call(ctx, c, fleet.ExportInput{TenantID: "root"})
	ex.Document.Pools[0].GPUMemoryGb = 141
	plan, err = fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: fleetJSON(t, ex.Document)})
	if err != nil || len(plan.Changes) != 1 {
		t.Fatalf("plan = %+v, %v", plan, err)
	}
	mem := 120
	if _, err := pools.Update.Call(ctx, c, pools.UpdateInput{TenantID: "root", PoolID: a.ID, GPUMemoryGb: &mem}); err != nil {
		t.Fatal(err)
	}
	_, err = fleet.ApplyMethod.Call(ctx, c, fleet.ApplyInput{TenantID: "root", PlanID: plan.ID, Digest: plan.Digest})
	if ce := core.AsError(err); codeOf(err) != core.CodeConflict || ce.Details["reason"] != "stale" {
		t.Fatalf("stale apply = %v, want CONFLICT stale", err)
	}
	st, err = fleet.StatusMethod.Call(ctx, c, fleet.StatusInput{TenantID: "root"})
	if err != nil || len(st.Drift) != 1 || st.Drift[0].Name != "a" || st.Drift[0].Fields[0].Before != float64(120) ||
		st.Drift[0].Fields[0].After != float64(94) {
		t.Fatalf("drift = %+v, %v", st.Drift, err)
	}

	// Refused: a pool's class never changes.
	ex.Document.Pools[0].Class = "vps-host"
	_, err = fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: fleetJSON(t, ex.Document)})
	if codeOf(err) != core.CodeInvalidState {
		t.Fatalf("class change plan = %v, want INVALID_STATE", err)
	}
	// Another tenant has no fleet document.
	if _, err := fleet.ExportMethod.Call(ctx, e.client(e.boot.UserToken), fleet.ExportInput{TenantID: "acme"}); err == nil {
		t.Fatal("acme exported a fleet")
	}
}

func TestFleetInvalidDocument(t *testing.T) {
	e := newEnv(t)
	c := e.client(e.boot.AdminToken)
	for doc, field := range map[string]string{
		"apiVersion: v0\n": "document.apiVersion",
		"apiVersion: better-compute/fleet/v1\npools:\n- {name: a, site: s, class: metal-host, gpuModel: H100, gpuMemoryGb: 0, sharing: exclusive, agent: bcd, billingMode: metered}\n": "document.pools.0.gpuMemoryGb",
		"apiVersion: better-compute/fleet/v1\npools:\n- {name: a, site: s, class: metal-host, gpuModel: H100, gpuMemoryGb: 8, sharing: exclusive, agent: bcd, billingMode: metered}\n": "document.pools.0.site",
		"apiVersion: [": "document",
	} {
		_, err := fleet.PlanMethod.Call(context.Background(), c, fleet.PlanInput{TenantID: "root", Document: doc})
		if ce := core.AsError(err); codeOf(err) != core.CodeInvalidInput || ce.Details["field"] != field {
			t.Errorf("plan %q = %v %v; want INVALID_INPUT on %s", doc, err, detailsOf(ce), field)
		}
	}
}

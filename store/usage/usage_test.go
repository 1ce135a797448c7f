package usage_test

import (
	"context"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/usage"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// base is an arbitrary hour in the past; the tests' windows end before now,
// so open intervals count up to the window's end.
var base = time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)

func hours(h float64) time.Time { return base.Add(time.Duration(h * float64(time.Hour))) }

func insertInterval(t *testing.T, s *store.Store, rsv, tenant, project, class, model string, units int, start float64, end *float64) {
	t.Helper()
	var ended *time.Time
	if end != nil {
		e := hours(*end)
		ended = &e
	}
	if _, err := s.Pool.Exec(context.Background(), `INSERT INTO usage_intervals
		(reservation_id, tenant_id, project_id, pool_id, gpu_model, class, units, started_at, ended_at)
		VALUES ($1, $2, $3, 'pool_1', $4, $5, $6, $7, $8)`, rsv, tenant, project, model, class, units, hours(start), ended); err != nil {
		t.Fatal(err)
	}
}

func f(v float64) *float64 { return &v }

func sumUsage(t *testing.T, s *store.Store, q usage.Query) []usage.Item {
	t.Helper()
	ctx := context.Background()
	var out []usage.Item
	if err := s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		var err error
		out, err = usage.Sum(ctx, tx, q)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSumUsageClipsToTheWindow(t *testing.T) {
	s := testenv.Store(t)
	// In hours from base:
	//   rsv_a  prj_1  gpu H100 ×2   [0, 10)
	//   rsv_b  prj_1  gpu H100 ×1   [8, open)
	//   rsv_c  prj_2  gpu A100 ×4   [-5, 3)
	//   rsv_d  —      mig A100 ×3   [1, 2)
	//   rsv_e  prj_2  gpu H100 ×1   [20, 30)      outside every window below
	//   rsv_x  globex gpu H100 ×100 [0, 10)       another tenant
	insertInterval(t, s, "rsv_a", "acme", "prj_1", "gpu", "H100", 2, 0, f(10))
	insertInterval(t, s, "rsv_b", "acme", "prj_1", "gpu", "H100", 1, 8, nil)
	insertInterval(t, s, "rsv_c", "acme", "prj_2", "gpu", "A100", 4, -5, f(3))
	insertInterval(t, s, "rsv_d", "acme", "", "mig", "A100", 3, 1, f(2))
	insertInterval(t, s, "rsv_e", "acme", "prj_2", "gpu", "H100", 1, 20, f(30))
	insertInterval(t, s, "rsv_x", "globex", "prj_9", "gpu", "H100", 100, 0, f(10))

	// Window [2, 12): a 8h×2=16, b 4h×1=4, c 1h×4=4, d 0 (ends at 2), e 0.
	got := sumUsage(t, s, usage.Query{TenantID: "acme", From: hours(2), To: hours(12)})
	want := []usage.Item{
		{TenantID: "acme", Class: "gpu", GPUModel: "A100", UnitHours: 4, GPUHours: 4},
		{TenantID: "acme", Class: "gpu", GPUModel: "H100", UnitHours: 20, GPUHours: 20},
	}
	checkUsage(t, "tenant [2,12)", got, want)

	// Window [0.5, 1.5): a 1h×2=2, c 1h×4=4, d 0.5h×3=1.5 (not GPU-hours).
	got = sumUsage(t, s, usage.Query{TenantID: "acme", From: hours(0.5), To: hours(1.5), GroupBy: usage.ByProject})
	want = []usage.Item{
		{TenantID: "acme", Class: "mig", GPUModel: "A100", UnitHours: 1.5},
		{TenantID: "acme", ProjectID: "prj_1", Class: "gpu", GPUModel: "H100", UnitHours: 2, GPUHours: 2},
		{TenantID: "acme", ProjectID: "prj_2", Class: "gpu", GPUModel: "A100", UnitHours: 4, GPUHours: 4},
	}
	checkUsage(t, "project [0.5,1.5)", got, want)

	// By reservation over [-10, 40), project prj_1 only: a 20, b [8, 40) = 32.
	got = sumUsage(t, s, usage.Query{TenantID: "acme", ProjectID: "prj_1", From: hours(-10), To: hours(40), GroupBy: usage.ByReservation})
	want = []usage.Item{
		{TenantID: "acme", ProjectID: "prj_1", ReservationID: "rsv_a", Class: "gpu", GPUModel: "H100", UnitHours: 20, GPUHours: 20},
		{TenantID: "acme", ProjectID: "prj_1", ReservationID: "rsv_b", Class: "gpu", GPUModel: "H100", UnitHours: 32, GPUHours: 32},
	}
	checkUsage(t, "reservation prj_1 [-10,40)", got, want)

	// A window touching intervals only at their ends counts nothing.
	if got := sumUsage(t, s, usage.Query{TenantID: "acme", From: hours(-20), To: hours(-5)}); len(got) != 0 {
		t.Fatalf("window before every interval = %+v", got)
	}
	// The other tenant sees only its own.
	got = sumUsage(t, s, usage.Query{TenantID: "globex", From: hours(0), To: hours(1)})
	checkUsage(t, "globex", got, []usage.Item{{TenantID: "globex", Class: "gpu", GPUModel: "H100", UnitHours: 100, GPUHours: 100}})
}

// An open interval counts up to now() when the window reaches past it.
func TestSumUsageCountsOpenIntervalsToNow(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	if _, err := s.Pool.Exec(ctx, `INSERT INTO usage_intervals (reservation_id, tenant_id, pool_id, gpu_model, class, units, started_at)
		VALUES ('rsv_1', 'acme', 'pool_1', 'H100', 'gpu', 2, now() - interval '3 hours')`); err != nil {
		t.Fatal(err)
	}
	var got []usage.Item
	var now time.Time
	if err := s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return err
		}
		var err error
		got, err = usage.Sum(ctx, tx, usage.Query{TenantID: "acme", From: now.Add(-24 * time.Hour), To: now.Add(24 * time.Hour)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Started three hours before the insert's now(), which is at or before this transaction's.
	if len(got) != 1 || got[0].GPUHours < 6 || got[0].GPUHours > 6+2*time.Since(now).Hours()+0.5 {
		t.Fatalf("open interval = %+v, want about 6 GPU-hours", got)
	}
	// A window that has not reached the interval's start counts nothing.
	if rows := sumUsage(t, s, usage.Query{TenantID: "acme", From: now.Add(-48 * time.Hour), To: now.Add(-24 * time.Hour)}); len(rows) != 0 {
		t.Fatalf("window before the start = %+v", rows)
	}
}

func checkUsage(t *testing.T, name string, got, want []usage.Item) {
	t.Helper()
	round := func(rows []usage.Item) []usage.Item {
		out := make([]usage.Item, len(rows))
		for i, r := range rows {
			r.UnitHours = math.Round(r.UnitHours*1e6) / 1e6
			r.GPUHours = math.Round(r.GPUHours*1e6) / 1e6
			out[i] = r
		}
		return out
	}
	if g, w := round(got), round(want); !reflect.DeepEqual(g, w) {
		t.Fatalf("%s:\n got %+v\nwant %+v", name, g, w)
	}
}

// The window is the domain's rule: non-empty and at most MaxWindow long,
// INVALID_INPUT on "to" otherwise; the tenant grouping is the default.
func TestListChecksTheWindow(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	day := (24 * time.Hour).Milliseconds()
	for name, to := range map[string]int64{"empty": 10, "backwards": 5, "over 366 days": 10 + 366*day + 1} {
		err := s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
			_, err := usage.List(ctx, tx, "acme", "", 10, to, "", store.PageQuery{Limit: 100})
			return err
		})
		var e *core.Error
		if !errors.As(err, &e) || e.Code != core.CodeInvalidInput || e.Details["field"] != "to" || e.Details["reason"] != "range" {
			t.Errorf("%s: err = %v, want INVALID_INPUT on to", name, err)
		}
	}
	var got usage.Report
	if err := s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		var err error
		got, err = usage.List(ctx, tx, "acme", "", 10, 10+366*day, "", store.PageQuery{Limit: 100})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got.GroupBy != usage.ByTenant || got.Items == nil || len(got.Items) != 0 || got.Total != 0 {
		t.Fatalf("366 days with nothing metered = %+v", got)
	}
}

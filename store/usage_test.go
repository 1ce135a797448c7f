package store_test

import (
	"context"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
)

func usageTx(t *testing.T, s *store.Store, fn func(ctx context.Context, tx store.Tx) error) {
	t.Helper()
	ctx := context.Background()
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return fn(ctx, tx) }); err != nil {
		t.Fatal(err)
	}
}

type interval struct {
	started time.Time
	ended   *time.Time
}

func intervals(t *testing.T, s *store.Store, rsv string) []interval {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `SELECT started_at, ended_at FROM usage_intervals WHERE reservation_id = $1 ORDER BY id`, rsv)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []interval
	for rows.Next() {
		var i interval
		if err := rows.Scan(&i.started, &i.ended); err != nil {
			t.Fatal(err)
		}
		out = append(out, i)
	}
	return out
}

func TestOpenAndCloseUsage(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	u := store.UsageInterval{ReservationID: "rsv_1", TenantID: "acme", ProjectID: "prj_1", PoolID: "pool_1", GPUModel: "H100", Class: "gpu", Units: 8}
	// Closing with nothing open does nothing.
	usageTx(t, s, func(ctx context.Context, tx store.Tx) error { return store.CloseUsage(ctx, tx, "rsv_1") })
	if got := intervals(t, s, "rsv_1"); len(got) != 0 {
		t.Fatalf("close with nothing open wrote %+v", got)
	}
	var opened time.Time
	usageTx(t, s, func(ctx context.Context, tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&opened); err != nil {
			return err
		}
		return store.OpenUsage(ctx, tx, u)
	})
	// A second open, another transaction's or the same one's, does nothing.
	usageTx(t, s, func(ctx context.Context, tx store.Tx) error {
		if err := store.OpenUsage(ctx, tx, u); err != nil {
			return err
		}
		return store.OpenUsage(ctx, tx, u)
	})
	got := intervals(t, s, "rsv_1")
	if len(got) != 1 || !got[0].started.Equal(opened) || got[0].ended != nil {
		t.Fatalf("after two opens: %+v, want one open interval from %s", got, opened)
	}
	var closed time.Time
	usageTx(t, s, func(ctx context.Context, tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&closed); err != nil {
			return err
		}
		return store.CloseUsage(ctx, tx, "rsv_1")
	})
	usageTx(t, s, func(ctx context.Context, tx store.Tx) error { return store.CloseUsage(ctx, tx, "rsv_1") })
	got = intervals(t, s, "rsv_1")
	if len(got) != 1 || got[0].ended == nil || !got[0].ended.Equal(closed) {
		t.Fatalf("after close: %+v, want ended at %s", got, closed)
	}
	// Becoming active again opens a second interval.
	usageTx(t, s, func(ctx context.Context, tx store.Tx) error { return store.OpenUsage(ctx, tx, u) })
	if got = intervals(t, s, "rsv_1"); len(got) != 2 || got[1].ended != nil {
		t.Fatalf("after reopen: %+v", got)
	}
	// Rejected intervals.
	for name, edit := range map[string]func(u *store.UsageInterval){
		"no reservation": func(u *store.UsageInterval) { u.ReservationID = "" },
		"no tenant":      func(u *store.UsageInterval) { u.TenantID = "" },
		"no pool":        func(u *store.UsageInterval) { u.PoolID = "" },
		"no class":       func(u *store.UsageInterval) { u.Class = "" },
		"no units":       func(u *store.UsageInterval) { u.Units = 0 },
	} {
		bad := u
		bad.ReservationID = "rsv_bad"
		edit(&bad)
		err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return store.OpenUsage(ctx, tx, bad) })
		if err == nil {
			t.Errorf("%s: OpenUsage(%+v) succeeded", name, bad)
		}
	}
	// The schema refuses an interval that ends before it starts.
	if _, err := s.Pool.Exec(ctx, `UPDATE usage_intervals SET ended_at = started_at - interval '1 second' WHERE reservation_id = 'rsv_1'`); err == nil {
		t.Fatal("an interval ending before it starts was stored")
	}
}

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

func sumUsage(t *testing.T, s *store.Store, q store.UsageQuery) []store.UsageRow {
	t.Helper()
	ctx := context.Background()
	var out []store.UsageRow
	if err := s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		var err error
		out, err = store.SumUsage(ctx, tx, q)
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
	got := sumUsage(t, s, store.UsageQuery{TenantID: "acme", From: hours(2), To: hours(12)})
	want := []store.UsageRow{
		{TenantID: "acme", Class: "gpu", GPUModel: "A100", UnitHours: 4, GPUHours: 4},
		{TenantID: "acme", Class: "gpu", GPUModel: "H100", UnitHours: 20, GPUHours: 20},
	}
	checkUsage(t, "tenant [2,12)", got, want)

	// Window [0.5, 1.5): a 1h×2=2, c 1h×4=4, d 0.5h×3=1.5 (not GPU-hours).
	got = sumUsage(t, s, store.UsageQuery{TenantID: "acme", From: hours(0.5), To: hours(1.5), GroupBy: store.UsageByProject})
	want = []store.UsageRow{
		{TenantID: "acme", Class: "mig", GPUModel: "A100", UnitHours: 1.5},
		{TenantID: "acme", ProjectID: "prj_1", Class: "gpu", GPUModel: "H100", UnitHours: 2, GPUHours: 2},
		{TenantID: "acme", ProjectID: "prj_2", Class: "gpu", GPUModel: "A100", UnitHours: 4, GPUHours: 4},
	}
	checkUsage(t, "project [0.5,1.5)", got, want)

	// By reservation over [-10, 40), project prj_1 only: a 20, b [8, 40) = 32.
	got = sumUsage(t, s, store.UsageQuery{TenantID: "acme", ProjectID: "prj_1", From: hours(-10), To: hours(40), GroupBy: store.UsageByReservation})
	want = []store.UsageRow{
		{TenantID: "acme", ProjectID: "prj_1", ReservationID: "rsv_a", Class: "gpu", GPUModel: "H100", UnitHours: 20, GPUHours: 20},
		{TenantID: "acme", ProjectID: "prj_1", ReservationID: "rsv_b", Class: "gpu", GPUModel: "H100", UnitHours: 32, GPUHours: 32},
	}
	checkUsage(t, "reservation prj_1 [-10,40)", got, want)

	// A window touching intervals only at their ends counts nothing.
	if got := sumUsage(t, s, store.UsageQuery{TenantID: "acme", From: hours(-20), To: hours(-5)}); len(got) != 0 {
		t.Fatalf("window before every interval = %+v", got)
	}
	// The other tenant sees only its own.
	got = sumUsage(t, s, store.UsageQuery{TenantID: "globex", From: hours(0), To: hours(1)})
	checkUsage(t, "globex", got, []store.UsageRow{{TenantID: "globex", Class: "gpu", GPUModel: "H100", UnitHours: 100, GPUHours: 100}})
}

// An open interval counts up to now() when the window reaches past it.
func TestSumUsageCountsOpenIntervalsToNow(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	if _, err := s.Pool.Exec(ctx, `INSERT INTO usage_intervals (reservation_id, tenant_id, pool_id, gpu_model, class, units, started_at)
		VALUES ('rsv_1', 'acme', 'pool_1', 'H100', 'gpu', 2, now() - interval '3 hours')`); err != nil {
		t.Fatal(err)
	}
	var got []store.UsageRow
	var now time.Time
	if err := s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return err
		}
		var err error
		got, err = store.SumUsage(ctx, tx, store.UsageQuery{TenantID: "acme", From: now.Add(-24 * time.Hour), To: now.Add(24 * time.Hour)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Started three hours before the insert's now(), which is at or before this transaction's.
	if len(got) != 1 || got[0].GPUHours < 6 || got[0].GPUHours > 6+2*time.Since(now).Hours()+0.5 {
		t.Fatalf("open interval = %+v, want about 6 GPU-hours", got)
	}
	// A window that has not reached the interval's start counts nothing.
	if rows := sumUsage(t, s, store.UsageQuery{TenantID: "acme", From: now.Add(-48 * time.Hour), To: now.Add(-24 * time.Hour)}); len(rows) != 0 {
		t.Fatalf("window before the start = %+v", rows)
	}
}

func checkUsage(t *testing.T, name string, got, want []store.UsageRow) {
	t.Helper()
	round := func(rows []store.UsageRow) []store.UsageRow {
		out := make([]store.UsageRow, len(rows))
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

package store_test

import (
	"context"
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

package nodes

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/activities/internal/fleet"
	"github.com/better-compute/better-compute/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestDrainStep(t *testing.T) {
	s := testenv.Store(t)
	fleet.Seed(t, s, "placed") // res_1 holds node_1's two GPUs
	ctx := context.Background()
	n := &Nodes{Store: s}
	p := NodeDrainParams{TenantID: "ten_root", NodeID: "node_1", Mode: DrainWait}

	if left, err := n.DrainStep(ctx, p); err != nil || left != -1 {
		t.Fatalf("a node not draining: %d, %v; want -1", left, err)
	}
	if _, err := s.Pool.Exec(ctx, `UPDATE nodes SET drain_state = 'draining', cordoned = true WHERE id = 'node_1'`); err != nil {
		t.Fatal(err)
	}
	if left, err := n.DrainStep(ctx, p); err != nil || left != 1 {
		t.Fatalf("waiting: %d, %v; want 1", left, err)
	}
	if st := fleet.State(t, s); st != "placed" {
		t.Fatalf("a waiting drain changed the reservation: %s", st)
	}
	// Release mode cancels what has not begun and frees its atoms.
	p.Mode = DrainRelease
	if left, err := n.DrainStep(ctx, p); err != nil || left != 0 {
		t.Fatalf("releasing: %d, %v; want 0", left, err)
	}
	if st := fleet.State(t, s); st != "cancelled" {
		t.Fatalf("state = %s", st)
	}
	if got := fleet.Bookings(t, s); len(got) != 1 || got[0].Device != "gpu-0" {
		t.Fatalf("bookings after the cancel = %+v, want gpu-0's cut to now and gpu-1's gone", got)
	}
	for i, want := range []bool{true, false} { // the second finds it drained already
		if marked, err := n.MarkDrained(ctx, p); err != nil || marked != want {
			t.Fatalf("MarkDrained %d = %v, %v", i, marked, err)
		}
	}
	var drain string
	if err := s.Pool.QueryRow(ctx, `SELECT drain_state FROM nodes WHERE id = 'node_1'`).Scan(&drain); err != nil || drain != "drained" {
		t.Fatalf("drain_state = %q, %v", drain, err)
	}
}

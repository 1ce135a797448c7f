package reservations

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
)

// An atom whose booking lock another transaction holds is found being
// booked (pg_locks shows the key as the bookers take it), others are not,
// and awaitBookings returns once that transaction ends, holding nothing.
func TestBookingLocksShowAtomsBeingBooked(t *testing.T) {
	s := testenv.Store(t)
	ctx := context.Background()
	held := atomKey{"node_a", "gpu-0"}
	nodes := []placement.Node{{ID: "node_a", Atoms: []placement.Atom{{ID: "gpu-0"}, {ID: "gpu-1"}}}}

	booker, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = booker.Rollback(ctx) }()
	var got bool
	if err := booker.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, held.lockKey()).Scan(&got); err != nil || !got {
		t.Fatalf("booker's lock = %v, %v", got, err)
	}

	waited := make(chan error, 1)
	err = s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		busy, err := beingBooked(ctx, tx, nodes)
		if err != nil {
			return err
		}
		if len(busy) != 1 || !busy[held] {
			t.Errorf("being booked = %v, want only %v", busy, held)
		}
		// The wait ends with the booker's transaction.
		go func() {
			waited <- s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return awaitBookings(ctx, tx, []atomKey{held}) })
		}()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := booker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("awaitBookings = %v", err)
	}

	// Nothing is held afterwards: the waiter's shared lock went with its
	// savepoint, and the key is free to take.
	err = s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if busy, err := beingBooked(ctx, tx, nodes); err != nil || len(busy) != 0 {
			t.Errorf("being booked after the commit = %v, %v", busy, err)
		}
		var free bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, held.lockKey()).Scan(&free); err != nil || !free {
			t.Errorf("the key after the wait: taken = %v, %v", free, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A booking lock taken inside a savepoint that is rolled back is released
// with it: a failed try leaves no atom locked for the others.
func TestBookingLocksGoWithTheirSavepoint(t *testing.T) {
	s := testenv.Store(t)
	ctx := context.Background()
	k := atomKey{"node_a", "gpu-0"}
	err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, `SELECT pg_try_advisory_xact_lock($1)`, k.lockKey()); err != nil {
			return err
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		other, err := s.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = other.Rollback(ctx) }()
		var got bool
		if err := other.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, k.lockKey()).Scan(&got); err != nil {
			return err
		}
		if !got {
			t.Errorf("the lock outlived its rolled-back savepoint")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

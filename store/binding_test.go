package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
)

// bookedReservation inserts a binding reservation with one allocation of
// two GPUs on an agent-driven node, each atom booked over [from, to)
// (SQL expressions around now()), and returns the reservation's id.
func bookedReservation(t *testing.T, s *store.Store, from, to string) string {
	t.Helper()
	ctx := context.Background()
	node := commandNode(t, s, "ten_root")
	var pool string
	if err := s.Pool.QueryRow(ctx, `SELECT pool_id FROM nodes WHERE id = $1`, node).Scan(&pool); err != nil {
		t.Fatal(err)
	}
	id, alloc := core.NewID("rsv"), core.NewID("alloc")
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO devices (node_id, device_id, tenant_id, pool_id, class, bookable, attributes)
			VALUES ($1, 'gpu-0', 'ten_root', $2, 'gpu', true, '{"index": 0}'), ($1, 'gpu-1', 'ten_root', $2, 'gpu', true, '{"index": 1}')`,
			[]any{node, pool}},
		{`INSERT INTO reservations (id, tenant_id, owner_identity_id, pool_id, state, devices, starts_at, ends_at)
			VALUES ($1, 'ten_a', 'usr_1', $2, 'binding', '{"class": "gpu", "count": 2}', ` + from + `, ` + to + `)`, []any{id, pool}},
		{`INSERT INTO allocations (id, tenant_id, reservation_id, node_id, atoms) VALUES ($1, 'ten_a', $2, $3, '{gpu-0,gpu-1}')`,
			[]any{alloc, id, node}},
		{`INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
			SELECT $1, d, $2, 'ten_a', $3, tstzrange(` + from + `, ` + to + `), 'hold' FROM unnest('{gpu-0,gpu-1}'::text[]) AS d`,
			[]any{node, alloc, pool}},
	} {
		if _, err := s.Pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
	}
	return id
}

func exposeCommands(t *testing.T, s *store.Store, reservationID string) int {
	t.Helper()
	var n int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM node_commands WHERE kind = 'cdi.expose'
		AND created_by = 'reservation:' || $1`, reservationID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// No request and no workflow can make an agent expose an atom outside its
// booking: the bind step queues cdi.expose only while a booking of the
// allocation covers now, checked in its own transaction.
func TestQueueBindCommandsOnlyWhileBooked(t *testing.T) {
	s := testenv.Store(t)
	for _, tc := range []struct {
		name, from, to, reason string
	}{
		{"a window wholly in the past", `now() - interval '2 hours'`, `now() - interval '1 hour'`, store.BindNotBooked},
		{"a window from the epoch", `timestamptz 'epoch'`, `timestamptz 'epoch' + interval '60 seconds'`, store.BindNotBooked},
		{"a window centuries ahead", `now() + interval '300 years'`, `now() + interval '300 years 1 hour'`, store.BindNotBegun},
		{"a window that has not begun", `now() + interval '1 minute'`, `now() + interval '1 hour'`, store.BindNotBegun},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := bookedReservation(t, s, tc.from, tc.to)
			_, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (struct{}, error) {
				return struct{}{}, store.QueueBindCommands(ctx, tx, id, time.Now().Add(time.Minute))
			})
			if ce := core.AsError(err); ce.Code != core.CodeInvalidState || ce.Details["reason"] != tc.reason {
				t.Fatalf("QueueBindCommands = %v %+v, want INVALID_STATE %s", err, ce.Details, tc.reason)
			}
			if n := exposeCommands(t, s, id); n != 0 {
				t.Fatalf("%d cdi.expose queued outside the booking", n)
			}
		})
	}
	t.Run("one atom's booking cut", func(t *testing.T) {
		id := bookedReservation(t, s, `now() - interval '1 hour'`, `now() + interval '1 hour'`)
		if _, err := s.Pool.Exec(context.Background(), `UPDATE device_bookings b SET during = tstzrange(lower(b.during), now() - interval '1 minute')
			FROM allocations a WHERE a.id = b.allocation_id AND a.reservation_id = $1 AND b.device_id = 'gpu-1'`, id); err != nil {
			t.Fatal(err)
		}
		_, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (struct{}, error) {
			return struct{}{}, store.QueueBindCommands(ctx, tx, id, time.Now().Add(time.Minute))
		})
		if ce := core.AsError(err); ce.Code != core.CodeInvalidState || ce.Details["reason"] != store.BindNotBooked {
			t.Fatalf("QueueBindCommands = %v, want INVALID_STATE %s", err, store.BindNotBooked)
		}
		if n := exposeCommands(t, s, id); n != 0 {
			t.Fatalf("%d cdi.expose queued for a cut booking", n)
		}
	})
	t.Run("a booking covering now", func(t *testing.T) {
		id := bookedReservation(t, s, `now() - interval '1 minute'`, `now() + interval '1 hour'`)
		if _, err := inTx(t, s, func(ctx context.Context, tx store.Tx) (struct{}, error) {
			return struct{}{}, store.QueueBindCommands(ctx, tx, id, time.Now().Add(time.Minute))
		}); err != nil {
			t.Fatal(err)
		}
		if n := exposeCommands(t, s, id); n != 1 {
			t.Fatalf("%d cdi.expose queued, want 1", n)
		}
	})
}

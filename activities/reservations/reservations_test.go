package reservations

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/better-compute/better-compute/activities/internal/fleet"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/reservations"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	var ae *temporal.ApplicationError
	if !errors.As(err, &ae) || ae.Type() != code || !ae.NonRetryable() {
		t.Fatalf("error = %v, want non-retryable %s", err, code)
	}
}

func TestMarkActiveThenReleaseCutsTheBookingsOnce(t *testing.T) {
	s := testenv.Store(t)
	fleet.Seed(t, s, "placed")
	ctx := context.Background()
	a := &Reservations{Store: s}
	before := fleet.Bookings(t, s)

	for range 2 { // the second call is a retry finding it active
		if got, err := a.MarkActive(ctx, "ten_a", "res_1"); err != nil || got != "active" {
			t.Fatalf("MarkActive = %q, %v", got, err)
		}
		if got := fleet.State(t, s); got != "active" {
			t.Fatalf("state = %s", got)
		}
	}
	if got := fleet.Bookings(t, s); len(got) != 2 || !got[0].Upper.Equal(before[0].Upper) {
		t.Fatalf("activation touched the bookings: %+v", got)
	}

	if err := a.Release(ctx, "ten_a", "res_1"); err != nil {
		t.Fatal(err)
	}
	if got := fleet.State(t, s); got != "released" {
		t.Fatalf("state = %s", got)
	}
	cut := fleet.Bookings(t, s)
	if len(cut) != 1 || cut[0].Device != "gpu-0" {
		t.Fatalf("bookings after release = %+v, want gpu-0's cut and gpu-1's (not begun) gone", cut)
	}
	if !cut[0].Lower.Equal(before[0].Lower) || !cut[0].Upper.Before(before[0].Upper) || !cut[0].Upper.After(cut[0].Lower) {
		t.Fatalf("gpu-0 booking %+v not cut to now (was %+v)", cut[0], before[0])
	}
	// The atom is free from now on: another booking from now fits.
	if _, err := s.Pool.Exec(ctx, `INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
		VALUES ('node_1', 'gpu-0', 'alloc_2', 'ten_b', 'pool_1', tstzrange(now(), now() + interval '1 hour'), 'hold')`); err != nil {
		t.Fatalf("the released atom is still booked: %v", err)
	}

	// A second release (a retry after a crash) is a no-op.
	if err := a.Release(ctx, "ten_a", "res_1"); err != nil {
		t.Fatal(err)
	}
	if got := fleet.State(t, s); got != "released" {
		t.Fatalf("state = %s", got)
	}
	if again := fleet.Bookings(t, s); len(again) != 1 || !again[0].Upper.Equal(cut[0].Upper) {
		t.Fatalf("second release changed the bookings: %+v", again)
	}
	// A released reservation is never activated again: the activation
	// answers the state it found.
	if got, err := a.MarkActive(ctx, "ten_a", "res_1"); err != nil || got != "released" {
		t.Fatalf("MarkActive of a released reservation = %q, %v", got, err)
	}
	if got := fleet.State(t, s); got != "released" {
		t.Fatalf("state = %s", got)
	}

	// Each edge was published once, in order, and the usage interval opened
	// at activation was closed at release.
	var types []string
	rows, _ := s.Pool.Query(ctx, `SELECT type FROM events WHERE resource_id = 'res_1' ORDER BY seq`)
	for rows.Next() {
		var typ string
		if err := rows.Scan(&typ); err != nil {
			t.Fatal(err)
		}
		types = append(types, typ)
	}
	if want := "reservation.binding reservation.active reservation.releasing reservation.released"; strings.Join(types, " ") != want {
		t.Fatalf("events = %v, want %s", types, want)
	}
	var units int
	var open bool
	if err := s.Pool.QueryRow(ctx, `SELECT units, ended_at IS NULL FROM usage_intervals WHERE reservation_id = 'res_1'`).Scan(&units, &open); err != nil {
		t.Fatal(err)
	}
	if units != 2 || open {
		t.Fatalf("usage interval units=%d open=%v, want 2 GPUs, closed", units, open)
	}
}

func TestMarkActiveFindsACancelledReservation(t *testing.T) {
	s := testenv.Store(t)
	fleet.Seed(t, s, "cancelled")
	got, err := (&Reservations{Store: s}).MarkActive(context.Background(), "ten_a", "res_1")
	if err != nil || got != "cancelled" {
		t.Fatalf("MarkActive = %q, %v; want cancelled", got, err)
	}
	if st := fleet.State(t, s); st != "cancelled" {
		t.Fatalf("state = %s", st)
	}
}

func TestExpireReleasesAndCuts(t *testing.T) {
	s := testenv.Store(t)
	fleet.Seed(t, s, "active")
	ctx := context.Background()
	a := &Reservations{Store: s}

	// Its end is still an hour away (extended, say): nothing changes.
	got, err := a.Expire(ctx, "ten_a", "res_1")
	if err != nil || got.Released || got.End < time.Now().Add(50*time.Minute).UnixMilli() {
		t.Fatalf("Expire before the end = %+v, %v", got, err)
	}
	if st := fleet.State(t, s); st != "active" {
		t.Fatalf("state = %s", st)
	}

	if _, err := s.Pool.Exec(ctx, `UPDATE reservations SET ends_at = now() - interval '1 second' WHERE id = 'res_1'`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got, err := a.Expire(ctx, "ten_a", "res_1"); err != nil || !got.Released {
			t.Fatalf("Expire = %+v, %v", got, err)
		}
		if got := fleet.State(t, s); got != "released" {
			t.Fatalf("state = %s", got)
		}
	}
	if got := fleet.Bookings(t, s); len(got) != 1 || got[0].Device != "gpu-0" || !got[0].Upper.Before(time.Now().Add(time.Minute)) {
		t.Fatalf("bookings after expiry = %+v", got)
	}
}

func TestReservationActivitiesRefuse(t *testing.T) {
	s := testenv.Store(t)
	fleet.Seed(t, s, "placed")
	ctx := context.Background()
	a := &Reservations{Store: s}
	wantCode(t, a.Release(ctx, "ten_a", "res_1"), "INVALID_STATE")
	_, err := a.MarkActive(ctx, "ten_b", "res_1")
	wantCode(t, err, "NOT_FOUND")
	if got := fleet.State(t, s); got != "placed" {
		t.Fatalf("state = %s", got)
	}
	if got := fleet.Bookings(t, s); len(got) != 2 {
		t.Fatalf("a refused release touched the bookings: %+v", got)
	}
}

func commandsOf(t *testing.T, s *store.Store) []string {
	t.Helper()
	rows, err := s.Pool.Query(context.Background(), `SELECT kind || ' ' || args::text || ' ' || state FROM node_commands
		WHERE node_id = 'node_1' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// bookedNow makes gpu-1's booking (which begins in an hour in the seed)
// cover now too, as a reservation's bookings do once its window began.
func bookedNow(t *testing.T, s *store.Store) {
	t.Helper()
	if _, err := s.Pool.Exec(context.Background(), `UPDATE device_bookings SET during = tstzrange(now() - interval '1 hour', now() + interval '2 hours')
		WHERE allocation_id = 'alloc_1' AND device_id = 'gpu-1'`); err != nil {
		t.Fatal(err)
	}
}

// Binding queues the agent's cdi.expose once, waits for its success, and
// the release queues its cdi.withdraw.
func TestBindThenReleaseWithdraws(t *testing.T) {
	s := testenv.Store(t)
	fleet.Seed(t, s, "placed")
	bookedNow(t, s)
	ctx := context.Background()
	a := &Reservations{Store: s}
	for range 2 { // a retry queues nothing twice
		if st, err := a.Bind(ctx, "ten_a", "res_1", time.Minute); err != nil || st != "binding" {
			t.Fatalf("Bind = %q, %v", st, err)
		}
	}
	cmds := commandsOf(t, s)
	if len(cmds) != 1 || cmds[0] != `cdi.expose {"devices": [0, 1], "reservationId": "res_1"} queued` {
		t.Fatalf("commands = %q", cmds)
	}
	if st, err := a.BindStatus(ctx, "ten_a", "res_1"); err != nil || st != store.BindingWaiting {
		t.Fatalf("BindStatus = %q, %v", st, err)
	}
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return store.RecordNodeCommandResult(ctx, tx, "node_1", 1, store.NodeCommandResult{State: store.CommandSucceeded})
	}); err != nil {
		t.Fatal(err)
	}
	if st, err := a.BindStatus(ctx, "ten_a", "res_1"); err != nil || st != store.BindingBound {
		t.Fatalf("BindStatus after the agent's result = %q, %v", st, err)
	}
	if st, err := a.MarkActive(ctx, "ten_a", "res_1"); err != nil || st != "active" {
		t.Fatalf("MarkActive = %q, %v", st, err)
	}
	for range 2 {
		if err := a.Release(ctx, "ten_a", "res_1"); err != nil {
			t.Fatal(err)
		}
	}
	if cmds := commandsOf(t, s); len(cmds) != 2 || cmds[1] != `cdi.withdraw {"reservationId": "res_1"} queued` {
		t.Fatalf("commands after the release = %q", cmds)
	}
}

func TestFailBindingFreesTheAtoms(t *testing.T) {
	s := testenv.Store(t)
	fleet.Seed(t, s, "placed")
	bookedNow(t, s)
	ctx := context.Background()
	a := &Reservations{Store: s}
	if _, err := a.Bind(ctx, "ten_a", "res_1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return store.RecordNodeCommandResult(ctx, tx, "node_1", 1, store.NodeCommandResult{State: store.CommandFailed, Error: "no such device"})
	}); err != nil {
		t.Fatal(err)
	}
	if st, err := a.BindStatus(ctx, "ten_a", "res_1"); err != nil || st != store.BindingFailed {
		t.Fatalf("BindStatus = %q, %v", st, err)
	}
	for range 2 {
		if err := a.FailBinding(ctx, "ten_a", "res_1", "bindFailed"); err != nil {
			t.Fatal(err)
		}
	}
	if st := fleet.State(t, s); st != "failed" {
		t.Fatalf("state = %s", st)
	}
	if got := fleet.Bookings(t, s); len(got) != 2 || !got[0].Upper.Before(time.Now().Add(time.Minute)) ||
		!got[1].Upper.Before(time.Now().Add(time.Minute)) {
		t.Fatalf("bookings after the failure = %+v", got)
	}
	if cmds := commandsOf(t, s); len(cmds) != 2 || !strings.HasPrefix(cmds[1], "cdi.withdraw") {
		t.Fatalf("commands = %q", cmds)
	}
}

// Preempting an active spot reservation releases it with the reason and
// frees its atoms from the preempting reservation's start.
func TestPreemptAnActiveSpotReservation(t *testing.T) {
	s := testenv.Store(t)
	fleet.Seed(t, s, "active")
	ctx := context.Background()
	if _, err := s.Pool.Exec(ctx, `UPDATE reservations SET spot = true WHERE id = 'res_1'`); err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return store.PreemptReservation(ctx, tx, "ten_a", "res_1", "rsv_x", at)
	}); err != nil {
		t.Fatal(err)
	}
	var st, failure string
	if err := s.Pool.QueryRow(ctx, `SELECT state, failure::text FROM reservations WHERE id = 'res_1'`).Scan(&st, &failure); err != nil {
		t.Fatal(err)
	}
	if st != "released" || !strings.Contains(failure, `"preempted"`) || !strings.Contains(failure, "rsv_x") {
		t.Fatalf("state %s, failure %s", st, failure)
	}
	if got := fleet.Bookings(t, s); len(got) != 1 || got[0].Device != "gpu-0" || !got[0].Upper.Equal(at) {
		t.Fatalf("bookings = %+v, want gpu-0's cut at %v and gpu-1's gone", got, at)
	}
}

// A reservation whose window is over by the time it binds is failed, its
// atoms freed, and nothing is exposed; one whose booking has not begun is
// a retryable error that changes nothing.
func TestBindOutsideTheBookingFailsTheReservation(t *testing.T) {
	s := testenv.Store(t)
	fleet.Seed(t, s, "placed")
	ctx := context.Background()
	a := &Reservations{Store: s}
	_, err := a.Bind(ctx, "ten_a", "res_1", time.Minute) // gpu-1's booking begins in an hour
	var ae *temporal.ApplicationError
	if err == nil || (errors.As(err, &ae) && ae.NonRetryable()) {
		t.Fatalf("Bind before gpu-1's booking began = %v, want a retryable error", err)
	}
	if st := fleet.State(t, s); st != "placed" {
		t.Fatalf("state = %s", st)
	}
	if _, err := s.Pool.Exec(ctx, `UPDATE device_bookings SET during = tstzrange(now() - interval '2 hours', now() - interval '1 hour')
		WHERE allocation_id = 'alloc_1'`); err != nil {
		t.Fatal(err)
	}
	if st, err := a.Bind(ctx, "ten_a", "res_1", time.Minute); err != nil || st != "failed" {
		t.Fatalf("Bind after the window = %q, %v; want failed", st, err)
	}
	var st, reason, failure string
	if err := s.Pool.QueryRow(ctx, `SELECT state, end_reason, failure::text FROM reservations WHERE id = 'res_1'`).Scan(&st, &reason, &failure); err != nil {
		t.Fatal(err)
	}
	if st != "failed" || reason != "failed" || !strings.Contains(failure, `"notBooked"`) {
		t.Fatalf("state %s, end reason %s, failure %s", st, reason, failure)
	}
	for _, c := range commandsOf(t, s) {
		if strings.HasPrefix(c, "cdi.expose") {
			t.Fatalf("exposed outside the booking: %q", c)
		}
	}
}

// reconcile runs the Reconcile activity as a worker would.
func reconcile(t *testing.T, a *Reservations) int {
	t.Helper()
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	env.RegisterActivity(a.Reconcile)
	v, err := env.ExecuteActivity(a.Reconcile)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := v.Get(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// draft inserts a draft reservation of ten_a in pool_1 as an admission's
// first transaction leaves it (the row, its authorization row, its
// unfinished idempotency row), created age ago.
func draft(t *testing.T, s *store.Store, id, key string, age time.Duration) {
	t.Helper()
	ctx := context.Background()
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO reservations (id, tenant_id, owner_identity_id, pool_id, state, devices, starts_at, ends_at, created_at, updated_at)
			VALUES ($1, 'ten_a', 'usr_1', 'pool_1', 'draft', '{"class": "gpu", "count": 1}', now(), now() + interval '1 hour',
				now() - $2 * interval '1 millisecond', now() - $2 * interval '1 millisecond')`, id, age.Milliseconds()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO idempotency_keys (tenant_id, identity_id, method, key, request_hash, resource_type, resource_id, created_at)
			VALUES ('ten_a', 'usr_1', 'compute:reservations.create', $2, '\x00', 'compute-reservation', $1, now() - $3 * interval '1 millisecond')`,
			id, key, age.Milliseconds()); err != nil {
			return err
		}
		return store.PutAuthzResource(ctx, tx, store.AuthzResource{Type: "compute-reservation", ID: id, TenantID: "ten_a", OwnerID: "usr_1",
			Attributes: map[string]any{"durationHours": 1}})
	}); err != nil {
		t.Fatal(err)
	}
}

// The reconciler sweeps drafts older than DraftMaxAge (a crash between an
// admission's two transactions, never retried) with their idempotency and
// authorization rows; a younger draft, which a retry may still finish, is
// kept.
func TestReconcileSweepsStaleDrafts(t *testing.T) {
	s := testenv.Store(t)
	fleet.Seed(t, s, "cancelled")
	ctx := context.Background()
	draft(t, s, "rsv_old", "k-old", DraftMaxAge+time.Minute)
	draft(t, s, "rsv_new", "k-new", DraftMaxAge-time.Minute)
	reconcile(t, &Reservations{Store: s})
	count := func(q, id string) int {
		var n int
		if err := s.Pool.QueryRow(ctx, q, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for id, want := range map[string]int{"rsv_old": 0, "rsv_new": 1} {
		if n := count(`SELECT count(*) FROM reservations WHERE id = $1`, id); n != want {
			t.Errorf("%s: %d reservation rows, want %d", id, n, want)
		}
		if n := count(`SELECT count(*) FROM idempotency_keys WHERE resource_id = $1`, id); n != want {
			t.Errorf("%s: %d idempotency rows, want %d", id, n, want)
		}
		if n := count(`SELECT count(*) FROM authz_resources WHERE id = $1`, id); n != want {
			t.Errorf("%s: %d authorization rows, want %d", id, n, want)
		}
	}
	if st := fleet.State(t, s); st != "cancelled" {
		t.Fatalf("a decided reservation was touched: %s", st)
	}
}

// Every ending records why, before its walk, so that the row and each
// state event of the walk say it: the window's end, a lapsed lease, a
// release (by the API, in its own transaction) and a cancellation.
func TestEndReasons(t *testing.T) {
	for _, tc := range []struct {
		name, from, reason, final string
		end                       func(ctx context.Context, s *store.Store) error
	}{
		{"window end", "active", "end", "released", func(ctx context.Context, s *store.Store) error {
			if _, err := s.Pool.Exec(ctx, `UPDATE reservations SET ends_at = now() - interval '1 second' WHERE id = 'res_1'`); err != nil {
				return err
			}
			_, err := (&Reservations{Store: s}).Expire(ctx, "ten_a", "res_1")
			return err
		}},
		{"lease lapse", "active", "lease", "released", func(ctx context.Context, s *store.Store) error {
			return (&Reservations{Store: s}).ReleaseLapsed(ctx, "ten_a", "res_1")
		}},
		{"release update", "active", "release", "released", func(ctx context.Context, s *store.Store) error {
			return (&Reservations{Store: s}).Release(ctx, "ten_a", "res_1")
		}},
		{"reservations.release", "active", "release", "released", func(ctx context.Context, s *store.Store) error {
			return s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
				_, err := domain.Release(ctx, tx, "ten_a", "res_1")
				return err
			})
		}},
		{"reservations.cancel", "placed", "cancel", "cancelled", func(ctx context.Context, s *store.Store) error {
			return s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
				_, err := domain.Cancel(ctx, tx, "ten_a", "res_1")
				return err
			})
		}},
		{"failed binding", "binding", "failed", "failed", func(ctx context.Context, s *store.Store) error {
			return (&Reservations{Store: s}).FailBinding(ctx, "ten_a", "res_1", "bindTimeout")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testenv.Store(t)
			fleet.Seed(t, s, tc.from)
			ctx := context.Background()
			if err := tc.end(ctx, s); err != nil {
				t.Fatal(err)
			}
			var st, reason string
			var endedAt *time.Time
			if err := s.Pool.QueryRow(ctx, `SELECT state, COALESCE(end_reason, ''), ended_at FROM reservations WHERE id = 'res_1'`).
				Scan(&st, &reason, &endedAt); err != nil {
				t.Fatal(err)
			}
			if st != tc.final || reason != tc.reason || endedAt == nil {
				t.Fatalf("state %s, end reason %q, ended at %v; want %s, %s, a time", st, reason, endedAt, tc.final, tc.reason)
			}
			rows, err := s.Pool.Query(ctx, `SELECT type, COALESCE(data->>'endReason', '') FROM events
				WHERE resource_id = 'res_1' ORDER BY seq`)
			if err != nil {
				t.Fatal(err)
			}
			evs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Type, EndReason string }])
			if err != nil || len(evs) == 0 {
				t.Fatalf("events = %v, %v", evs, err)
			}
			for _, e := range evs {
				if e.EndReason != tc.reason {
					t.Fatalf("event %s carries end reason %q, want %q (events %v)", e.Type, e.EndReason, tc.reason, evs)
				}
			}
			if last := evs[len(evs)-1]; last.Type != "reservation."+tc.final {
				t.Fatalf("last event %s, want reservation.%s", last.Type, tc.final)
			}
		})
	}
}

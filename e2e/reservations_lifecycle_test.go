package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	reservationsact "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/events"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/api/usage"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
)

// lifecycleDeadline bounds every wait for a state the workflows reach on their
// own; the tests never assert on how long it took.
const lifecycleDeadline = time.Minute

// lifecycle is the one dev stack the reservation lifecycle's subtests share.
type lifecycle struct {
	stack *devstack.Stack
	acme  *api.Client
	pool  string
	db    *pgx.Conn
}

func newLifecycle(t *testing.T) *lifecycle {
	t.Helper()
	dir := stackDir(t)
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	s := startStack(t, dir, pgPort)
	token, err := s.DemoToken()
	if err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(context.Background(), s.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	return &lifecycle{stack: s, acme: api.NewClient(s.APIURL(), token), pool: s.Demo().PoolID, db: db}
}

func (l *lifecycle) reserve(t *testing.T, key string, count int, start *int64, duration int64, lease *int64) reservations.Reservation {
	t.Helper()
	r, err := reservations.Create.Call(context.Background(), l.acme, reservations.CreateInput{TenantID: "acme", PoolID: l.pool,
		Devices: placement.Request{Class: placement.ClassGPU, Count: count}, Start: start, Duration: duration,
		LeaseSeconds: lease, IdempotencyKey: key})
	if err != nil || r.State != "placed" {
		t.Fatalf("reservations.create %s = %+v, %v", key, r, err)
	}
	return r
}

// waitState polls reservations.get until the reservation is in state.
func (l *lifecycle) waitState(t *testing.T, id, state string) reservations.Reservation {
	t.Helper()
	var r reservations.Reservation
	testutil.EventuallyNil(t, lifecycleDeadline, func() error {
		var err error
		r, err = reservations.Get.Call(context.Background(), l.acme, reservations.ReservationInput{TenantID: "acme", ReservationID: id})
		if err != nil {
			t.Fatalf("reservations.get %s: %v", id, err)
		}
		if r.State != state {
			return fmt.Errorf("%s is %s, want %s", id, r.State, state)
		}
		return nil
	})
	return r
}

// result waits for the reservation's workflow to start and end, and
// answers its result.
func (l *lifecycle) result(t *testing.T, id string) reservationsact.ReservationResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), lifecycleDeadline)
	defer cancel()
	// The process's starter starts the workflow once the create answered,
	// so it may not exist yet.
	testutil.EventuallyNil(t, lifecycleDeadline, func() error {
		_, err := l.stack.Client().DescribeWorkflowExecution(ctx, id, "")
		return err
	})
	var res reservationsact.ReservationResult
	if err := l.stack.Client().GetWorkflow(ctx, id, "").Get(ctx, &res); err != nil {
		t.Fatalf("workflow %s: %v", id, err)
	}
	return res
}

// acceptedUpdates are the names of the updates the workflow's history shows
// accepted, in order.
func (l *lifecycle) acceptedUpdates(t *testing.T, id string) []string {
	t.Helper()
	var names []string
	it := l.stack.Client().GetWorkflowHistory(context.Background(), id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			t.Fatalf("history of %s: %v", id, err)
		}
		if ev.GetEventType() == enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED {
			names = append(names, ev.GetWorkflowExecutionUpdateAcceptedEventAttributes().GetAcceptedRequest().GetInput().GetName())
		}
	}
	return names
}

func (l *lifecycle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := l.db.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func errCode(err error) core.Code {
	if err == nil {
		return ""
	}
	return core.AsError(err).Code
}

func TestReservationLifecycle(t *testing.T) {
	l := newLifecycle(t)
	ctx := context.Background()
	var kept reservations.Reservation // an active reservation the cross-tenant subtest calls on

	t.Run("active lease: renew, extend, release", func(t *testing.T) {
		created := time.Now()
		lease := int64(3600)
		r := l.reserve(t, "life-1", 2, nil, 3600, &lease)
		r = l.waitState(t, r.ID, "active")
		if r.LeaseExpiresAt == nil || *r.LeaseExpiresAt <= r.Start {
			t.Fatalf("active reservation's leaseExpiresAt = %v, start %d", r.LeaseExpiresAt, r.Start)
		}
		first := *r.LeaseExpiresAt

		renewed, err := reservations.Renew.Call(ctx, l.acme, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID})
		if err != nil || renewed.LeaseExpiresAt == nil || *renewed.LeaseExpiresAt < first {
			t.Fatalf("reservations.renew = %+v, %v; want leaseExpiresAt >= %d", renewed, err, first)
		}

		extended, err := reservations.Extend.Call(ctx, l.acme, reservations.ExtendInput{TenantID: "acme", ReservationID: r.ID, Duration: 7200})
		if err != nil || extended.End != r.Start+7200*1000 || extended.State != "active" {
			t.Fatalf("reservations.extend = %+v, %v; want end %d", extended, err, r.Start+7200*1000)
		}
		desc, err := l.stack.Client().DescribeWorkflowExecution(ctx, r.ID, "")
		if err != nil || desc.GetWorkflowExecutionInfo().GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			t.Fatalf("workflow after extend: %v, %v", desc, err)
		}
		if got := l.acceptedUpdates(t, r.ID); !slices.Equal(got, []string{reservationsact.UpdateRenew, reservationsact.UpdateExtend}) {
			t.Fatalf("updates accepted before release = %v, want [renew extend]", got)
		}

		released, err := reservations.Release.Call(ctx, l.acme, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID})
		if err != nil || released.State != "released" || released.EndReason != "release" || released.EndedAt == nil {
			t.Fatalf("reservations.release = %+v, %v", released, err)
		}
		if n := l.count(t, `SELECT count(*) FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
			WHERE a.reservation_id = $1 AND (upper_inf(b.during) OR upper(b.during) > now() + interval '1 second')`, r.ID); n != 0 {
			t.Fatalf("%d bookings of the released reservation still run past now", n)
		}
		if res := l.result(t, r.ID); res != (reservationsact.ReservationResult{State: "released", Reason: "release"}) {
			t.Fatalf("workflow result = %+v", res)
		}
		if got := l.acceptedUpdates(t, r.ID); !slices.Equal(got, []string{reservationsact.UpdateRenew, reservationsact.UpdateExtend, reservationsact.UpdateRelease}) {
			t.Fatalf("updates accepted = %v", got)
		}

		want := []string{"reservation.pending", "reservation.placed", "reservation.binding", "reservation.active",
			"reservation.extended", "reservation.releasing", "reservation.released"}
		var got []string
		testutil.EventuallyNil(t, lifecycleDeadline, func() error {
			listed, err := events.List.Call(ctx, l.acme, events.ListInput{TenantID: "acme", ResourceID: r.ID})
			if err != nil {
				t.Fatalf("events.list: %v", err)
			}
			got = got[:0]
			for _, e := range listed.Items {
				got = append(got, e.Type)
			}
			if len(got) < len(want) {
				return fmt.Errorf("the lifecycle's events so far: %v", got)
			}
			return nil
		})
		if !slices.Equal(got, want) {
			t.Fatalf("events = %v, want %v", got, want)
		}

		metered, err := usage.List.Call(ctx, l.acme, usage.ListInput{TenantID: "acme", From: created.Add(-time.Minute).UnixMilli(),
			To: time.Now().Add(time.Minute).UnixMilli(), GroupBy: usage.ByReservation})
		if err != nil {
			t.Fatalf("usage.list: %v", err)
		}
		found := false
		for _, u := range metered.Items {
			if u.ReservationID == r.ID {
				found = true
				if u.Class != placement.ClassGPU || u.GPUHours <= 0 || u.GPUModel != "H100" {
					t.Fatalf("usage of the reservation = %+v", u)
				}
			}
		}
		if !found {
			t.Fatalf("usage.list has no item for %s: %+v", r.ID, metered.Items)
		}
	})

	t.Run("a missed lease releases", func(t *testing.T) {
		lease := int64(2)
		r := l.reserve(t, "life-lease", 1, nil, 3600, &lease)
		l.waitState(t, r.ID, "released")
		if res := l.result(t, r.ID); res != (reservationsact.ReservationResult{State: "released", Reason: "lease"}) {
			t.Fatalf("workflow result = %+v", res)
		}
		if got := l.waitState(t, r.ID, "released"); got.EndReason != "lease" || got.EndedAt == nil {
			t.Fatalf("the lapsed reservation = %+v; want endReason lease and endedAt", got)
		}
		if n := l.count(t, `SELECT count(*) FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
			WHERE a.reservation_id = $1 AND (upper_inf(b.during) OR upper(b.during) > now() + interval '1 second')`, r.ID); n != 0 {
			t.Fatalf("%d bookings of the lapsed reservation still run past now", n)
		}
	})

	t.Run("cancel before the start", func(t *testing.T) {
		start := time.Now().Add(time.Hour).UnixMilli()
		r := l.reserve(t, "life-cancel", 1, &start, 3600, nil)
		cancelled, err := reservations.Cancel.Call(ctx, l.acme, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID})
		if err != nil || cancelled.State != "cancelled" {
			t.Fatalf("reservations.cancel = %+v, %v", cancelled, err)
		}
		if res := l.result(t, r.ID); res != (reservationsact.ReservationResult{State: "cancelled", Reason: "cancel"}) {
			t.Fatalf("workflow result = %+v", res)
		}
		if n := l.count(t, `SELECT count(*) FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
			WHERE a.reservation_id = $1`, r.ID); n != 0 {
			t.Fatalf("the cancelled reservation keeps %d bookings", n)
		}
		if _, err := reservations.Release.Call(ctx, l.acme, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID}); errCode(err) != core.CodeInvalidState {
			t.Fatalf("release of a cancelled reservation = %v, want INVALID_STATE", err)
		}
	})

	t.Run("a crash between the booking commit and the workflow start", func(t *testing.T) { testCrashBeforeWorkflowStart(t, l) })
	t.Run("replicas' starters do not start a workflow twice", func(t *testing.T) { testReplicaStartersDoNotDoubleStart(t, l) })

	// The starters' scan (or, failing it, the reconciler) finishes a start
	// that was never made.
	t.Run("the reconciler finishes a lost start", func(t *testing.T) {
		// A reservation as the API would have committed it had it crashed
		// before starting the workflow: placed, booked, no workflow, and
		// last touched longer ago than the reconciler's grace.
		model := l.reserve(t, "life-model", 1, nil, 3600, nil)
		l.waitState(t, model.ID, "active")
		id := core.DerivedID("rsv", "acme", "x", "lost-start")
		var node, atom string
		err := l.db.QueryRow(ctx, `SELECT d.node_id, d.device_id FROM devices d
			WHERE d.pool_id = $1 AND d.class = 'gpu' AND d.bookable AND d.removed_at IS NULL
				AND NOT EXISTS (SELECT 1 FROM device_bookings b WHERE b.device_node_id = d.node_id AND b.device_id = d.device_id
					AND b.during && tstzrange(now(), now() + interval '2 hours'))
			ORDER BY d.node_id DESC, d.device_id DESC LIMIT 1`, l.pool).Scan(&node, &atom)
		if err != nil {
			t.Fatalf("a free atom: %v", err)
		}
		tx, err := l.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO reservations (id, tenant_id, owner_identity_id, pool_id, project_id, state, devices,
				starts_at, ends_at, binding, lease_seconds, spot, created_at, updated_at, workflow_started_at)
			SELECT $2, tenant_id, owner_identity_id, pool_id, project_id, 'placed', devices,
				now(), now() + interval '1 hour', binding, NULL, spot, now() - interval '5 minutes', now() - interval '5 minutes', NULL
			FROM reservations WHERE id = $1`, model.ID, id); err != nil {
			t.Fatalf("insert the reservation: %v", err)
		}
		alloc := core.NewID("alloc")
		if _, err := tx.Exec(ctx, `INSERT INTO allocations (id, tenant_id, reservation_id, node_id, atoms) VALUES ($1, 'acme', $2, $3, $4)`,
			alloc, id, node, []string{atom}); err != nil {
			t.Fatalf("insert the allocation: %v", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
			VALUES ($1, $2, $3, 'acme', $4, tstzrange(now(), now() + interval '1 hour'), 'hold')`, node, atom, alloc, l.pool); err != nil {
			t.Fatalf("insert the booking: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}

		sched := l.stack.Client().ScheduleClient().GetHandle(ctx, reservationsact.ReconcileReservationsScheduleID)
		var lastTrigger time.Time
		testutil.EventuallyNil(t, lifecycleDeadline, func() error {
			// A trigger while a run is in flight is skipped (the schedule's
			// overlap policy); trigger again now and then until it is done.
			if time.Since(lastTrigger) > 5*time.Second {
				if err := sched.Trigger(ctx, client.ScheduleTriggerOptions{}); err != nil {
					t.Fatalf("trigger the reconciler: %v", err)
				}
				lastTrigger = time.Now()
			}
			var state string
			var started bool
			if err := l.db.QueryRow(ctx, `SELECT state, workflow_started_at IS NOT NULL FROM reservations WHERE id = $1`, id).
				Scan(&state, &started); err != nil {
				t.Fatal(err)
			}
			if state != "active" || !started {
				return fmt.Errorf("the reconciler has not started the lost workflow and activated the reservation: state %s, workflow started %v", state, started)
			}
			return nil
		})
		desc, err := l.stack.Client().DescribeWorkflowExecution(ctx, id, "")
		if err != nil || desc.GetWorkflowExecutionInfo().GetType().GetName() != reservationsact.ReservationWorkflowName ||
			desc.GetWorkflowExecutionInfo().GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			t.Fatalf("the lost reservation's workflow: %v, %v", desc, err)
		}
		kept = model
	})

	// An operator terminates or cancels a reservation's workflow (the
	// Temporal UI): PostgreSQL stays the truth, so release and cancel still
	// finish, extend starts the workflow again, and the reconciler restarts
	// it for a live reservation nobody calls on.
	t.Run("a workflow terminated or cancelled from Temporal", func(t *testing.T) {
		c := l.stack.Client()
		stop := func(t *testing.T, id, how string) {
			t.Helper()
			var err error
			if how == "terminate" {
				err = c.TerminateWorkflow(ctx, id, "", "an operator, from the UI")
			} else {
				err = c.CancelWorkflow(ctx, id, "")
			}
			if err != nil {
				t.Fatalf("%s the workflow of %s: %v", how, id, err)
			}
			testutil.EventuallyNil(t, lifecycleDeadline, func() error {
				desc, err := c.DescribeWorkflowExecution(ctx, id, "")
				if err != nil {
					return err
				}
				if st := desc.GetWorkflowExecutionInfo().GetStatus(); st == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
					return fmt.Errorf("the workflow of %s is still %s", id, st)
				}
				return nil
			})
		}
		running := func(t *testing.T, id string) string {
			t.Helper()
			desc, err := c.DescribeWorkflowExecution(ctx, id, "")
			if err != nil || desc.GetWorkflowExecutionInfo().GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
				t.Fatalf("the workflow of %s: %v, %v; want running", id, desc, err)
			}
			return desc.GetWorkflowExecutionInfo().GetExecution().GetRunId()
		}

		for _, how := range []string{"terminate", "cancel"} {
			t.Run("release after "+how, func(t *testing.T) {
				r := l.reserve(t, "life-stopped-"+how, 1, nil, 3600, nil)
				l.waitState(t, r.ID, "active")
				stop(t, r.ID, how)
				released, err := reservations.Release.Call(ctx, l.acme, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID})
				if err != nil || released.State != "released" || released.EndReason != "release" || released.EndedAt == nil {
					t.Fatalf("reservations.release = %+v, %v; want released, endReason release", released, err)
				}
				if n := l.count(t, `SELECT count(*) FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
					WHERE a.reservation_id = $1 AND (upper_inf(b.during) OR upper(b.during) > now() + interval '1 second')`, r.ID); n != 0 {
					t.Fatalf("%d bookings of the released reservation still run past now", n)
				}
				if n := l.count(t, `SELECT count(*) FROM node_commands WHERE kind = 'cdi.withdraw' AND created_by = 'reservation:' || $1`, r.ID); n == 0 {
					t.Fatalf("no cdi.withdraw queued for the released reservation")
				}
			})
		}

		t.Run("cancel after terminate", func(t *testing.T) {
			start := time.Now().Add(time.Hour).UnixMilli()
			r := l.reserve(t, "life-cancel-terminated", 1, &start, 3600, nil)
			// The starter starts the workflow once the create answered.
			testutil.EventuallyNil(t, lifecycleDeadline, func() error {
				_, err := c.DescribeWorkflowExecution(ctx, r.ID, "")
				return err
			})
			stop(t, r.ID, "terminate")
			cancelled, err := reservations.Cancel.Call(ctx, l.acme, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID})
			if err != nil || cancelled.State != "cancelled" || cancelled.EndReason != "cancel" {
				t.Fatalf("reservations.cancel = %+v, %v", cancelled, err)
			}
		})

		t.Run("extend restarts it", func(t *testing.T) {
			r := l.reserve(t, "life-extend-terminated", 1, nil, 3600, nil)
			l.waitState(t, r.ID, "active")
			first := running(t, r.ID)
			stop(t, r.ID, "terminate")
			extended, err := reservations.Extend.Call(ctx, l.acme, reservations.ExtendInput{TenantID: "acme", ReservationID: r.ID, Duration: 7200})
			if err != nil || extended.End != r.Start+7200*1000 {
				t.Fatalf("reservations.extend = %+v, %v", extended, err)
			}
			if again := running(t, r.ID); again == first {
				t.Fatalf("the terminated run %s is still the latest", first)
			}
			if released, err := reservations.Release.Call(ctx, l.acme, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID}); err != nil || released.State != "released" {
				t.Fatalf("reservations.release = %+v, %v", released, err)
			}
			if res := l.result(t, r.ID); res.State != "released" {
				t.Fatalf("the restarted workflow's result = %+v", res)
			}
		})

		t.Run("the reconciler restarts it", func(t *testing.T) {
			r := l.reserve(t, "life-reconcile-terminated", 1, nil, 3600, nil)
			l.waitState(t, r.ID, "active")
			first := running(t, r.ID)
			stop(t, r.ID, "terminate")
			// Past the reconciler's grace, as a reservation left alone is.
			if _, err := l.db.Exec(ctx, `UPDATE reservations SET updated_at = now() - interval '5 minutes' WHERE id = $1`, r.ID); err != nil {
				t.Fatal(err)
			}
			sched := c.ScheduleClient().GetHandle(ctx, reservationsact.ReconcileReservationsScheduleID)
			var lastTrigger time.Time
			testutil.EventuallyNil(t, lifecycleDeadline, func() error {
				if time.Since(lastTrigger) > 5*time.Second { // a trigger while a run is in flight is skipped
					if err := sched.Trigger(ctx, client.ScheduleTriggerOptions{}); err != nil {
						t.Fatalf("trigger the reconciler: %v", err)
					}
					lastTrigger = time.Now()
				}
				desc, err := c.DescribeWorkflowExecution(ctx, r.ID, "")
				if err != nil {
					return err
				}
				info := desc.GetWorkflowExecutionInfo()
				if info.GetExecution().GetRunId() == first || info.GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
					return fmt.Errorf("the reconciler has not restarted the workflow: run %s is %s", info.GetExecution().GetRunId(), info.GetStatus())
				}
				return nil
			})
			if got := l.waitState(t, r.ID, "active"); got.EndReason != "" {
				t.Fatalf("the restarted reservation = %+v", got)
			}
			if released, err := reservations.Release.Call(ctx, l.acme, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID}); err != nil || released.State != "released" {
				t.Fatalf("reservations.release = %+v, %v", released, err)
			}
			if res := l.result(t, r.ID); res != (reservationsact.ReservationResult{State: "released", Reason: "release"}) {
				t.Fatalf("the restarted workflow's result = %+v", res)
			}
		})
	})

	t.Run("another tenant cannot release acme's reservation", func(t *testing.T) {
		if kept.ID == "" {
			t.Skip("no active reservation from the earlier subtest")
		}
		globex := api.NewClient(l.stack.APIURL(), newGlobexToken(t, l.stack))
		if _, err := reservations.Release.Call(ctx, globex, reservations.ReservationInput{TenantID: "globex", ReservationID: kept.ID}); errCode(err) != core.CodeNotFound {
			t.Fatalf("globex releases in its own tenant = %v, want NOT_FOUND", err)
		}
		if _, err := reservations.Release.Call(ctx, globex, reservations.ReservationInput{TenantID: "acme", ReservationID: kept.ID}); errCode(err) != core.CodeAccessDenied {
			t.Fatalf("globex releases in acme = %v, want ACCESS_DENIED", err)
		}
		if r, err := reservations.Get.Call(ctx, l.acme, reservations.ReservationInput{TenantID: "acme", ReservationID: kept.ID}); err != nil || r.State != "active" {
			t.Fatalf("acme's reservation after globex's attempts = %+v, %v", r, err)
		}
	})
}

// globexToken makes tenant globex with an admin person, through the
// embedded IAM's admin service on the stack's database, and answers a
// user-session token of that person.
func newGlobexToken(t *testing.T, s *devstack.Stack) string {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, s.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	catalog, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	admin, err := iam.NewAdmin(iam.AdminConfig{Store: st, Catalog: catalog})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateTenant(ctx, iam.CreateTenantInput{ID: "globex", Name: "globex"}); err != nil {
		t.Fatal(err)
	}
	idn, err := admin.CreateIdentity(ctx, iam.CreateIdentityInput{TenantID: "globex", Kind: iam.KindPerson, Name: "gus", Groups: []string{"admins"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "globex", Name: "admins", Cedar: iam.TenantAdminsPolicy("admins")}); err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CreateToken(ctx, iam.CreateTokenInput{TenantID: "globex", IdentityID: idn.ID, SessionKind: iam.SessionUser})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Token
}

// Package reservations holds the activities of the reservation workflows
// (workflows/reservations), and the names, parameters and results that the
// workflows, the API and other domains' activities share with them.
package reservations

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/store"
)

// Reservations is the activity side of the reservation workflow
// (workflows/reservations). Every activity is idempotent: it locks
// the reservation row, reads where the state already is and walks only the
// edges that are left, each through core/reservations.Transition, in one
// transaction. A retry after a crash therefore finds the state advanced and
// succeeds without doing anything twice; the bookings are cut only in the
// transaction that reaches released, so they are never released twice.
type Reservations struct {
	Store *store.Store
	// Temporal and TaskQueue start reservation workflows (Reconcile).
	Temporal  client.Client
	TaskQueue string
}

// reconcileGrace is how long a placed reservation may go without its
// workflow before the reconciler starts it: the API starts it right after
// the commit, and this keeps the two from racing.
const reconcileGrace = 30 * time.Second

// Reconcile starts the workflow of every live reservation whose start was
// lost (workflow_started_at is null past the grace period), a page at a
// time, and records the start. It answers how many it started.
func (r *Reservations) Reconcile(ctx context.Context) (int, error) {
	var started int
	for {
		var page []store.UnstartedReservation
		err := r.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
			page, err = store.UnstartedReservations(ctx, tx, reconcileGrace, 100)
			return err
		})
		if err != nil || len(page) == 0 {
			return started, err
		}
		for _, u := range page {
			p := ReservationParams{TenantID: u.TenantID, ReservationID: u.ID, Start: u.Start, End: u.End,
				LeaseSeconds: u.LeaseSeconds, Active: u.Active, LeaseDeadline: u.LeaseDeadline}
			if err := StartReservation(ctx, r.Temporal, r.TaskQueue, p); err != nil {
				return started, err
			}
			if err := r.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
				return store.MarkReservationWorkflowStarted(ctx, tx, u.ID)
			}); err != nil {
				return started, err
			}
			started++
			activity.RecordHeartbeat(ctx, started)
		}
	}
}

// MarkActive moves a bound reservation to active (binding -> active, or
// placed -> binding -> active) and answers the state it ends in. An active
// reservation succeeds unchanged; a cancelled one answers "cancelled" (the
// API cancelled it while the workflow was waiting); any other state is a
// non-retryable INVALID_STATE.
func (r *Reservations) MarkActive(ctx context.Context, tenantID, reservationID string) (string, error) {
	var end states.State
	err := r.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		from, err := lockState(ctx, tx, tenantID, reservationID)
		if err != nil {
			return err
		}
		var path []states.State
		switch from {
		case states.Active, states.Cancelled:
			end = from
			return nil
		case states.Placed:
			path = []states.State{states.Binding, states.Active}
		case states.Binding:
			path = []states.State{states.Active}
		default:
			return invalidState(reservationID, from, states.Active)
		}
		end = states.Active
		if err := walk(ctx, tx, tenantID, reservationID, from, path); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE reservations SET lease_expires_at = now() + lease_seconds * interval '1 second'
			WHERE id = $1 AND lease_seconds IS NOT NULL`, reservationID)
		return err
	})
	return string(end), err
}

// Bind moves a placed reservation to binding and queues, in the same
// transaction, the cdi.expose commands of its allocations on agent-driven
// nodes, valid for bindTimeout. It answers the state the reservation is in:
// binding, or active or cancelled as found (a retry, or the API cancelled
// it); any other state is a non-retryable INVALID_STATE.
func (r *Reservations) Bind(ctx context.Context, tenantID, reservationID string, bindTimeout time.Duration) (string, error) {
	var end states.State
	err := r.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		from, err := lockState(ctx, tx, tenantID, reservationID)
		if err != nil {
			return err
		}
		switch from {
		case states.Active, states.Cancelled:
			end = from
			return nil
		case states.Placed:
			if err := walk(ctx, tx, tenantID, reservationID, from, []states.State{states.Binding}); err != nil {
				return err
			}
		case states.Binding:
		default:
			return invalidState(reservationID, from, states.Binding)
		}
		end = states.Binding
		err = store.QueueBindCommands(ctx, tx, reservationID, time.Now().Add(bindTimeout))
		if ce := core.AsError(err); err != nil && ce.Code == core.CodeInvalidInput {
			return temporal.NewNonRetryableApplicationError(ce.Message, string(core.CodeInvalidState), err)
		}
		return err
	})
	return string(end), err
}

// BindStatus says how a binding reservation's commands stand
// (store.BindingWaiting, BindingBound or BindingFailed), or "cancelled"
// when the reservation was cancelled meanwhile; a reservation failed
// meanwhile answers BindingFailed, so the workflow ends at once.
func (r *Reservations) BindStatus(ctx context.Context, tenantID, reservationID string) (string, error) {
	var status string
	err := r.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		var st string
		if err := tx.QueryRow(ctx, `SELECT state FROM reservations WHERE id = $1 AND tenant_id = $2`,
			reservationID, tenantID).Scan(&st); err != nil {
			return err
		}
		switch states.State(st) {
		case states.Cancelled:
			status = string(states.Cancelled)
			return nil
		case states.Failed: // e.g. its node died and nothing else fits
			status = store.BindingFailed
			return nil
		}
		var err error
		status, err = store.BindingStatus(ctx, tx, reservationID)
		return err
	})
	return status, err
}

// FailBinding fails a reservation whose binding failed or timed out
// (binding -> failed, reason recorded), freeing its atoms and withdrawing
// what was exposed. A reservation no longer binding is left as it is.
func (r *Reservations) FailBinding(ctx context.Context, tenantID, reservationID, reason string) error {
	return r.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		from, err := lockState(ctx, tx, tenantID, reservationID)
		if err != nil || from != states.Binding {
			return err
		}
		failure, err := json.Marshal(map[string]any{"code": core.CodeUnavailable,
			"message": "the node agent did not expose the devices: " + reason, "details": map[string]any{"reason": reason}})
		if err != nil {
			return err
		}
		if err := store.SetReservationState(ctx, tx, tenantID, reservationID, from, states.Failed, failure); err != nil {
			return err
		}
		return store.CutReservationBookings(ctx, tx, tenantID, reservationID)
	})
}

// Expire ends an active reservation that ran past its end: active ->
// expired -> releasing -> released, cutting its bookings to now in the same
// transaction. A released reservation succeeds unchanged. When the row's
// end is still ahead (an extension the workflow has not heard of), nothing
// changes and the answer carries the new end.
func (r *Reservations) Expire(ctx context.Context, tenantID, reservationID string) (ExpireResult, error) {
	var out ExpireResult
	err := r.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		from, err := lockState(ctx, tx, tenantID, reservationID)
		if err != nil {
			return err
		}
		var ahead bool
		if err := tx.QueryRow(ctx, `SELECT ends_at > now(), (extract(epoch FROM ends_at) * 1000)::bigint
			FROM reservations WHERE id = $1`, reservationID).Scan(&ahead, &out.End); err != nil {
			return err
		}
		if ahead && from == states.Active {
			return nil
		}
		out.Released = true
		return finish(ctx, tx, tenantID, reservationID, from, true)
	})
	return out, err
}

// Release releases an active reservation (the release update, or a lease
// that was not renewed in time): active -> releasing -> released, cutting
// its bookings to now in the same transaction. An expired or releasing
// reservation is carried on to released; a released one succeeds unchanged.
func (r *Reservations) Release(ctx context.Context, tenantID, reservationID string) error {
	return r.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		from, err := lockState(ctx, tx, tenantID, reservationID)
		if err != nil {
			return err
		}
		return finish(ctx, tx, tenantID, reservationID, from, false)
	})
}

// finish walks the locked reservation to released and cuts its bookings in
// the transaction that reaches released, so they are cut exactly once.
func finish(ctx context.Context, tx store.Tx, tenantID, id string, from states.State, expire bool) error {
	var path []states.State
	switch from {
	case states.Released:
		return nil
	case states.Active:
		if expire {
			path = append(path, states.Expired)
		}
		path = append(path, states.Releasing, states.Released)
	case states.Expired:
		path = []states.State{states.Releasing, states.Released}
	case states.Releasing:
		path = []states.State{states.Released}
	default:
		return invalidState(id, from, states.Released)
	}
	if err := walk(ctx, tx, tenantID, id, from, path); err != nil {
		return err
	}
	return store.CutReservationBookings(ctx, tx, tenantID, id)
}

// lockState reads and locks the reservation's state; an unknown reservation
// (or another tenant's) is a non-retryable NOT_FOUND.
func lockState(ctx context.Context, tx store.Tx, tenantID, id string) (states.State, error) {
	s, err := store.LockReservationState(ctx, tx, tenantID, id)
	if ce := core.AsError(err); err != nil && ce.Code == core.CodeNotFound {
		return "", temporal.NewNonRetryableApplicationError(ce.Message, string(core.CodeNotFound), nil)
	}
	return s, err
}

// walk moves the locked reservation from along path, one checked edge at a
// time.
func walk(ctx context.Context, tx store.Tx, tenantID, id string, from states.State, path []states.State) error {
	for _, to := range path {
		if err := store.SetReservationState(ctx, tx, tenantID, id, from, to, nil); err != nil {
			if ce := core.AsError(err); ce.Code == core.CodeInvalidState {
				return temporal.NewNonRetryableApplicationError(err.Error(), string(core.CodeInvalidState), err)
			}
			return err
		}
		from = to
	}
	return nil
}

func invalidState(id string, from, to states.State) error {
	return temporal.NewNonRetryableApplicationError(
		fmt.Sprintf("reservation %s is %s and cannot become %s", id, from, to), string(core.CodeInvalidState), nil)
}

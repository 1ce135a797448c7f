// Package reservations holds the activities of the reservation workflows
// (workflows/reservations), and the names, parameters and results that the
// workflows, the API and other domains' activities share with them.
package reservations

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/reservations"
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

// Reconcile makes every live reservation's workflow run, a page at a time:
// it starts those whose start was lost (workflow_started_at is null past
// the grace period) and records the start; it asks Temporal about those
// whose workflow was started (past the grace period) and starts again,
// from the row, each whose run is not running (closed in any way, or
// unknown). Then it sweeps the drafts older than DraftMaxAge. It answers
// how many workflows it started.
func (r *Reservations) Reconcile(ctx context.Context) (int, error) {
	started, err := r.startUnstarted(ctx)
	if err != nil {
		return started, err
	}
	restarted, err := r.restartStopped(ctx)
	started += restarted
	if err != nil {
		return started, err
	}
	if err := r.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		n, err := domain.SweepDrafts(ctx, tx, DraftMaxAge)
		if n > 0 {
			activity.GetLogger(ctx).Info("swept stale reservation drafts", "drafts", n)
		}
		return err
	}); err != nil {
		return started, fmt.Errorf("sweep drafts: %w", err)
	}
	return started, nil
}

// DraftMaxAge is how long a reservation draft may stay a draft: an
// admission whose second transaction never ran (its process crashed, and
// its caller never retried) leaves one, with its idempotency row. A retry
// within it finishes the admission; after it, both are deleted, and the
// same key starts afresh.
const DraftMaxAge = time.Hour

func paramsOf(u store.UnstartedReservation) ReservationParams {
	return ReservationParams{TenantID: u.TenantID, ReservationID: u.ID, PoolID: u.PoolID, Start: u.Start, End: u.End,
		LeaseSeconds: u.LeaseSeconds, Active: u.Active, LeaseDeadline: u.LeaseDeadline}
}

func (r *Reservations) startUnstarted(ctx context.Context) (int, error) {
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
			if err := StartReservation(ctx, r.Temporal, r.TaskQueue, paramsOf(u)); err != nil {
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

// restartStopped pages through the live reservations whose workflow was
// started, by id, and starts again each whose workflow is not running. The
// row is read once more after Temporal answers, so a run that closed
// because its reservation just ended is not started again.
func (r *Reservations) restartStopped(ctx context.Context) (int, error) {
	var restarted int
	after := ""
	for {
		var page []store.UnstartedReservation
		err := r.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
			page, err = store.StartedLiveReservations(ctx, tx, after, reconcileGrace, 100)
			return err
		})
		if err != nil || len(page) == 0 {
			return restarted, err
		}
		for _, u := range page {
			after = u.ID
			running, err := workflowRunning(ctx, r.Temporal, u.ID)
			if err != nil || running {
				if err != nil {
					return restarted, err
				}
				continue
			}
			var live bool
			if err := r.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
				live, err = store.ReservationLive(ctx, tx, u.ID)
				return err
			}); err != nil {
				return restarted, err
			}
			if !live {
				continue
			}
			if err := StartReservation(ctx, r.Temporal, r.TaskQueue, paramsOf(u)); err != nil {
				return restarted, err
			}
			activity.GetLogger(ctx).Warn("restarted a live reservation's workflow that was not running", "reservation", u.ID)
			restarted++
			activity.RecordHeartbeat(ctx, restarted)
		}
	}
}

// workflowRunning says whether the workflow id's latest run is running.
func workflowRunning(ctx context.Context, c client.Client, id string) (bool, error) {
	desc, err := c.DescribeWorkflowExecution(ctx, id, "")
	var gone *serviceerror.NotFound
	if errors.As(err, &gone) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("describe workflow %s: %w", id, err)
	}
	return desc.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, nil
}

// MarkActive moves a bound reservation to active (binding -> active, or
// placed -> binding -> active) and answers the state it ends in. An active
// reservation succeeds unchanged; an ended one answers its state (the API
// cancelled it while the workflow was waiting, or it was ended outside the
// workflow); any other state is a non-retryable INVALID_STATE.
func (r *Reservations) MarkActive(ctx context.Context, tenantID, reservationID string) (string, error) {
	var end states.State
	err := r.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		from, err := lockState(ctx, tx, tenantID, reservationID)
		if err != nil {
			return err
		}
		var path []states.State
		switch {
		case from == states.Active || states.Terminal(from):
			end = from
			return nil
		case from == states.Placed:
			path = []states.State{states.Binding, states.Active}
		case from == states.Binding:
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
// binding; active or an ended state as found (a retry, or the API
// cancelled it); or failed when no booking of it covers now (its window is
// over: nothing is exposed). A booking that has not begun yet is a
// retryable error; any other state a non-retryable INVALID_STATE.
func (r *Reservations) Bind(ctx context.Context, tenantID, reservationID string, bindTimeout time.Duration) (string, error) {
	var end states.State
	err := r.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		from, err := lockState(ctx, tx, tenantID, reservationID)
		if err != nil {
			return err
		}
		switch {
		case from == states.Active || states.Terminal(from):
			end = from
			return nil
		case from == states.Placed:
			if err := walk(ctx, tx, tenantID, reservationID, from, []states.State{states.Binding}); err != nil {
				return err
			}
		case from == states.Binding:
		default:
			return invalidState(reservationID, from, states.Binding)
		}
		end = states.Binding
		err = store.QueueBindCommands(ctx, tx, reservationID, time.Now().Add(bindTimeout))
		ce := core.AsError(err)
		switch {
		case err == nil:
			return nil
		case ce.Code == core.CodeInvalidState && ce.Details["reason"] == store.BindNotBooked:
			// Its window is over (or never covered now): fail it rather
			// than expose anything.
			end = states.Failed
			return failReservation(ctx, tx, tenantID, reservationID, states.Binding, store.BindNotBooked,
				"the reservation holds no booking covering now: "+ce.Message)
		case ce.Code == core.CodeInvalidState && ce.Details["reason"] == store.BindNotBegun:
			return fmt.Errorf("bind %s: %w", reservationID, err) // retried: the booking begins soon
		case ce.Code == core.CodeInvalidInput:
			return temporal.NewNonRetryableApplicationError(ce.Message, string(core.CodeInvalidState), err)
		}
		return err
	})
	return string(end), err
}

// failReservation records reason and walks the locked reservation from
// (placed or binding) to failed, freeing its atoms and withdrawing what
// was exposed.
func failReservation(ctx context.Context, tx store.Tx, tenantID, id string, from states.State, reason, message string) error {
	failure, err := json.Marshal(map[string]any{"code": core.CodeUnavailable, "message": message,
		"details": map[string]any{"reason": reason}})
	if err != nil {
		return err
	}
	if err := store.SetReservationEndReason(ctx, tx, id, states.EndFailed); err != nil {
		return err
	}
	if err := store.SetReservationState(ctx, tx, tenantID, id, from, states.Failed, failure); err != nil {
		return err
	}
	return store.CutReservationBookings(ctx, tx, tenantID, id)
}

// BindStatus says how a binding reservation's commands stand
// (store.BindingWaiting, BindingBound or BindingFailed), or its state when
// it ended meanwhile (cancelled by the API, or ended outside the workflow).
func (r *Reservations) BindStatus(ctx context.Context, tenantID, reservationID string) (string, error) {
	var status string
	err := r.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		var st string
		if err := tx.QueryRow(ctx, `SELECT state FROM reservations WHERE id = $1 AND tenant_id = $2`,
			reservationID, tenantID).Scan(&st); err != nil {
			return err
		}
		if states.Terminal(states.State(st)) {
			status = st // a failed one answers BindingFailed: its node died and nothing else fit
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
		return failReservation(ctx, tx, tenantID, reservationID, from, reason, "the node agent did not expose the devices: "+reason)
	})
}

// Expire ends an active reservation that ran past its end: active ->
// expired -> releasing -> released, end reason "end", cutting its bookings
// to now in the same transaction. An ended reservation (released, or ended
// outside the workflow) succeeds unchanged, its state in the answer. When the row's
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
		end, err := finish(ctx, tx, tenantID, reservationID, from, states.EndOfWindow)
		out.State = string(end)
		return err
	})
	return out, err
}

// Release releases an active reservation (the release update, or a node
// drain): active -> releasing -> released, end reason "release" recorded
// first, cutting its bookings to now in the same transaction. An expired
// or releasing reservation is carried on to released; an ended one
// succeeds unchanged.
func (r *Reservations) Release(ctx context.Context, tenantID, reservationID string) error {
	return r.release(ctx, tenantID, reservationID, states.EndRelease)
}

// ReleaseLapsed releases an active reservation whose allocation lease was
// not renewed in time, as Release does, with end reason "lease".
func (r *Reservations) ReleaseLapsed(ctx context.Context, tenantID, reservationID string) error {
	return r.release(ctx, tenantID, reservationID, states.EndLease)
}

func (r *Reservations) release(ctx context.Context, tenantID, reservationID string, reason states.EndReason) error {
	return r.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		from, err := lockState(ctx, tx, tenantID, reservationID)
		if err != nil {
			return err
		}
		_, err = finish(ctx, tx, tenantID, reservationID, from, reason)
		return err
	})
}

// State reads the reservation's state and end reason, for a workflow told
// its row changed outside it.
func (r *Reservations) State(ctx context.Context, tenantID, reservationID string) (RowState, error) {
	var out RowState
	err := r.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT state, COALESCE(end_reason, '') FROM reservations WHERE id = $1 AND tenant_id = $2`,
			reservationID, tenantID).Scan(&out.State, &out.EndReason)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return out, temporal.NewNonRetryableApplicationError("reservation "+reservationID+" not found", string(core.CodeNotFound), nil)
	}
	out.Terminal = states.Terminal(states.State(out.State))
	return out, err
}

// finish records reason and walks the locked reservation to released
// (through expired when the window ended), cutting its bookings in the
// transaction that reaches released, so they are cut exactly once. A
// reservation already ended is left as it is. It answers the final state.
func finish(ctx context.Context, tx store.Tx, tenantID, id string, from states.State, reason states.EndReason) (states.State, error) {
	var path []states.State
	switch {
	case states.Terminal(from):
		return from, nil
	case from == states.Active:
		if reason == states.EndOfWindow {
			path = append(path, states.Expired)
		}
		path = append(path, states.Releasing, states.Released)
	case from == states.Expired:
		path = []states.State{states.Releasing, states.Released}
	case from == states.Releasing:
		path = []states.State{states.Released}
	default:
		return from, invalidState(id, from, states.Released)
	}
	if err := store.SetReservationEndReason(ctx, tx, id, reason); err != nil {
		return from, err
	}
	if err := walk(ctx, tx, tenantID, id, from, path); err != nil {
		return from, err
	}
	return states.Released, store.CutReservationBookings(ctx, tx, tenantID, id)
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

// Package nodes holds the activities of the node drain workflow
// (workflows/nodes), and the names and parameters the workflow and the API
// share with them.
package nodes

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	reservationsact "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// Nodes is the activity side of the node drain workflow.
type Nodes struct {
	Store *store.Store
	// Temporal sends release updates and cancel signals to reservation
	// workflows (release mode).
	Temporal client.Client
}

// liveReservation is a reservation holding one of a node's atoms.
type liveReservation struct {
	TenantID, ID string
	State        reservations.State
}

// DrainStep answers how many reservations still hold the node's atoms, or
// -1 when the node is no longer draining. In release mode it first releases
// the active ones (through their workflows' release update, or directly when
// a reservation has no workflow run) and cancels those not begun.
func (n *Nodes) DrainStep(ctx context.Context, p NodeDrainParams) (int, error) {
	draining, live, err := n.drainState(ctx, p)
	if err != nil || !draining {
		return -1, err
	}
	if p.Mode != DrainRelease || len(live) == 0 {
		return len(live), nil
	}
	for _, r := range live {
		switch r.State {
		case reservations.Active:
			if err := n.release(ctx, r); err != nil {
				return 0, err
			}
		case reservations.Placed, reservations.Binding:
			if err := n.cancel(ctx, r); err != nil {
				return 0, err
			}
		}
	}
	if draining, live, err = n.drainState(ctx, p); err != nil || !draining {
		return -1, err
	}
	return len(live), nil
}

// MarkDrained marks a draining node drained; false when it stopped
// draining meanwhile.
func (n *Nodes) MarkDrained(ctx context.Context, p NodeDrainParams) (bool, error) {
	var marked bool
	err := n.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		marked, err = domain.MarkDrained(ctx, tx, p.TenantID, p.NodeID)
		return err
	})
	return marked, err
}

func (n *Nodes) drainState(ctx context.Context, p NodeDrainParams) (bool, []liveReservation, error) {
	var draining bool
	var live []liveReservation
	err := n.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		var err error
		if draining, err = domain.IsDraining(ctx, tx, p.TenantID, p.NodeID); err != nil || !draining {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT DISTINCT r.tenant_id, r.id, r.state FROM reservations r
			JOIN allocations a ON a.reservation_id = r.id
			WHERE a.node_id = $1 AND r.state IN ('placed', 'binding', 'active', 'expired', 'releasing')
			ORDER BY r.id`, p.NodeID)
		if err != nil {
			return err
		}
		live, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (liveReservation, error) {
			var l liveReservation
			var st string
			err := r.Scan(&l.TenantID, &l.ID, &st)
			l.State = reservations.State(st)
			return l, err
		})
		return err
	})
	return draining, live, err
}

// release asks the reservation's workflow to release it, which cuts its
// bookings; without a workflow run the release is done here.
func (n *Nodes) release(ctx context.Context, r liveReservation) error {
	h, err := n.Temporal.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID: r.ID, UpdateName: reservationsact.UpdateRelease, WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err == nil {
		var final string
		err = h.Get(ctx, &final)
	}
	var gone *serviceerror.NotFound
	if errors.As(err, &gone) {
		return (&reservationsact.Reservations{Store: n.Store}).Release(ctx, r.TenantID, r.ID)
	}
	if err != nil {
		return fmt.Errorf("release reservation %s: %w", r.ID, err)
	}
	return nil
}

// cancel cancels a reservation that has not begun and cuts its bookings,
// then tells its workflow (best effort: a workflow that misses the signal
// finds the reservation cancelled when it would activate it).
func (n *Nodes) cancel(ctx context.Context, r liveReservation) error {
	err := n.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		st, err := store.LockReservationState(ctx, tx, r.TenantID, r.ID)
		if err != nil || (st != reservations.Placed && st != reservations.Binding) {
			return err
		}
		if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, st, reservations.Cancelled, nil); err != nil {
			return err
		}
		return store.CutReservationBookings(ctx, tx, r.TenantID, r.ID)
	})
	if err != nil {
		return err
	}
	if n.Temporal != nil {
		_ = n.Temporal.SignalWorkflow(ctx, r.ID, "", reservationsact.SignalCancel, nil)
	}
	return nil
}

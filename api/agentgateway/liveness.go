package agentgateway

import (
	"context"
	"time"

	rsvactivities "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/reservations"
)

// nodeHealthBatch bounds the reservations one sweep reconciles with their
// nodes' connectivity; the rest wait for the next sweep.
const nodeHealthBatch = 100

// SweepLiveness is one pass of the liveness controller: connected and
// disconnected nodes whose liveness lease lapsed become unreachable (with
// the condition NodeUnreachable), and unreachable ones whose lease lapsed
// more than their pool's policy.lostAfter ago become lost, each with an
// event. Then the reservations on unreachable or lost nodes are brought in
// step with them (store/reservations.ReconcileNodeHealth). It answers how
// many nodes it changed.
//
// Every change is a conditional UPDATE of rows it locks, so any number of
// API replicas may sweep at once: a node changes once, by whichever
// replica locks it first. A heartbeat undoes it. The reservations' step
// reads what to do from the rows on every pass, so a crash between the
// two steps only delays it.
func (g *Gateway) SweepLiveness(ctx context.Context) (int, error) {
	total := 0
	for _, sweep := range []func(store.Tx) (int, error){
		func(tx store.Tx) (int, error) { return domain.SweepUnreachable(ctx, tx) },
		func(tx store.Tx) (int, error) { return domain.SweepLost(ctx, tx, g.deps.Logger) },
	} {
		for {
			var n int
			err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
				n, err = sweep(tx)
				return err
			})
			total += n
			if err != nil {
				return total, err
			}
			if n < domain.SweepBatch {
				break
			}
		}
	}
	return total, g.reconcileNodeHealth(ctx)
}

// reconcileNodeHealth runs ReconcileNodeHealth on each reservation
// OnDeadNodes lists, one transaction each, so one reservation's failure
// holds up no other; a reservation placed again or ended has its workflow
// signalled after the commit.
func (g *Gateway) reconcileNodeHealth(ctx context.Context) error {
	var refs []reservations.Ref
	if err := g.deps.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		refs, err = reservations.OnDeadNodes(ctx, tx, nodeHealthBatch)
		return err
	}); err != nil {
		return err
	}
	var first error
	for _, ref := range refs {
		var did string
		err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			did, err = reservations.ReconcileNodeHealth(ctx, tx, ref.TenantID, ref.ID)
			return err
		})
		if err != nil {
			g.deps.Logger.Error("liveness sweep: reservation on a dead node", "reservation", ref.ID, "error", err)
			if first == nil {
				first = err
			}
			continue
		}
		if did == reservations.NodeHealthUnchanged {
			continue
		}
		g.deps.Logger.Info("liveness sweep: reservation on a dead node", "reservation", ref.ID, "did", did)
		if did != reservations.NodeHealthConditions && g.deps.Temporal != nil {
			// Best effort: the workflow also reads the row on its next
			// step, and the reservation reconciler finds what a lost
			// signal missed.
			if err := g.deps.Temporal.SignalWorkflow(ctx, ref.ID, "", rsvactivities.SignalChanged, nil); err != nil {
				g.deps.Logger.Debug("liveness sweep: signal", "reservation", ref.ID, "error", err)
			}
		}
	}
	return first
}

// RunLivenessSweeper sweeps every interval until ctx ends.
func (g *Gateway) RunLivenessSweeper(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if n, err := g.SweepLiveness(ctx); err != nil && ctx.Err() == nil {
			g.deps.Logger.Error("liveness sweep", "error", err)
		} else if n > 0 {
			g.deps.Logger.Info("liveness sweep", "changed", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

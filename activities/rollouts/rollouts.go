package rollouts

import (
	"context"
	"fmt"

	"go.temporal.io/sdk/client"

	nodesact "github.com/better-compute/better-compute/activities/nodes"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/rollouts"
)

// By names the rollout workflow in the node events its steps write.
const By = "rollout"

// reconcilePage is how many owed rollouts the reconciler reads at once.
const reconcilePage = 500

// Rollouts is the activity side of the rollout workflow.
type Rollouts struct {
	Store     *store.Store
	Temporal  client.Client
	TaskQueue string
}

// RolloutStep advances the rollout by its rows (store/rollouts.Step) in one
// transaction, then starts the drain workflow of each node whose drain it
// began (NodeDrainWorkflow marks it drained; a start already made is
// kept, so a retried step starts nothing twice).
func (a *Rollouts) RolloutStep(ctx context.Context, p RolloutParams) (State, error) {
	var res State
	if err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		res, err = domain.Step(ctx, tx, p.RolloutID, By+" "+p.RolloutID)
		return err
	}); err != nil {
		return State{}, err
	}
	for _, d := range res.Drains {
		if err := nodesact.StartNodeDrain(ctx, a.Temporal, a.TaskQueue,
			nodesact.NodeDrainParams{TenantID: d.TenantID, NodeID: d.NodeID, Mode: domain.DrainMode}); err != nil {
			return State{}, fmt.Errorf("rollouts: draining node %s: %w", d.NodeID, err)
		}
	}
	res.Drains = nil // started: the history need not carry them
	return res, nil
}

// ReconcileRollouts starts the workflow of every rollout with work left
// (a running workflow is kept) and answers how many it asked for.
func (a *Rollouts) ReconcileRollouts(ctx context.Context) (int, error) {
	var owed []string
	if err := a.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		owed, err = domain.Owed(ctx, tx, reconcilePage)
		return err
	}); err != nil {
		return 0, err
	}
	for _, id := range owed {
		if err := StartRollout(ctx, a.Temporal, a.TaskQueue, RolloutParams{RolloutID: id}); err != nil {
			return 0, fmt.Errorf("rollouts: starting %s: %w", id, err)
		}
	}
	return len(owed), nil
}

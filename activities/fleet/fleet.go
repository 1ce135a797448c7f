// Package fleet holds the activities of the fleet apply workflow
// (workflows/fleet) and the names both sides and the API use.
package fleet

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/fleet"
	"github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/store/sites"
)

// Names as registered; they are persisted in workflow histories, so they
// never change.
const (
	WorkflowName    = "FleetApplyWorkflow"
	ActivityPending = "FleetPending"
	ActivityChange  = "FleetApplyChange"
	ActivityFinish  = "FleetFinish"

	// The reconciler: a Temporal schedule runs ReconcileWorkflowName, whose
	// activity starts the workflow of every running apply.
	ReconcileWorkflowName = "ReconcileFleetAppliesWorkflow"
	ReconcileScheduleID   = "fleet-reconciler"
	ActivityReconcile     = "FleetReconcile"
)

// reconcilePage bounds the applies one reconciliation starts.
const reconcilePage = 100

// Fleet is the activity side of the apply workflow.
type Fleet struct {
	Store *store.Store
	// Catalog names the authorization rows' types.
	Catalog *core.Catalog
	// Temporal and TaskQueue start owed apply workflows (the reconciler).
	Temporal  client.Client
	TaskQueue string
}

func (f *Fleet) types() domain.Types {
	return domain.Types{Site: f.Catalog.FullName(sites.ResourceType), Pool: f.Catalog.FullName(pools.ResourceType)}
}

// FleetPending answers the apply's changes not done yet, in order.
func (f *Fleet) FleetPending(ctx context.Context, applyID string) ([]int, error) {
	var out []int
	err := f.Store.InTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx store.Tx) error {
		var err error
		out, err = domain.Pending(ctx, tx, applyID)
		return err
	})
	return out, err
}

// FleetApplyChange applies one change and marks it done, or answers why the
// domain refused it (the apply is then failed).
func (f *Fleet) FleetApplyChange(ctx context.Context, applyID string, seq int) (string, error) {
	return domain.ApplyChange(ctx, f.Store, f.types(), applyID, seq)
}

// FleetFinish marks the apply succeeded once every change is done.
func (f *Fleet) FleetFinish(ctx context.Context, applyID string) error {
	return f.Store.InTx(ctx, pgx.TxOptions{}, func(tx store.Tx) error { return domain.Finish(ctx, tx, applyID) })
}

// FleetReconcile starts the workflow of every running apply (a running
// workflow is kept) and answers how many it asked for.
func (f *Fleet) FleetReconcile(ctx context.Context) (int, error) {
	var owed []string
	if err := f.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		owed, err = domain.Running(ctx, tx, reconcilePage)
		return err
	}); err != nil {
		return 0, err
	}
	for _, id := range owed {
		if err := Start(ctx, f.Temporal, f.TaskQueue, id); err != nil {
			return 0, fmt.Errorf("fleet: starting apply %s: %w", id, err)
		}
	}
	return len(owed), nil
}

// Start starts the apply's workflow (id = the apply id) on taskQueue; a
// running or finished one is kept.
func Start(ctx context.Context, c client.Client, taskQueue, applyID string) error {
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       applyID,
		TaskQueue:                taskQueue,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, WorkflowName, applyID)
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &started) {
		return nil
	}
	return err
}

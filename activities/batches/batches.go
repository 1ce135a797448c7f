// Package batches holds the command batch workflow's activities and the
// domain's Temporal contract: the workflow, signal, activity and schedule
// names (persisted in histories: they never change), the parameters, and
// the start and signal helpers the API and the reconciler use.
package batches

import (
	"context"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/batches"
)

// The names.
const (
	BatchWorkflowName = "CommandBatchWorkflow"
	// SignalChanged tells the workflow the API changed the batch (its
	// quorum was reached, it was cancelled), so it steps now.
	SignalChanged = "changed"
	ActivityStep  = "CommandBatchStep"

	// The reconciler: a Temporal schedule runs ReconcileBatchesWorkflow,
	// whose one activity starts again the workflow of every running batch
	// whose run is gone (terminated, lost, never started after the
	// approval's commit).
	ReconcileBatchesWorkflowName = "ReconcileCommandBatchesWorkflow"
	ReconcileBatchesScheduleID   = "command-batches-reconciler"
	ActivityReconcile            = "CommandBatchesReconcile"
)

// BatchParams starts a CommandBatchWorkflow (workflow id = BatchID).
type BatchParams struct {
	BatchID string
	// PollEvery is how often the workflow steps while commands are in
	// flight (0: DefaultPollEvery).
	PollEvery time.Duration
}

// DefaultPollEvery is BatchParams.PollEvery's default.
const DefaultPollEvery = 2 * time.Second

// State is the workflow's state query (visibility.QueryState).
type State = domain.StepResult

// reconcilePage is how many running batches the reconciler reads at once.
const reconcilePage = 500

// Batches is the activity side of the batch workflow.
type Batches struct {
	Store     *store.Store
	Temporal  client.Client
	TaskQueue string
	// PollEvery is what the reconciler starts workflows with (0: the default).
	PollEvery time.Duration
}

// BatchStep advances the batch by its rows (store/batches.Step) in one
// transaction.
func (a *Batches) BatchStep(ctx context.Context, p BatchParams) (State, error) {
	var res State
	err := a.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		res, err = domain.Step(ctx, tx, p.BatchID)
		return err
	})
	return res, err
}

// ReconcileBatches starts the workflow of every running batch (a running
// workflow is kept) and answers how many it asked for.
func (a *Batches) ReconcileBatches(ctx context.Context) (int, error) {
	var owed []string
	if err := a.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		owed, err = domain.Owed(ctx, tx, reconcilePage)
		return err
	}); err != nil {
		return 0, err
	}
	for _, id := range owed {
		if err := Start(ctx, a.Temporal, a.TaskQueue, BatchParams{BatchID: id, PollEvery: a.PollEvery}); err != nil {
			return 0, fmt.Errorf("batches: starting %s: %w", id, err)
		}
	}
	return len(owed), nil
}

// Start starts the workflow of a running batch on taskQueue. A running
// workflow is kept; one that closed is started again (its step finds the
// batch over, or goes on from its rows).
func Start(ctx context.Context, c client.Client, taskQueue string, p BatchParams) error {
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       p.BatchID,
		TaskQueue:                taskQueue,
		Memo:                     visibility.Fields{}.Memo("command batch"),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, BatchWorkflowName, p)
	var done *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &done) {
		return nil
	}
	return err
}

// Signal wakes the batch's workflow, best effort: one that is not running
// is the reconciler's to start, and a running one that misses the signal
// reads the rows at its next poll.
func Signal(ctx context.Context, c client.Client, batchID string) error {
	err := c.SignalWorkflow(ctx, batchID, "", SignalChanged, nil)
	var gone *serviceerror.NotFound
	if errors.As(err, &gone) {
		return nil
	}
	return err
}

// Package rollouts holds the rollout workflow's activities and the
// rollouts domain's Temporal contract: the workflow, signal, query,
// activity and schedule names (persisted in histories: they never
// change), the parameters, and the start and signal helpers the API and
// the reconciler use.
package rollouts

import (
	"context"
	"errors"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/activities/visibility"
	domain "github.com/better-compute/better-compute/store/rollouts"
)

// The names.
const (
	RolloutWorkflowName = "RolloutWorkflow"
	// SignalChanged tells the workflow the API changed the rollout's state
	// (pause, resume, abort), so it steps now instead of at its next poll.
	SignalChanged = "changed"
	ActivityStep  = "RolloutStep"

	// The reconciler: a Temporal schedule runs ReconcileRolloutsWorkflow,
	// whose one activity starts again the workflow of every rollout that
	// still has work (running or aborting) and whose run is gone
	// (terminated, lost, never started after the create's commit).
	ReconcileRolloutsWorkflowName = "ReconcileRolloutsWorkflow"
	ReconcileRolloutsScheduleID   = "rollouts-reconciler"
	ActivityReconcile             = "RolloutsReconcile"
)

// RolloutParams starts a RolloutWorkflow (workflow id = RolloutID).
type RolloutParams struct {
	RolloutID string
	// PollEvery is how often the workflow steps while nodes are in flight
	// or the rollout is paused (0: DefaultPollEvery).
	PollEvery time.Duration
}

// DefaultPollEvery is RolloutParams.PollEvery's default.
const DefaultPollEvery = 2 * time.Second

// State is the workflow's state query (visibility.QueryState): the
// rollout's state and wave after the last step, and the wave's nodes per
// state.
type State = domain.StepResult

// StartRollout starts the workflow of a rollout on taskQueue. A running
// workflow is kept; one that closed is started again, so callers start
// only rollouts whose row has work.
func StartRollout(ctx context.Context, c client.Client, taskQueue string, p RolloutParams) error {
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       p.RolloutID,
		TaskQueue:                taskQueue,
		Memo:                     visibility.Fields{}.Memo("rollout"),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, RolloutWorkflowName, p)
	var done *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &done) {
		return nil
	}
	return err
}

// Signal wakes the rollout's workflow, best effort: one that is not
// running is the reconciler's to start, and a running one that misses the
// signal reads the row at its next poll.
func Signal(ctx context.Context, c client.Client, rolloutID string) error {
	err := c.SignalWorkflow(ctx, rolloutID, "", SignalChanged, nil)
	var gone *serviceerror.NotFound
	if errors.As(err, &gone) {
		return nil
	}
	return err
}

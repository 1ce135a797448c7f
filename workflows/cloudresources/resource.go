// Package cloudresources holds CloudResourceWorkflow, the reconciler of
// one cloud resource, and the schedule that keeps every live resource's
// workflow running.
package cloudresources

import (
	"context"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/cloudresources"
	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/workflows/schedules"
)

// maxRounds bounds the rounds of one run before it continues as new, so
// its history stays short.
const maxRounds = 500

// WorkflowState answers the state query (visibility.QueryState).
type WorkflowState struct {
	State      string `json:"state"`
	Converging bool   `json:"converging"`
}

// ResourceWorkflow reconciles one resource (workflow id = its id): each
// round is one Reconcile activity, then a wait for a change signal or a
// durable timer, ConvergingEvery (30 s) while the resource converges,
// SettledEvery (5 min) once ready or failed, which retries an error and
// picks up what changed at the provider. It ends when the resource ends.
// The activity retries without a bound (a 429 storm slows it, nothing is
// lost); its answer holds states only, never a value of the provider's.
func ResourceWorkflow(ctx workflow.Context, p activities.ResourceParams) error {
	converging, settled := p.ConvergingEvery, p.SettledEvery
	if converging <= 0 {
		converging = activities.DefaultConvergingEvery
	}
	if settled <= 0 {
		settled = activities.DefaultSettledEvery
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2,
			MaximumInterval: time.Minute},
	})
	var a *activities.Resources
	var st WorkflowState
	if err := workflow.SetQueryHandler(ctx, visibility.QueryState, func() (WorkflowState, error) { return st, nil }); err != nil {
		return err
	}
	changed := workflow.GetSignalChannel(ctx, activities.SignalChanged)
	for round := 0; ; round++ {
		var pr activities.Progress
		if err := workflow.ExecuteActivity(ctx, a.ReconcileResource, p.ResourceID).Get(ctx, &pr); err != nil {
			return err
		}
		if pr.State != st.State {
			_ = workflow.UpsertTypedSearchAttributes(ctx, visibility.SetState(pr.State))
		}
		st = WorkflowState{State: pr.State, Converging: pr.Converging}
		if pr.Done {
			return nil
		}
		if round >= maxRounds {
			return workflow.NewContinueAsNewError(ctx, activities.ResourceWorkflowName, p)
		}
		wait := settled
		if pr.Converging {
			wait = converging
		}
		timerCtx, cancel := workflow.WithCancel(ctx)
		timer := workflow.NewTimer(timerCtx, wait)
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(changed, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil) })
		sel.AddFuture(timer, func(workflow.Future) {})
		sel.Select(ctx)
		cancel()
		for changed.ReceiveAsync(nil) { // signals that came together are one round
		}
	}
}

// ReconcileInterval is how often the reconciler's schedule runs.
const ReconcileInterval = time.Minute

// ReconcileResourcesWorkflow runs one pass of the reconciler and answers
// how many workflows it started.
func ReconcileResourcesWorkflow(ctx workflow.Context) (int, error) {
	var a *activities.Resources
	return schedules.Reconcile(ctx, a.ReconcileResources, ReconcileInterval)
}

// EnsureSchedule creates the reconciler's schedule on taskQueue unless it
// exists.
func EnsureSchedule(ctx context.Context, c client.Client, taskQueue string) error {
	return schedules.EnsureEvery(ctx, c, activities.ReconcileScheduleID, activities.ReconcileWorkflowName, taskQueue, ReconcileInterval)
}

// Package sandboxes holds SandboxWorkflow, a sandbox's lifetime, and the
// sandboxes reconciler.
package sandboxes

import (
	"context"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/sandboxes"
	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/workflows/schedules"
)

// maxRounds bounds one run's rounds before it continues as new.
const maxRounds = 500

// WorkflowState answers the state query (visibility.QueryState).
type WorkflowState struct {
	State string `json:"state"`
}

// SandboxWorkflow is one sandbox's lifetime (workflow id = its id). The
// deadline is the row's expires_at, never the workflow's: each round
// runs Step (which ends the sandbox once the database's clock passes the
// deadline, and records the end once its workload is gone), then waits on
// a durable timer until the deadline (at most SettledPoll) or a changed
// signal (an extend, a delete). A restart of any process, a lost signal
// or a replay cannot move the deadline: only sandboxes.extend writes it.
func SandboxWorkflow(ctx workflow.Context, p activities.SandboxParams) error {
	poll, settled := p.PollEvery, p.SettledPoll
	if poll <= 0 {
		poll = activities.DefaultPollEvery
	}
	if settled <= 0 {
		settled = activities.DefaultSettledPoll
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2,
			MaximumInterval: time.Minute},
	})
	var a *activities.Sandboxes
	var st WorkflowState
	if err := workflow.SetQueryHandler(ctx, visibility.QueryState, func() (WorkflowState, error) { return st, nil }); err != nil {
		return err
	}
	changed := workflow.GetSignalChannel(ctx, activities.SignalChanged)
	for round := 0; ; round++ {
		var pr activities.Progress
		if err := workflow.ExecuteActivity(ctx, a.Step, p.SandboxID).Get(ctx, &pr); err != nil {
			return err
		}
		if pr.State != st.State {
			_ = workflow.UpsertTypedSearchAttributes(ctx, visibility.SetState(pr.State))
		}
		st = WorkflowState{State: pr.State}
		if pr.Ended {
			return nil
		}
		wait := poll
		if pr.State == "live" {
			// Wake at the deadline (a millisecond past it, so the
			// database's clock has passed it too), or sooner to notice a
			// workload that went away.
			wait = min(max(pr.UntilDeadline+time.Millisecond, time.Millisecond), settled)
		}
		if round >= maxRounds {
			return workflow.NewContinueAsNewError(ctx, activities.SandboxWorkflowName, p)
		}
		timerCtx, cancel := workflow.WithCancel(ctx)
		timer := workflow.NewTimer(timerCtx, wait)
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(changed, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil) })
		sel.AddFuture(timer, func(workflow.Future) {})
		sel.Select(ctx)
		cancel()
		for changed.ReceiveAsync(nil) {
		}
	}
}

// SandboxWarmPoolWorkflow keeps a template's warm pool at its size
// (workflow id activities.WarmPoolID): each round tops it up
// (TopUpWarmPool: stale workloads deleted, missing ones placed and their
// workflows started), then waits for a changed signal (a claim, a
// template update) or the poll. It ends once the template is deleted and
// its warm workloads are being deleted.
func SandboxWarmPoolWorkflow(ctx workflow.Context, p activities.WarmPoolParams) error {
	poll := p.PollEvery
	if poll <= 0 {
		poll = activities.DefaultSettledPoll
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2,
			MaximumInterval: time.Minute},
	})
	var a *activities.Sandboxes
	changed := workflow.GetSignalChannel(ctx, activities.SignalChanged)
	for round := 0; ; round++ {
		for changed.ReceiveAsync(nil) {
		}
		var pr activities.WarmProgress
		if err := workflow.ExecuteActivity(ctx, a.TopUpWarmPool, p.TemplateID).Get(ctx, &pr); err != nil {
			return err
		}
		if pr.Ended {
			return nil
		}
		if round >= maxRounds {
			return workflow.NewContinueAsNewError(ctx, activities.WarmPoolWorkflowName, p)
		}
		timerCtx, cancel := workflow.WithCancel(ctx)
		timer := workflow.NewTimer(timerCtx, poll)
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(changed, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil) })
		sel.AddFuture(timer, func(workflow.Future) {})
		sel.Select(ctx)
		cancel()
	}
}

// ReconcileInterval is how often the reconciler's schedule runs.
const ReconcileInterval = time.Minute

// ReconcileSandboxesWorkflow runs one reconciliation and answers how many
// workflows it started.
func ReconcileSandboxesWorkflow(ctx workflow.Context) (int, error) {
	var a *activities.Sandboxes
	return schedules.Reconcile(ctx, a.ReconcileSandboxes, ReconcileInterval)
}

// EnsureSchedule creates the reconciler's schedule on taskQueue unless it
// exists.
func EnsureSchedule(ctx context.Context, c client.Client, taskQueue string) error {
	return schedules.EnsureEvery(ctx, c, activities.ReconcileSandboxesScheduleID, activities.ReconcileSandboxesWorkflowName, taskQueue, ReconcileInterval)
}

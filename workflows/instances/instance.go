// Package instances holds InstanceWorkflow, which converges an instance's
// observed state on its desired one, and the instances reconciler.
package instances

import (
	"context"
	"fmt"
	"github.com/better-compute/better-compute/workflows/schedules"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/instances"
	"github.com/better-compute/better-compute/activities/visibility"
)

// settledPoll is how often a settled instance's row is read anyway (a
// missed signal, a node lost while it ran).
const settledPoll = 5 * time.Minute

// providerFirstPoll is the first pause of a converging provider
// instance's rounds.
const providerFirstPoll = time.Second

// maxRounds bounds the rounds of one run before it continues as new, so
// its history stays short.
const maxRounds = 500

// WorkflowState answers the state query (visibility.QueryState).
type WorkflowState struct {
	State   string `json:"state"`
	Desired string `json:"desired"`
	Settled bool   `json:"settled"`
}

// InstanceWorkflow converges one instance (workflow id = its id). The API
// changes the desired state in the database, then signals
// desired-changed; the gateway signals status after a node's report. On
// vps-host pools the workflow pushes nothing (the NodeSpec carries the
// instance): each round it runs Converge, which records the state the
// node reported and ends a deleted instance once its node no longer holds
// it, releasing its allocation in the same transaction. On provider pools
// ConvergeInstanceProvider drives the droplet. A round waits for a signal or a
// durable timer (the fallback poll). An instance that stays unsettled
// past ConvergeBound is marked failed, with the runtime's error; the
// next change of its desired state tries again.
func InstanceWorkflow(ctx workflow.Context, p activities.InstanceParams) error {
	bound, poll := p.ConvergeBound, p.PollEvery
	if bound <= 0 {
		bound = activities.DefaultConvergeBound
	}
	if poll <= 0 {
		poll = activities.DefaultPollEvery
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2,
			MaximumInterval: time.Minute},
	})
	var a *activities.Instances
	var st WorkflowState
	if err := workflow.SetQueryHandler(ctx, visibility.QueryState, func() (WorkflowState, error) { return st, nil }); err != nil {
		return err
	}
	changed := workflow.GetSignalChannel(ctx, activities.SignalDesiredChanged)
	status := workflow.GetSignalChannel(ctx, activities.SignalStatus)
	failedMarked := false
	converging := 0     // consecutive unsettled rounds
	var since time.Time // when this run first saw the state differ from the desired one
	for round := 0; ; round++ {
		var pr activities.Progress
		if err := workflow.ExecuteActivity(ctx, a.ConvergeInstance, p.InstanceID).Get(ctx, &pr); err != nil {
			return err
		}
		if pr.Provider && !pr.Done {
			if err := workflow.ExecuteActivity(ctx, a.ConvergeInstanceProvider, p.InstanceID).Get(ctx, &pr); err != nil {
				return err
			}
		}
		if pr.State != st.State {
			_ = workflow.UpsertTypedSearchAttributes(ctx, visibility.SetState(pr.State))
		}
		st = WorkflowState{State: pr.State, Desired: pr.Desired, Settled: pr.Settled}
		if pr.Done {
			return nil
		}
		if pr.State != "failed" {
			failedMarked = false
		}
		if pr.Settled || pr.State == "failed" {
			since = time.Time{}
		} else if since.IsZero() {
			since = workflow.Now(ctx).Add(-pr.ConvergingFor)
		}
		wait := poll
		if pr.Settled || pr.State == "failed" {
			converging = 0
		} else {
			converging++
		}
		switch {
		case pr.Settled || pr.State == "failed":
			wait = settledPoll
		case workflow.Now(ctx).Sub(since) >= bound && !failedMarked:
			msg := fmt.Sprintf("the instance did not become %s within %s", pr.Desired, bound)
			if pr.ObservedError != "" {
				msg += ": " + pr.ObservedError
			}
			if err := workflow.ExecuteActivity(ctx, a.MarkInstanceFailed, activities.MarkFailedParams{InstanceID: p.InstanceID,
				Reason: "convergeTimeout", Message: msg}).Get(ctx, nil); err != nil {
				return err
			}
			failedMarked = true
			continue
		case pr.Provider:
			// No node signals a provider's progress: poll from a second,
			// doubling up to the poll, so a droplet's boot is seen soon.
			wait = min(poll, providerFirstPoll<<min(converging-1, 6))
		}
		if round >= maxRounds {
			return workflow.NewContinueAsNewError(ctx, activities.InstanceWorkflowName, p)
		}
		timerCtx, cancel := workflow.WithCancel(ctx)
		timer := workflow.NewTimer(timerCtx, wait)
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(changed, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil) })
		sel.AddReceive(status, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil) })
		sel.AddFuture(timer, func(workflow.Future) {})
		sel.Select(ctx)
		cancel()
		// Signals that came together are one round.
		for changed.ReceiveAsync(nil) || status.ReceiveAsync(nil) {
		}
	}
}

// ReconcileInterval is how often the reconciler's schedule runs.
const ReconcileInterval = time.Minute

// ReconcileInstancesWorkflow runs one reconciliation and answers how many
// workflows it started.
func ReconcileInstancesWorkflow(ctx workflow.Context) (int, error) {
	var a *activities.Instances
	return schedules.Reconcile(ctx, a.ReconcileInstances, ReconcileInterval)
}

// EnsureSchedule creates the reconciler's schedule on taskQueue unless it
// exists (one per namespace however many workers run).
func EnsureSchedule(ctx context.Context, c client.Client, taskQueue string) error {
	return schedules.EnsureEvery(ctx, c, activities.ReconcileInstancesScheduleID, activities.ReconcileInstancesWorkflowName, taskQueue, ReconcileInterval)
}

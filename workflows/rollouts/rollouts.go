// Package rollouts holds RolloutWorkflow, which moves one rollout's nodes
// onto its release wave by wave, and the reconciler that restarts the
// workflows of rollouts left without one. Its activities, names and
// parameters are in activities/rollouts.
package rollouts

import (
	"context"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/rollouts"
	"github.com/better-compute/better-compute/workflows/schedules"
	"github.com/better-compute/better-compute/workflows/stepping"
)

// stepsPerRun bounds one run's history within a wave (each step is an
// activity and a timer): past it the workflow continues as new.
const stepsPerRun = 200

// ReconcileInterval is how often the reconciler's schedule runs.
const ReconcileInterval = time.Minute

// Register registers the rollout workflow, the reconciler and their
// activities, a, under their persisted names.
func Register(r worker.Registry, a *activities.Rollouts) {
	r.RegisterWorkflowWithOptions(RolloutWorkflow, workflow.RegisterOptions{Name: activities.RolloutWorkflowName})
	r.RegisterWorkflowWithOptions(ReconcileRolloutsWorkflow, workflow.RegisterOptions{Name: activities.ReconcileRolloutsWorkflowName})
	r.RegisterActivityWithOptions(a.RolloutStep, activity.RegisterOptions{Name: activities.ActivityStep})
	r.RegisterActivityWithOptions(a.ReconcileRollouts, activity.RegisterOptions{Name: activities.ActivityReconcile})
}

// RolloutWorkflow steps its rollout (activities.Rollouts.Step) until it is
// over: after each step it waits PollEvery, or less when the API signals a
// pause, resume or abort. All state is in the rollout's rows, so the
// workflow carries none across runs: it continues as new at each new wave
// and every stepsPerRun steps, so its history stays bounded whatever the
// rollout's size. Its state query (visibility.QueryState) answers the
// last step's state, wave and the wave's nodes per state.
func RolloutWorkflow(ctx workflow.Context, p activities.RolloutParams) (string, error) {
	every := p.PollEvery
	if every <= 0 {
		every = activities.DefaultPollEvery
	}
	var a *activities.Rollouts
	state, err := stepping.Run(ctx, every, activities.SignalChanged, stepsPerRun, a.RolloutStep, p,
		func(s activities.State) stepping.Outcome { return stepping.Outcome{Done: s.Done, NewRun: s.NextWave} }, RolloutWorkflow)
	return state.State, err
}

// ReconcileRolloutsWorkflow runs one reconciliation and answers how many
// rollouts it started (or kept).
func ReconcileRolloutsWorkflow(ctx workflow.Context) (int, error) {
	var a *activities.Rollouts
	return schedules.Reconcile(ctx, a.ReconcileRollouts, ReconcileInterval)
}

// EnsureSchedule creates the reconciler's schedule on taskQueue unless it
// exists (one per namespace however many workers run).
func EnsureSchedule(ctx context.Context, c client.Client, taskQueue string) error {
	return schedules.EnsureEvery(ctx, c, activities.ReconcileRolloutsScheduleID, activities.ReconcileRolloutsWorkflowName, taskQueue, ReconcileInterval)
}

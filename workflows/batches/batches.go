// Package batches holds CommandBatchWorkflow, which runs one command
// batch's nodes wave by wave, and the reconciler that restarts the
// workflows of running batches left without one. Its activities, names
// and parameters are in activities/batches.
package batches

import (
	"context"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/batches"
	"github.com/better-compute/better-compute/workflows/schedules"
	"github.com/better-compute/better-compute/workflows/stepping"
)

// stepsPerRun bounds one run's history within a wave (each step is an
// activity and a timer): past it the workflow continues as new.
const stepsPerRun = 200

// ReconcileInterval is how often the reconciler's schedule runs.
const ReconcileInterval = time.Minute

// Register registers the batch workflow, the reconciler and their
// activities, a, under their persisted names.
func Register(r worker.Registry, a *activities.Batches) {
	r.RegisterWorkflowWithOptions(CommandBatchWorkflow, workflow.RegisterOptions{Name: activities.BatchWorkflowName})
	r.RegisterWorkflowWithOptions(ReconcileBatchesWorkflow, workflow.RegisterOptions{Name: activities.ReconcileBatchesWorkflowName})
	r.RegisterActivityWithOptions(a.BatchStep, activity.RegisterOptions{Name: activities.ActivityStep})
	r.RegisterActivityWithOptions(a.ReconcileBatches, activity.RegisterOptions{Name: activities.ActivityReconcile})
}

// CommandBatchWorkflow steps its batch (activities.Batches.BatchStep)
// until it is over: after each step it waits PollEvery, or less when the
// API signals a change. All state is in the batch's rows: the workflow
// continues as new at each wave and every stepsPerRun steps, and its state
// query (visibility.QueryState) answers the last step's state, wave and
// the wave's nodes per state.
func CommandBatchWorkflow(ctx workflow.Context, p activities.BatchParams) (string, error) {
	every := p.PollEvery
	if every <= 0 {
		every = activities.DefaultPollEvery
	}
	var a *activities.Batches
	state, err := stepping.Run(ctx, every, activities.SignalChanged, stepsPerRun, a.BatchStep, p,
		func(s activities.State) stepping.Outcome { return stepping.Outcome{Done: s.Done, NewRun: s.NextWave} }, CommandBatchWorkflow)
	return state.State, err
}

// ReconcileBatchesWorkflow runs one reconciliation and answers how many
// batches it started (or kept).
func ReconcileBatchesWorkflow(ctx workflow.Context) (int, error) {
	var a *activities.Batches
	return schedules.Reconcile(ctx, a.ReconcileBatches, ReconcileInterval)
}

// EnsureSchedule creates the reconciler's schedule on taskQueue unless it
// exists (one per namespace however many workers run).
func EnsureSchedule(ctx context.Context, c client.Client, taskQueue string) error {
	return schedules.EnsureEvery(ctx, c, activities.ReconcileBatchesScheduleID, activities.ReconcileBatchesWorkflowName, taskQueue, ReconcileInterval)
}

package reservations

import (
	"context"
	"github.com/better-compute/better-compute/workflows/schedules"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/reservations"
)

// ReconcileInterval is how often the reconciler's schedule runs
// ReconcileReservationsWorkflow.
const ReconcileInterval = time.Minute

// ReconcileReservationsWorkflow runs one reconciliation and answers how many
// workflows it started.
func ReconcileReservationsWorkflow(ctx workflow.Context) (int, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: ReconcileInterval,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
	})
	var a *activities.Reservations
	var started int
	err := workflow.ExecuteActivity(ctx, a.Reconcile).Get(ctx, &started)
	return started, err
}

// EnsureSchedule creates the reconciler's schedule, running on taskQueue,
// unless it exists. Every worker calls it at start; the schedule's id makes
// it one per namespace however many workers run.
func EnsureSchedule(ctx context.Context, c client.Client, taskQueue string) error {
	return schedules.EnsureEvery(ctx, c, activities.ReconcileReservationsScheduleID, activities.ReconcileReservationsWorkflowName, taskQueue, ReconcileInterval)
}

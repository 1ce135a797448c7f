package reservations

import (
	"context"
	"github.com/better-compute/better-compute/workflows/schedules"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/reservations"
)

// ReconcileInterval is how often the reconciler's schedule runs
// ReconcileReservationsWorkflow.
const ReconcileInterval = time.Minute

// ReconcileReservationsWorkflow runs one reconciliation and answers how many
// workflows it started.
func ReconcileReservationsWorkflow(ctx workflow.Context) (int, error) {
	var a *activities.Reservations
	return schedules.Reconcile(ctx, a.Reconcile, ReconcileInterval)
}

// EnsureSchedule creates the reconciler's schedule, running on taskQueue,
// unless it exists. Every worker calls it at start; the schedule's id makes
// it one per namespace however many workers run.
func EnsureSchedule(ctx context.Context, c client.Client, taskQueue string) error {
	return schedules.EnsureEvery(ctx, c, activities.ReconcileReservationsScheduleID, activities.ReconcileReservationsWorkflowName, taskQueue, ReconcileInterval)
}

package workflows

import (
	"context"
	"errors"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// StartReservation starts the workflow of a placed reservation (workflow id
// = the reservation id) on taskQueue. It is idempotent: a running workflow
// is kept, and one that ran and finished is not started again.
func StartReservation(ctx context.Context, c client.Client, taskQueue string, p ReservationParams) error {
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       p.ReservationID,
		TaskQueue:                taskQueue,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, ReservationWorkflowName, p)
	var done *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &done) {
		return nil
	}
	return err
}

// The reconciler: a Temporal schedule runs ReconcileReservationsWorkflow
// every ReconcileInterval, whose one activity starts the workflows of
// placed reservations that have none (the API crashed between committing
// the placement and starting the workflow, and the caller never retried).
const (
	ReconcileReservationsWorkflowName = "ReconcileReservationsWorkflow"
	ReconcileReservationsScheduleID   = "reservations-reconciler"
	ActivityReconcile                 = "ReservationsReconcile"
	ReconcileInterval                 = time.Minute
)

// ReconcileReservationsWorkflow runs one reconciliation and answers how many
// workflows it started.
func ReconcileReservationsWorkflow(ctx workflow.Context) (int, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: ReconcileInterval,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
	})
	var started int
	err := workflow.ExecuteActivity(ctx, ActivityReconcile).Get(ctx, &started)
	return started, err
}

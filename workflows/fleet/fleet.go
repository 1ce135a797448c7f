// Package fleet holds FleetApplyWorkflow: one apply of a fleet plan, each
// change one activity that applies it and marks its row done, so a
// restarted run resumes at the first change the rows say is pending; and
// the reconciler that starts the workflow of every running apply.
package fleet

import (
	"context"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/fleet"
	"github.com/better-compute/better-compute/workflows/schedules"
)

// Register registers the apply workflow and its activities, a, under their
// persisted names.
func Register(r worker.Registry, a *activities.Fleet) {
	r.RegisterWorkflowWithOptions(FleetApplyWorkflow, workflow.RegisterOptions{Name: activities.WorkflowName})
	r.RegisterActivityWithOptions(a.FleetPending, activity.RegisterOptions{Name: activities.ActivityPending})
	r.RegisterActivityWithOptions(a.FleetApplyChange, activity.RegisterOptions{Name: activities.ActivityChange})
	r.RegisterActivityWithOptions(a.FleetFinish, activity.RegisterOptions{Name: activities.ActivityFinish})
	r.RegisterWorkflowWithOptions(ReconcileFleetAppliesWorkflow, workflow.RegisterOptions{Name: activities.ReconcileWorkflowName})
	r.RegisterActivityWithOptions(a.FleetReconcile, activity.RegisterOptions{Name: activities.ActivityReconcile})
}

// ReconcileInterval is how often the reconciler's schedule runs.
const ReconcileInterval = time.Minute

// ReconcileFleetAppliesWorkflow runs one reconciliation and answers how many
// applies' workflows it started (or kept).
func ReconcileFleetAppliesWorkflow(ctx workflow.Context) (int, error) {
	var a *activities.Fleet
	return schedules.Reconcile(ctx, a.FleetReconcile, ReconcileInterval)
}

// EnsureSchedule creates the reconciler's schedule on taskQueue unless it
// exists (one per namespace however many workers run).
func EnsureSchedule(ctx context.Context, c client.Client, taskQueue string) error {
	return schedules.EnsureEvery(ctx, c, activities.ReconcileScheduleID, activities.ReconcileWorkflowName, taskQueue, ReconcileInterval)
}

// maxChangesPerRun bounds one run's history (about 6 events a change).
const maxChangesPerRun = 500

// FleetApplyWorkflow applies the apply's pending changes in order and
// stops at the first one a domain refuses.
func FleetApplyWorkflow(ctx workflow.Context, applyID string) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, MaximumInterval: time.Minute},
	})
	var a *activities.Fleet
	var pending []int
	if err := workflow.ExecuteActivity(ctx, a.FleetPending, applyID).Get(ctx, &pending); err != nil {
		return err
	}
	for i, seq := range pending {
		// A large apply (every node's labels) continues as new, so its
		// history stays bounded: the rows say where it resumes.
		if i == maxChangesPerRun {
			return workflow.NewContinueAsNewError(ctx, activities.WorkflowName, applyID)
		}
		var refused string
		if err := workflow.ExecuteActivity(ctx, a.FleetApplyChange, applyID, seq).Get(ctx, &refused); err != nil {
			return err
		}
		if refused != "" {
			return nil
		}
	}
	return workflow.ExecuteActivity(ctx, a.FleetFinish, applyID).Get(ctx, nil)
}

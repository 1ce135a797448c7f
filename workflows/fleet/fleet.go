// Package fleet holds FleetApplyWorkflow: one apply of a fleet plan, each
// change one activity that applies it and marks its row done, so a
// restarted run resumes at the first change the rows say is pending.
package fleet

import (
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/fleet"
)

// Register registers the apply workflow and its activities, a, under their
// persisted names.
func Register(r worker.Registry, a *activities.Fleet) {
	r.RegisterWorkflowWithOptions(FleetApplyWorkflow, workflow.RegisterOptions{Name: activities.WorkflowName})
	r.RegisterActivityWithOptions(a.FleetPending, activity.RegisterOptions{Name: activities.ActivityPending})
	r.RegisterActivityWithOptions(a.FleetApplyChange, activity.RegisterOptions{Name: activities.ActivityChange})
	r.RegisterActivityWithOptions(a.FleetFinish, activity.RegisterOptions{Name: activities.ActivityFinish})
}

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
	for _, seq := range pending {
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

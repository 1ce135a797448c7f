// Package schedules creates the control plane's Temporal schedules: each
// domain's reconciler runs every interval as one schedule per namespace,
// however many workers ask for it at start.
package schedules

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// EnsureEvery creates schedule id, starting workflow (a workflow of that
// id) on taskQueue every interval, unless it exists.
func EnsureEvery(ctx context.Context, c client.Client, id, workflow, taskQueue string, every time.Duration) error {
	_, err := c.ScheduleClient().Create(ctx, client.ScheduleOptions{
		ID:   id,
		Spec: client.ScheduleSpec{Intervals: []client.ScheduleIntervalSpec{{Every: every}}},
		Action: &client.ScheduleWorkflowAction{
			ID:        id,
			Workflow:  workflow,
			TaskQueue: taskQueue,
		},
	})
	if errors.Is(err, temporal.ErrScheduleAlreadyRunning) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create schedule %s: %w", id, err)
	}
	return nil
}

// Reconcile runs one reconciliation, a reconciler schedule's workflow: the
// activity (which answers how many workflows it started), within every and
// tried at most three times, so a slow one never overlaps the next run.
func Reconcile(ctx workflow.Context, activity any, every time.Duration) (int, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: every,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
	})
	var n int
	err := workflow.ExecuteActivity(ctx, activity).Get(ctx, &n)
	return n, err
}

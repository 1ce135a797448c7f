// Package webhooks holds WebhookWorkflow, one per webhook, which sends its
// deliveries in order (activities.Webhooks.WebhookDeliver) and waits
// between steps, and the reconciler that keeps one running per live
// webhook.
package webhooks

import (
	"context"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/webhooks"
	"github.com/better-compute/better-compute/workflows/schedules"
)

// ReconcileInterval is how often the reconciler's schedule runs.
const ReconcileInterval = time.Minute

// stepsPerRun bounds one run's history (a step is an activity and a
// timer, about 11 events): past it the workflow continues as new.
const stepsPerRun = 100

// Register registers the workflow, the reconciler and their activities.
func Register(r worker.Registry, a *activities.Webhooks) {
	r.RegisterWorkflowWithOptions(WebhookWorkflow, workflow.RegisterOptions{Name: activities.WorkflowName})
	r.RegisterWorkflowWithOptions(ReconcileWebhooksWorkflow, workflow.RegisterOptions{Name: activities.ReconcileWorkflowName})
	r.RegisterActivityWithOptions(a.WebhookDeliver, activity.RegisterOptions{Name: activities.ActivityDeliver})
	r.RegisterActivityWithOptions(a.WebhooksReconcile, activity.RegisterOptions{Name: activities.ActivityReconcile})
}

// WebhookWorkflow delivers its webhook's events until the webhook is
// deleted. Everything is in the webhook's rows, so a run carries nothing
// to the next: it continues as new every stepsPerRun steps.
func WebhookWorkflow(ctx workflow.Context, p activities.Params) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		HeartbeatTimeout:    15 * time.Second, // an attempt times out at 10 s
		RetryPolicy:         &temporal.RetryPolicy{MaximumInterval: time.Minute},
	})
	var a *activities.Webhooks
	changed := workflow.GetSignalChannel(ctx, activities.SignalChanged)
	for step := 0; step < stepsPerRun; step++ {
		var s activities.Step
		if err := workflow.ExecuteActivity(ctx, a.WebhookDeliver, p).Get(ctx, &s); err != nil {
			return err
		}
		if s.Gone {
			return nil
		}
		if s.Wait <= 0 {
			continue
		}
		timer := workflow.NewTimerWithOptions(ctx, s.Wait, workflow.TimerOptions{Summary: "next delivery"})
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(timer, func(workflow.Future) {})
		sel.AddReceive(changed, func(c workflow.ReceiveChannel, _ bool) {
			for c.ReceiveAsync(nil) {
			}
		})
		sel.Select(ctx)
	}
	for changed.ReceiveAsync(nil) {
	}
	return workflow.NewContinueAsNewError(ctx, WebhookWorkflow, p)
}

// ReconcileWebhooksWorkflow runs one reconciliation.
func ReconcileWebhooksWorkflow(ctx workflow.Context) (int, error) {
	var a *activities.Webhooks
	return schedules.Reconcile(ctx, a.WebhooksReconcile, ReconcileInterval)
}

// EnsureSchedule creates the reconciler's schedule on taskQueue unless it
// exists.
func EnsureSchedule(ctx context.Context, c client.Client, taskQueue string) error {
	return schedules.EnsureEvery(ctx, c, activities.ReconcileScheduleID, activities.ReconcileWorkflowName, taskQueue, ReconcileInterval)
}

// Package health holds HealthCheck, the round trip through Temporal and a
// worker behind /healthz and system.selfCheck.
package health

import (
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/health"
)

// Register registers the health-check workflow and its activity, a, under
// their persisted names.
func Register(r worker.Registry, a *activities.Health) {
	r.RegisterWorkflowWithOptions(HealthCheck, workflow.RegisterOptions{Name: activities.WorkflowName})
	r.RegisterActivityWithOptions(a.HealthEcho, activity.RegisterOptions{Name: activities.ActivityEcho})
}

// HealthCheck proves a round trip through Temporal and a worker: the
// workflow runs one activity that echoes the nonce back.
func HealthCheck(ctx workflow.Context, nonce string) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 5 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
	})
	var a *activities.Health
	var echoed string
	err := workflow.ExecuteActivity(ctx, a.HealthEcho, nonce).Get(ctx, &echoed)
	return echoed, err
}

// Package workflows holds the Temporal workflow definitions, one file per
// workflow family. Workflows hold orchestration only; domain truth lives in
// PostgreSQL and is written by activities.
package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// HealthCheck proves a round trip through Temporal and a worker: the
// workflow runs one activity that echoes the nonce back. /healthz and
// system.selfCheck start it.
func HealthCheck(ctx workflow.Context, nonce string) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 5 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
	})
	var echoed string
	err := workflow.ExecuteActivity(ctx, "HealthEcho", nonce).Get(ctx, &echoed)
	return echoed, err
}

package lifecycle

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/core/nodes"
)

// maxBulkConcurrency bounds a bulk run's lifecycles in flight whatever its
// parameters say.
const maxBulkConcurrency = 16

// MetalBulkWorkflow runs the operations the API began on p.Nodes with at
// most p.Concurrency lifecycles in flight: it starts a node's lifecycle
// workflow when a slot is free and waits for its operation to end, then
// answers each node's result in p.Nodes' order.
func MetalBulkWorkflow(ctx workflow.Context, p activities.BulkParams) ([]activities.BulkResult, error) {
	limit := min(max(p.Concurrency, 1), maxBulkConcurrency)
	start := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumInterval: 30 * time.Second, MaximumAttempts: 10},
	})
	wait := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		// An operation ends by its deadline (the longest is deploying's);
		// the wait heartbeats, so a worker that dies hands it on.
		StartToCloseTimeout: 2 * time.Hour,
		HeartbeatTimeout:    30 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumInterval: 30 * time.Second},
	})
	var a *activities.Metal
	results := make([]activities.BulkResult, len(p.Nodes))
	running := 0
	for i, n := range p.Nodes {
		if err := workflow.Await(ctx, func() bool { return running < limit }); err != nil {
			return results, err
		}
		running++
		workflow.Go(ctx, func(ctx workflow.Context) {
			defer func() { running-- }()
			mp := activities.MetalParams{TenantID: p.TenantID, NodeID: n.NodeID, OpSeq: n.OpSeq}
			if err := workflow.ExecuteActivity(start, a.StartBulkNode, mp).Get(ctx, nil); err != nil {
				results[i] = activities.BulkResult{NodeID: n.NodeID, State: string(nodes.Failed), Error: err.Error()}
				return
			}
			var r activities.BulkResult
			if err := workflow.ExecuteActivity(wait, a.AwaitOutcome, mp).Get(ctx, &r); err != nil {
				r = activities.BulkResult{NodeID: n.NodeID, Error: err.Error()}
			}
			results[i] = r
		})
	}
	if err := workflow.Await(ctx, func() bool { return running == 0 }); err != nil {
		return results, err
	}
	return results, nil
}

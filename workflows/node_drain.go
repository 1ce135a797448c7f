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

// Drain modes: wait for the node's reservations to end, or release them.
const (
	DrainWait    = "wait"
	DrainRelease = "release"
)

// Names of the node drain workflow and its activities.
const (
	NodeDrainWorkflowName = "NodeDrainWorkflow"
	ActivityDrainStep     = "NodeDrainStep"
	ActivityMarkDrained   = "NodeMarkDrained"
)

// drainPoll is how often a waiting drain looks again.
const drainPoll = 30 * time.Second

// NodeDrainParams starts a NodeDrainWorkflow.
type NodeDrainParams struct {
	TenantID string
	NodeID   string
	Mode     string
}

// NodeDrainWorkflowID is the drain workflow's id for a node.
func NodeDrainWorkflowID(nodeID string) string { return nodeID + "/drain" }

// NodeDrainWorkflow drains one node: each step counts the reservations still
// holding its atoms (in release mode, after releasing the active ones and
// cancelling those not begun); at zero the node is marked drained. A step
// answering -1 means the drain was ended (nodes.uncordon): the workflow
// stops without marking anything.
func NodeDrainWorkflow(ctx workflow.Context, p NodeDrainParams) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		// A release step waits for reservation workflows' release updates.
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumInterval: time.Minute},
	})
	for {
		var left int
		if err := workflow.ExecuteActivity(ctx, ActivityDrainStep, p).Get(ctx, &left); err != nil {
			return "", err
		}
		switch {
		case left < 0:
			return "ended", nil
		case left == 0:
			var marked bool
			if err := workflow.ExecuteActivity(ctx, ActivityMarkDrained, p).Get(ctx, &marked); err != nil {
				return "", err
			}
			if marked {
				return "drained", nil
			}
			return "ended", nil
		}
		if err := workflow.Sleep(ctx, drainPoll); err != nil {
			return "", err
		}
	}
}

// StartNodeDrain starts the node's drain workflow unless one runs; a drain
// that finished earlier (the node was uncordoned and drained again) is
// started anew.
func StartNodeDrain(ctx context.Context, c client.Client, taskQueue string, p NodeDrainParams) error {
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       NodeDrainWorkflowID(p.NodeID),
		TaskQueue:                taskQueue,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, NodeDrainWorkflowName, p)
	var running *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &running) {
		return nil
	}
	return err
}

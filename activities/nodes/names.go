package nodes

import (
	"context"
	"errors"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
)

// Names of the node drain workflow and its activities. They are persisted
// in workflow histories and the API starts the drain by its name, so they
// never change.
const (
	NodeDrainWorkflowName = "NodeDrainWorkflow"
	ActivityDrainStep     = "NodeDrainStep"
	ActivityMarkDrained   = "NodeMarkDrained"
)

// Drain modes: wait for the node's reservations to end, or release them.
const (
	DrainWait    = "wait"
	DrainRelease = "release"
)

// NodeDrainParams starts a NodeDrainWorkflow; each of its activities takes
// them too.
type NodeDrainParams struct {
	TenantID string
	NodeID   string
	Mode     string
}

// NodeDrainWorkflowID is the drain workflow's id for a node.
func NodeDrainWorkflowID(nodeID string) string { return nodeID + "/drain" }

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

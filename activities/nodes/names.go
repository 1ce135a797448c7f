package nodes

import (
	"context"
	"errors"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/activities/visibility"
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

// DrainState is what a drain workflow answers the state query with: its
// mode and the reservations its last step found still holding the node's
// atoms (-1 before the first step).
type DrainState struct {
	Mode string `json:"mode"`
	Left int    `json:"left"`
}

// NodeDrainWorkflowID is the drain workflow's id for a node.
func NodeDrainWorkflowID(nodeID string) string { return nodeID + "/drain" }

// StartNodeDrain starts the node's drain workflow unless one runs; a drain
// that finished earlier (the node was uncordoned and drained again) is
// started anew.
//
// The run carries the TenantId and NodeId search attributes and a memo
// (activities/visibility), so operators find a node's drains in Temporal.
func StartNodeDrain(ctx context.Context, c client.Client, taskQueue string, p NodeDrainParams) error {
	fields := visibility.Fields{TenantID: p.TenantID, NodeID: p.NodeID}
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       NodeDrainWorkflowID(p.NodeID),
		TaskQueue:                taskQueue,
		TypedSearchAttributes:    fields.SearchAttributes(),
		Memo:                     fields.Memo("nodeDrain"),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, NodeDrainWorkflowName, p)
	var running *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &running) {
		return nil
	}
	return err
}

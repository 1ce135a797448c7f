package metal

import (
	"context"
	"errors"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/activities/visibility"
)

// StartLifecycle starts the lifecycle workflow of a node's operation p
// (workflow id MetalWorkflowID) on taskQueue. A running workflow is kept
// (a node runs one operation at a time: the run of an older op_seq ends
// itself once it sees the row moved on); one that closed is started again,
// so callers start only operations the row shows in flight. The workflow
// reads everything else from the row, so a repeated start is harmless.
func StartLifecycle(ctx context.Context, c client.Client, taskQueue string, p MetalParams) error {
	fields := visibility.Fields{TenantID: p.TenantID, NodeID: p.NodeID}
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       MetalWorkflowID(p.NodeID),
		TaskQueue:                taskQueue,
		TypedSearchAttributes:    fields.SearchAttributes(),
		Memo:                     fields.Memo("metal"),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, MetalWorkflowName, p)
	var running *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &running) {
		return nil
	}
	return err
}

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

// AbortLifecycle sends the running lifecycle workflow its abort update and
// waits for its answer (the node failed, reason aborted). lost reports
// that no workflow runs for the node (never started, or gone): the caller
// then fails the node itself.
func AbortLifecycle(ctx context.Context, c client.Client, nodeID, by string) (lost bool, err error) {
	h, err := c.UpdateWorkflow(visibility.WithCaller(ctx, by), client.UpdateWorkflowOptions{
		WorkflowID:   MetalWorkflowID(nodeID),
		UpdateName:   UpdateAbort,
		WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	var notFound *serviceerror.NotFound
	if errors.As(err, &notFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return false, h.Get(ctx, nil)
}

// StartBulk starts a bulk run (MetalBulkWorkflow, id BulkWorkflowID) of
// the operations the API began on p.Nodes; a run of the same id already
// running is kept.
func StartBulk(ctx context.Context, c client.Client, taskQueue, requestID string, p BulkParams) error {
	fields := visibility.Fields{TenantID: p.TenantID, PoolID: p.PoolID}
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       BulkWorkflowID(p.PoolID, requestID),
		TaskQueue:                taskQueue,
		TypedSearchAttributes:    fields.SearchAttributes(),
		Memo:                     fields.Memo("metalBulk"),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, MetalBulkWorkflowName, p)
	var running *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &running) {
		return nil
	}
	return err
}

package metal

import (
	"context"
	"errors"
	"fmt"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/better-compute/better-compute/activities/visibility"
)

// StartLifecycle starts the lifecycle workflow of a node's operation p
// (workflow id MetalWorkflowID) on taskQueue; its memo records the
// operation's opSeq. A run of this operation or a later one is kept. A
// running run of an earlier operation is one that finished its operation
// (the API begins an operation only once the row shows none in flight; the
// run still closes) or was superseded: its writes are fenced by op_seq, so
// it is terminated and this operation's run started, rather than left to
// end while the new operation waits for the reconciler. A closed id is
// started again. The workflow reads everything else from the row, so a
// repeated start is harmless.
func StartLifecycle(ctx context.Context, c client.Client, taskQueue string, p MetalParams) error {
	fields := visibility.Fields{TenantID: p.TenantID, NodeID: p.NodeID}
	memo := fields.Memo("metal")
	memo[memoOpSeq] = p.OpSeq
	opts := client.StartWorkflowOptions{
		ID:                       MetalWorkflowID(p.NodeID),
		TaskQueue:                taskQueue,
		TypedSearchAttributes:    fields.SearchAttributes(),
		Memo:                     memo,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		// Without it the SDK answers a running run as if it were started.
		WorkflowExecutionErrorWhenAlreadyStarted: true,
	}
	for range 3 {
		_, err := c.ExecuteWorkflow(ctx, opts, MetalWorkflowName, p)
		var running *serviceerror.WorkflowExecutionAlreadyStarted
		if !errors.As(err, &running) {
			return err
		}
		seq, err := runningOpSeq(ctx, c, opts.ID, running.RunId)
		if err != nil {
			return err
		}
		if seq >= p.OpSeq {
			return nil
		}
		err = c.TerminateWorkflow(ctx, opts.ID, running.RunId, fmt.Sprintf("superseded by operation %d", p.OpSeq))
		var gone *serviceerror.NotFound
		if err != nil && !errors.As(err, &gone) {
			return err
		}
	}
	return fmt.Errorf("metal: the lifecycle workflow of %s kept running another operation", p.NodeID)
}

// memoOpSeq is the memo field holding the operation a run serves.
const memoOpSeq = "opSeq"

// runningOpSeq is the opSeq a running lifecycle run serves (0 when its memo
// has none).
func runningOpSeq(ctx context.Context, c client.Client, id, runID string) (int64, error) {
	d, err := c.DescribeWorkflowExecution(ctx, id, runID)
	if err != nil {
		return 0, err
	}
	var seq int64
	if f := d.GetWorkflowExecutionInfo().GetMemo().GetFields()[memoOpSeq]; f != nil {
		if err := converter.GetDefaultDataConverter().FromPayload(f, &seq); err != nil {
			return 0, fmt.Errorf("metal: the memo of %s: %w", id, err)
		}
	}
	return seq, nil
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

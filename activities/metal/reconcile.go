package metal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/activity"

	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
)

// defaultOwedGrace is how long a start may be owed before the reconciler
// makes it: the API starts the workflow right after its commit, and this
// keeps the two from racing.
const defaultOwedGrace = 10 * time.Second

// reconcilePage bounds the rows one read of the reconciler takes.
const reconcilePage = 100

// ReconcileMetal makes every operation in flight have a running workflow, so no
// node is stranded in an in-flight state: it starts the workflows whose
// start is owed, starts again those of operations whose workflow is not
// running (terminated, cancelled, timed out, lost: a closed id may be
// started again), and fails, with reason workflowLost, operations past
// their deadline whose workflow is not running (there is nobody left to
// fail them). Nodes a running bulk run serves are left to it. It answers
// how many workflows it started and operations it failed.
func (m *Metal) ReconcileMetal(ctx context.Context) (int, error) {
	grace := m.OwedGrace
	if grace <= 0 {
		grace = defaultOwedGrace
	}
	acted := 0
	owed, err := m.Store.Owed(ctx, grace, reconcilePage)
	if err != nil {
		return acted, fmt.Errorf("list owed metal workflow starts: %w", err)
	}
	for _, op := range owed {
		n, err := m.reconcileOne(ctx, op, true)
		acted += n
		if err != nil {
			return acted, err
		}
	}
	after := ""
	for {
		page, err := m.Store.InFlight(ctx, after, grace, reconcilePage)
		if err != nil {
			return acted, fmt.Errorf("list metal operations in flight: %w", err)
		}
		if len(page) == 0 {
			return acted, nil
		}
		for _, op := range page {
			after = op.NodeID
			n, err := m.reconcileOne(ctx, op, false)
			acted += n
			if err != nil {
				return acted, err
			}
		}
	}
}

// reconcileOne starts or fails one operation whose workflow may be missing.
func (m *Metal) reconcileOne(ctx context.Context, op InFlight, owed bool) (int, error) {
	defer activity.RecordHeartbeat(ctx, op.NodeID)
	if bulk := bulkOf(op.OpArgs); bulk != "" {
		running, err := m.workflowRunning(ctx, bulk)
		if err != nil || running {
			return 0, err
		}
	}
	// A running workflow is left alone: it serves this operation (and
	// records its start itself), or it is an older operation's run that
	// ends on its own, after which the next pass starts this one.
	running, err := m.workflowRunning(ctx, MetalWorkflowID(op.NodeID))
	if err != nil || running {
		return 0, err
	}
	if !owed && !op.Deadline.IsZero() && time.Now().After(op.Deadline) {
		err := m.Store.Fail(ctx, Failure{TenantID: op.TenantID, NodeID: op.NodeID, OpSeq: op.OpSeq,
			Code: string(core.CodeUnavailable), Reason: coremetal.ReasonWorkflowLost,
			Message: fmt.Sprintf("the workflow of %s on %s stopped before it finished and its deadline passed", op.Operation, op.NodeID)})
		if errors.Is(err, ErrStale) {
			return 0, nil // it ended meanwhile
		}
		if err != nil {
			return 0, fmt.Errorf("fail the lost operation of %s: %w", op.NodeID, err)
		}
		activity.GetLogger(ctx).Warn("failed a metal operation whose workflow was lost past its deadline",
			"node", op.NodeID, "operation", op.Operation, "opSeq", op.OpSeq)
		return 1, nil
	}
	if err := StartLifecycle(ctx, m.Temporal, m.TaskQueue, op.MetalParams); err != nil {
		return 0, fmt.Errorf("start the lifecycle of %s: %w", op.NodeID, err)
	}
	if err := m.Store.MarkStarted(ctx, op.TenantID, op.NodeID, op.OpSeq); err != nil && !errors.Is(err, ErrStale) {
		return 1, fmt.Errorf("mark the lifecycle of %s started: %w", op.NodeID, err)
	}
	if !owed {
		activity.GetLogger(ctx).Warn("restarted a metal operation's workflow that was not running",
			"node", op.NodeID, "operation", op.Operation, "opSeq", op.OpSeq)
	}
	return 1, nil
}

// bulkOf is the bulk run an operation's args name, "" when none.
func bulkOf(args json.RawMessage) string {
	if len(args) == 0 {
		return ""
	}
	var b BulkArgs
	if json.Unmarshal(args, &b) != nil {
		return ""
	}
	return b.BulkID
}

// workflowRunning says whether the workflow id's latest run is running.
func (m *Metal) workflowRunning(ctx context.Context, id string) (bool, error) {
	desc, err := m.Temporal.DescribeWorkflowExecution(ctx, id, "")
	var gone *serviceerror.NotFound
	if errors.As(err, &gone) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("describe workflow %s: %w", id, err)
	}
	return desc.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, nil
}

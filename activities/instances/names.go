// Package instances holds the instance workflow's activities and the
// instances domain's Temporal contract: the workflow, signal, activity and
// schedule names (persisted in histories: they never change), the
// parameters, and the start and signal helpers the API, the agent
// gateway and the reconciler use.
package instances

import (
	"context"
	"errors"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/activities/visibility"
)

// The names.
const (
	InstanceWorkflowName = "InstanceWorkflow"
	// SignalDesiredChanged tells the workflow the API changed the
	// instance's desired state or flavor (start, stop, resize, delete).
	SignalDesiredChanged = "desired-changed"
	// SignalStatus tells the workflow its node reported the instance
	// (the agent gateway, after the report's commit).
	SignalStatus = "status"

	ActivityConverge         = "InstanceConverge"
	ActivityMarkFailed       = "InstanceMarkFailed"
	ActivityConvergeProvider = "InstanceConvergeProvider"

	// The reconciler: a Temporal schedule runs ReconcileInstancesWorkflow,
	// whose one activity starts the workflows of live instances whose start
	// was never recorded (the API crashed between its commit and the
	// start), starts again those whose run closed (terminated, cancelled,
	// lost), and sweeps stale drafts.
	ReconcileInstancesWorkflowName = "ReconcileInstancesWorkflow"
	ReconcileInstancesScheduleID   = "instances-reconciler"
	ActivityReconcile              = "InstancesReconcile"
)

// InstanceParams starts an InstanceWorkflow (workflow id = InstanceID).
type InstanceParams struct {
	TenantID   string
	InstanceID string
	PoolID     string
	// ConvergeBound bounds how long the instance may differ from its
	// desired state before it is marked failed (0: DefaultConvergeBound);
	// PollEvery is the fallback poll of the row (0: DefaultPollEvery).
	ConvergeBound time.Duration
	PollEvery     time.Duration
}

// Defaults of InstanceParams.
const (
	DefaultConvergeBound = 10 * time.Minute
	DefaultPollEvery     = 15 * time.Second
)

// Progress is what a convergence step answers the workflow.
type Progress struct {
	State   string
	Desired string
	Settled bool
	Done    bool
	// ConvergingFor is how long the state has differed from the desired
	// one, by the database's clock.
	ConvergingFor time.Duration
	ObservedError string
	Provider      bool
}

// MarkFailedParams marks an instance failed.
type MarkFailedParams struct {
	InstanceID, Reason, Message string
}

// StartInstance starts the workflow of a live instance on taskQueue. A
// running workflow is kept; one that closed is started again (a closed id
// may be started again), so callers start only instances whose row is
// live.
func StartInstance(ctx context.Context, c client.Client, taskQueue string, p InstanceParams) error {
	fields := visibility.Fields{TenantID: p.TenantID, PoolID: p.PoolID}
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       p.InstanceID,
		TaskQueue:                taskQueue,
		TypedSearchAttributes:    fields.SearchAttributes(),
		Memo:                     fields.Memo("instance"),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, InstanceWorkflowName, p)
	var done *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &done) {
		return nil
	}
	return err
}

// Signal tells the instance's workflow something changed, best effort: a
// workflow that is not running is the reconciler's to start, and a
// running one that misses the signal reads the row at its next poll.
func Signal(ctx context.Context, c client.Client, instanceID, signal string) error {
	err := c.SignalWorkflow(ctx, instanceID, "", signal, nil)
	var gone *serviceerror.NotFound
	if errors.As(err, &gone) {
		return nil
	}
	return err
}

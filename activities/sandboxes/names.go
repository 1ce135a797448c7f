// Package sandboxes holds the sandbox workflow's activities and the
// sandbox domain's Temporal contract: the workflow, signal, activity and
// schedule names (persisted in histories: they never change), the
// parameters, and the start and signal helpers the API and the
// reconciler use.
package sandboxes

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
	SandboxWorkflowName = "SandboxWorkflow"
	// SignalChanged tells the workflow the API changed the sandbox (its
	// deadline, a delete): it reads the row again.
	SignalChanged = "changed"

	ActivityStep = "SandboxStep"

	// A template's warm pool: SandboxWarmPoolWorkflow (id WarmPoolID) keeps
	// its warm workloads at the template's size; SignalChanged wakes it (a
	// claim, an update of the template).
	WarmPoolWorkflowName = "SandboxWarmPoolWorkflow"
	ActivityTopUp        = "SandboxWarmPoolTopUp"

	// The reconciler: a schedule runs ReconcileSandboxesWorkflow, whose one
	// activity starts the workflows of live sandboxes whose start was never
	// recorded or whose run closed, and sweeps stale drafts.
	ReconcileSandboxesWorkflowName = "ReconcileSandboxesWorkflow"
	ReconcileSandboxesScheduleID   = "sandboxes-reconciler"
	ActivityReconcile              = "SandboxesReconcile"
)

// SandboxParams starts a SandboxWorkflow (workflow id = SandboxID).
type SandboxParams struct {
	TenantID  string
	SandboxID string
	PoolID    string
	// PollEvery is how often a starting or deleting sandbox's row is read
	// (0: DefaultPollEvery); a running one is read at its deadline and at
	// least every SettledPoll (0: DefaultSettledPoll), to notice a
	// workload that went away.
	PollEvery   time.Duration
	SettledPoll time.Duration
}

// Defaults of SandboxParams.
const (
	DefaultPollEvery   = time.Second
	DefaultSettledPoll = 30 * time.Second
)

// Progress is what a step answers the workflow.
type Progress struct {
	Ended bool
	State string
	// UntilDeadline is how long until the deadline by the database's
	// clock (≤ 0: passed).
	UntilDeadline time.Duration
}

// StartSandbox starts the workflow of a live sandbox on taskQueue. A
// running workflow is kept; one that closed is started again.
func StartSandbox(ctx context.Context, c client.Client, taskQueue string, p SandboxParams) error {
	fields := visibility.Fields{TenantID: p.TenantID, PoolID: p.PoolID}
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       p.SandboxID,
		TaskQueue:                taskQueue,
		TypedSearchAttributes:    fields.SearchAttributes(),
		Memo:                     fields.Memo("sandbox"),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, SandboxWorkflowName, p)
	var done *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &done) {
		return nil
	}
	return err
}

// Signal tells the sandbox's workflow its row changed, best effort: a
// missed signal is read at the next step (the deadline is the row's).
func Signal(ctx context.Context, c client.Client, sandboxID string) error {
	err := c.SignalWorkflow(ctx, sandboxID, "", SignalChanged, nil)
	var gone *serviceerror.NotFound
	if errors.As(err, &gone) {
		return nil
	}
	return err
}

// WarmPoolID is the workflow id of a template's warm pool.
func WarmPoolID(templateID string) string { return templateID + "/warm" }

// WarmPoolParams starts a SandboxWarmPoolWorkflow.
type WarmPoolParams struct {
	TenantID, TemplateID, PoolID string
	// PollEvery is how often the pool is topped up without a signal (0:
	// DefaultSettledPoll).
	PollEvery time.Duration
}

// WarmProgress is what a top-up did.
type WarmProgress struct {
	Placed, Deleted int
	Refused         string
	Ended           bool
}

// StartWarmPool starts the template's warm pool workflow (kept when
// running) and signals it, so a running one tops up at once.
func StartWarmPool(ctx context.Context, c client.Client, taskQueue string, p WarmPoolParams) error {
	fields := visibility.Fields{TenantID: p.TenantID, PoolID: p.PoolID}
	_, err := c.SignalWithStartWorkflow(ctx, WarmPoolID(p.TemplateID), SignalChanged, nil, client.StartWorkflowOptions{
		ID:                       WarmPoolID(p.TemplateID),
		TaskQueue:                taskQueue,
		TypedSearchAttributes:    fields.SearchAttributes(),
		Memo:                     fields.Memo("sandbox-template"),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, WarmPoolWorkflowName, p)
	return err
}

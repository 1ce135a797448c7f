// Package cloudresources holds the cloud-resource workflow's activities
// and the domain's Temporal contract: the workflow, signal, activity and
// schedule names (persisted in histories: they never change), the
// parameters, the start and signal helpers the API and the reconciler
// use, and the opening of a provider account's resources.
package cloudresources

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
	ResourceWorkflowName = "CloudResourceWorkflow"
	// SignalChanged tells the workflow the tenant changed the resource
	// (create, update, delete, release, adopt): reconcile at once.
	SignalChanged = "changed"

	ActivityReconcile = "CloudResourceReconcile"

	// The reconciler's schedule starts the workflows of live resources
	// whose start was never recorded, starts again those whose run closed
	// (terminated, cancelled, lost) and sweeps stale drafts.
	ReconcileWorkflowName = "ReconcileCloudResourcesWorkflow"
	ReconcileScheduleID   = "cloud-resources-reconciler"
	ActivityReconcileAll  = "CloudResourcesReconcileAll"
)

// The waits of the spec: resources still converging are looked at every
// 30 seconds; ready and failed ones are refreshed every five minutes.
const (
	DefaultConvergingEvery = 30 * time.Second
	DefaultSettledEvery    = 5 * time.Minute
)

// ResourceParams starts a CloudResourceWorkflow (workflow id = ResourceID).
type ResourceParams struct {
	TenantID   string
	ResourceID string
	PoolID     string
	// ConvergingEvery and SettledEvery override the waits (0: the
	// defaults), so tests do not wait on them.
	ConvergingEvery time.Duration
	SettledEvery    time.Duration
}

// Progress is what one reconciliation answers the workflow; it never
// holds a value of the provider's (no output, no secret).
type Progress struct {
	State string
	// Converging: the resource is not where the tenant wants it yet.
	Converging bool
	// Done: the resource ended (deleted, released); the workflow ends.
	Done bool
}

// StartResource starts the workflow of a live resource on taskQueue with
// the waits of tuning. A running workflow is kept; one that closed is
// started again.
func StartResource(ctx context.Context, c client.Client, taskQueue string, p ResourceParams) error {
	fields := visibility.Fields{TenantID: p.TenantID, PoolID: p.PoolID}
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       p.ResourceID,
		TaskQueue:                taskQueue,
		TypedSearchAttributes:    fields.SearchAttributes(),
		Memo:                     fields.Memo("cloud-resource"),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, ResourceWorkflowName, p)
	var done *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &done) {
		return nil
	}
	return err
}

// Signal asks the resource's workflow to reconcile now, best effort: a
// workflow that is not running is the reconciler's to start, and a
// running one that misses the signal reconciles at its next wait's end.
func Signal(ctx context.Context, c client.Client, resourceID string) error {
	err := c.SignalWorkflow(ctx, resourceID, "", SignalChanged, nil)
	var gone *serviceerror.NotFound
	if errors.As(err, &gone) {
		return nil
	}
	return err
}

package lifecycle

import (
	"context"
	"github.com/better-compute/better-compute/workflows/schedules"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/metal"
)

// Register registers the lifecycle, bulk and reconciler workflows and the
// control-plane activities, a, under their persisted names. The site
// activities are `bcd site`'s (metal.RegisterAgent).
func Register(r worker.Registry, a *activities.Metal) {
	r.RegisterWorkflowWithOptions(MetalLifecycleWorkflow, workflow.RegisterOptions{Name: activities.MetalWorkflowName})
	r.RegisterWorkflowWithOptions(MetalBulkWorkflow, workflow.RegisterOptions{Name: activities.MetalBulkWorkflowName})
	r.RegisterWorkflowWithOptions(ReconcileMetalWorkflow, workflow.RegisterOptions{Name: activities.ReconcileMetalWorkflowName})
	for name, fn := range map[string]any{
		activities.ActivityLoad:             a.LoadLifecycle,
		activities.ActivityMarkStarted:      a.MarkLifecycleStarted,
		activities.ActivitySetStep:          a.SetStep,
		activities.ActivityFinish:           a.FinishOperation,
		activities.ActivityFail:             a.FailOperation,
		activities.ActivitySetPower:         a.RecordPower,
		activities.ActivityNewBoot:          a.NewBoot,
		activities.ActivityBootProgress:     a.BootProgress,
		activities.ActivityCloseBoot:        a.CloseBoot,
		activities.ActivityIngestInspection: a.IngestInspection,
		activities.ActivityCheckRejoin:      a.CheckRejoin,
		activities.ActivityRevokeIdentities: a.RevokeIdentities,
		activities.ActivityStartNode:        a.StartBulkNode,
		activities.ActivityAwaitOutcome:     a.AwaitOutcome,
		activities.ActivityReconcile:        a.ReconcileMetal,
		// The provisioning steps (StepProvision).
		activities.ActivityLoadWorkflow:       a.LoadWorkflow,
		activities.ActivityBeginStep:          a.BeginStep,
		activities.ActivityEndStep:            a.EndStep,
		activities.ActivityCheckImage:         a.CheckImage,
		activities.ActivityAccept:             a.Accept,
		activities.ActivityEnqueueNodeCommand: a.EnqueueNodeCommand,
		activities.ActivityNodeCommand:        a.NodeCommand,
		activities.ActivityHandRamdiskStep:    a.HandRamdiskStep,
	} {
		r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
}

// ReconcileInterval is how often the reconciler's schedule runs.
const ReconcileInterval = time.Minute

// ReconcileMetalWorkflow runs one reconciliation (activities.Metal.Reconcile)
// and answers how many workflows it started or operations it failed.
func ReconcileMetalWorkflow(ctx workflow.Context) (int, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: ReconcileInterval,
		HeartbeatTimeout:    20 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 3},
	})
	var a *activities.Metal
	var n int
	err := workflow.ExecuteActivity(ctx, a.ReconcileMetal).Get(ctx, &n)
	return n, err
}

// EnsureSchedule creates the reconciler's schedule (metal-reconciler),
// running on taskQueue, unless it exists.
func EnsureSchedule(ctx context.Context, c client.Client, taskQueue string) error {
	return schedules.EnsureEvery(ctx, c, activities.ReconcileMetalScheduleID, activities.ReconcileMetalWorkflowName, taskQueue, ReconcileInterval)
}

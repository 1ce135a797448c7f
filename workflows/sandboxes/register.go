package sandboxes

import (
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/sandboxes"
)

// Register registers the sandbox workflow, the reconciler and their
// activities, a, under their persisted names.
func Register(r worker.Registry, a *activities.Sandboxes) {
	r.RegisterWorkflowWithOptions(SandboxWorkflow, workflow.RegisterOptions{Name: activities.SandboxWorkflowName})
	r.RegisterWorkflowWithOptions(ReconcileSandboxesWorkflow, workflow.RegisterOptions{Name: activities.ReconcileSandboxesWorkflowName})
	r.RegisterWorkflowWithOptions(SandboxWarmPoolWorkflow, workflow.RegisterOptions{Name: activities.WarmPoolWorkflowName})
	r.RegisterActivityWithOptions(a.Step, activity.RegisterOptions{Name: activities.ActivityStep})
	r.RegisterActivityWithOptions(a.TopUpWarmPool, activity.RegisterOptions{Name: activities.ActivityTopUp})
	r.RegisterActivityWithOptions(a.ReconcileSandboxes, activity.RegisterOptions{Name: activities.ActivityReconcile})
}

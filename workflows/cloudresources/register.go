package cloudresources

import (
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/cloudresources"
)

// Register registers the resource workflow, the reconciler and their
// activities, a, under their persisted names.
func Register(r worker.Registry, a *activities.Resources) {
	r.RegisterWorkflowWithOptions(ResourceWorkflow, workflow.RegisterOptions{Name: activities.ResourceWorkflowName})
	r.RegisterWorkflowWithOptions(ReconcileResourcesWorkflow, workflow.RegisterOptions{Name: activities.ReconcileWorkflowName})
	r.RegisterActivityWithOptions(a.ReconcileResource, activity.RegisterOptions{Name: activities.ActivityReconcile})
	r.RegisterActivityWithOptions(a.ReconcileResources, activity.RegisterOptions{Name: activities.ActivityReconcileAll})
}

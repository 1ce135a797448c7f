package instances

import (
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/instances"
)

// Register registers the instance workflow, the reconciler and their
// activities, a, under their persisted names.
func Register(r worker.Registry, a *activities.Instances) {
	r.RegisterWorkflowWithOptions(InstanceWorkflow, workflow.RegisterOptions{Name: activities.InstanceWorkflowName})
	r.RegisterWorkflowWithOptions(ReconcileInstancesWorkflow, workflow.RegisterOptions{Name: activities.ReconcileInstancesWorkflowName})
	r.RegisterActivityWithOptions(a.ConvergeInstance, activity.RegisterOptions{Name: activities.ActivityConverge})
	r.RegisterActivityWithOptions(a.MarkInstanceFailed, activity.RegisterOptions{Name: activities.ActivityMarkFailed})
	r.RegisterActivityWithOptions(a.ConvergeInstanceProvider, activity.RegisterOptions{Name: activities.ActivityConvergeProvider})
	r.RegisterActivityWithOptions(a.ReconcileInstances, activity.RegisterOptions{Name: activities.ActivityReconcile})
}

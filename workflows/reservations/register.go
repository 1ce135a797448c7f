package reservations

import (
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/reservations"
)

// Register registers the reservation workflow, the reconciler and their
// activities, a, under their persisted names. The workflows call the
// activities by method value; the worker resolves each to the name it was
// registered with here.
func Register(r worker.Registry, a *activities.Reservations) {
	r.RegisterWorkflowWithOptions(ReservationWorkflow, workflow.RegisterOptions{Name: activities.ReservationWorkflowName})
	r.RegisterWorkflowWithOptions(ReconcileReservationsWorkflow,
		workflow.RegisterOptions{Name: activities.ReconcileReservationsWorkflowName})
	r.RegisterActivityWithOptions(a.Bind, activity.RegisterOptions{Name: activities.ActivityBind})
	r.RegisterActivityWithOptions(a.BindStatus, activity.RegisterOptions{Name: activities.ActivityBindStatus})
	r.RegisterActivityWithOptions(a.FailBinding, activity.RegisterOptions{Name: activities.ActivityFailBinding})
	r.RegisterActivityWithOptions(a.MarkActive, activity.RegisterOptions{Name: activities.ActivityMarkActive})
	r.RegisterActivityWithOptions(a.Expire, activity.RegisterOptions{Name: activities.ActivityExpire})
	r.RegisterActivityWithOptions(a.Release, activity.RegisterOptions{Name: activities.ActivityRelease})
	r.RegisterActivityWithOptions(a.ReleaseLapsed, activity.RegisterOptions{Name: activities.ActivityReleaseLapsed})
	r.RegisterActivityWithOptions(a.State, activity.RegisterOptions{Name: activities.ActivityState})
	r.RegisterActivityWithOptions(a.Reconcile, activity.RegisterOptions{Name: activities.ActivityReconcile})
}

package workers

import (
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/better-compute/better-compute/activities"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/workflows"
)

// Deps are what the control-plane activities need.
type Deps struct {
	Store *store.Store
}

// NewControlPlane builds the worker of the control-plane task queue with
// every workflow and activity that runs there. Start it with Run or Start.
func NewControlPlane(c client.Client, deps Deps) worker.Worker {
	w := worker.New(c, ControlPlaneQueue, worker.Options{})
	w.RegisterWorkflowWithOptions(workflows.HealthCheck, workflow.RegisterOptions{Name: "HealthCheck"})
	w.RegisterActivityWithOptions((&activities.Health{Store: deps.Store}).HealthEcho, activity.RegisterOptions{Name: "HealthEcho"})
	w.RegisterWorkflowWithOptions(workflows.ReservationWorkflow, workflow.RegisterOptions{Name: workflows.ReservationWorkflowName})
	res := &activities.Reservations{Store: deps.Store}
	w.RegisterActivityWithOptions(res.MarkActive, activity.RegisterOptions{Name: workflows.ActivityMarkActive})
	w.RegisterActivityWithOptions(res.Expire, activity.RegisterOptions{Name: workflows.ActivityExpire})
	w.RegisterActivityWithOptions(res.Release, activity.RegisterOptions{Name: workflows.ActivityRelease})
	return w
}

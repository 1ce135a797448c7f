package workers

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
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
	w.RegisterWorkflowWithOptions(workflows.SiteHealthWorkflow, workflow.RegisterOptions{Name: workflows.SiteHealthWorkflowName})
	w.RegisterActivityWithOptions((&activities.Health{Store: deps.Store}).HealthEcho, activity.RegisterOptions{Name: "HealthEcho"})
	w.RegisterWorkflowWithOptions(workflows.ReservationWorkflow, workflow.RegisterOptions{Name: workflows.ReservationWorkflowName})
	res := &activities.Reservations{Store: deps.Store, Temporal: c, TaskQueue: ControlPlaneQueue}
	w.RegisterActivityWithOptions(res.Bind, activity.RegisterOptions{Name: workflows.ActivityBind})
	w.RegisterActivityWithOptions(res.BindStatus, activity.RegisterOptions{Name: workflows.ActivityBindStatus})
	w.RegisterActivityWithOptions(res.FailBinding, activity.RegisterOptions{Name: workflows.ActivityFailBinding})
	w.RegisterActivityWithOptions(res.MarkActive, activity.RegisterOptions{Name: workflows.ActivityMarkActive})
	w.RegisterActivityWithOptions(res.Expire, activity.RegisterOptions{Name: workflows.ActivityExpire})
	w.RegisterActivityWithOptions(res.Release, activity.RegisterOptions{Name: workflows.ActivityRelease})
	w.RegisterWorkflowWithOptions(workflows.ReconcileReservationsWorkflow,
		workflow.RegisterOptions{Name: workflows.ReconcileReservationsWorkflowName})
	w.RegisterActivityWithOptions(res.Reconcile, activity.RegisterOptions{Name: workflows.ActivityReconcile})
	w.RegisterWorkflowWithOptions(workflows.NodeDrainWorkflow, workflow.RegisterOptions{Name: workflows.NodeDrainWorkflowName})
	drain := &activities.Nodes{Store: deps.Store, Temporal: c}
	w.RegisterActivityWithOptions(drain.DrainStep, activity.RegisterOptions{Name: workflows.ActivityDrainStep})
	w.RegisterActivityWithOptions(drain.MarkDrained, activity.RegisterOptions{Name: workflows.ActivityMarkDrained})
	return w
}

// EnsureSchedules creates the control plane's Temporal schedules unless they
// exist: the reservations reconciler. Every worker calls it at start; the
// schedule's id makes it one per namespace however many workers run.
func EnsureSchedules(ctx context.Context, c client.Client) error {
	_, err := c.ScheduleClient().Create(ctx, client.ScheduleOptions{
		ID:   workflows.ReconcileReservationsScheduleID,
		Spec: client.ScheduleSpec{Intervals: []client.ScheduleIntervalSpec{{Every: workflows.ReconcileInterval}}},
		Action: &client.ScheduleWorkflowAction{
			ID:        workflows.ReconcileReservationsScheduleID,
			Workflow:  workflows.ReconcileReservationsWorkflowName,
			TaskQueue: ControlPlaneQueue,
		},
	})
	if errors.Is(err, temporal.ErrScheduleAlreadyRunning) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create schedule %s: %w", workflows.ReconcileReservationsScheduleID, err)
	}
	return nil
}

// Package nodes holds NodeDrainWorkflow, which drains one node. Its
// activities, names and parameters are in activities/nodes.
package nodes

import (
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/nodes"
	"github.com/better-compute/better-compute/activities/visibility"
)

// drainPoll is how often a waiting drain looks again.
const drainPoll = 30 * time.Second

// Register registers the drain workflow and its activities, a, under their
// persisted names.
func Register(r worker.Registry, a *activities.Nodes) {
	r.RegisterWorkflowWithOptions(NodeDrainWorkflow, workflow.RegisterOptions{Name: activities.NodeDrainWorkflowName})
	r.RegisterActivityWithOptions(a.DrainStep, activity.RegisterOptions{Name: activities.ActivityDrainStep})
	r.RegisterActivityWithOptions(a.MarkDrained, activity.RegisterOptions{Name: activities.ActivityMarkDrained})
}

// NodeDrainWorkflow drains one node: each step counts the reservations still
// holding its atoms (in release mode, after releasing the active ones and
// cancelling those not begun); at zero the node is marked drained. A step
// answering -1 means the drain was ended (nodes.uncordon): the workflow
// stops without marking anything. Its state query (visibility.QueryState)
// answers how many reservations the last step found.
func NodeDrainWorkflow(ctx workflow.Context, p activities.NodeDrainParams) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		// A release step waits for reservation workflows' release updates.
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumInterval: time.Minute},
	})
	var a *activities.Nodes
	left := -1 // not counted yet
	if err := workflow.SetQueryHandler(ctx, visibility.QueryState, func() (activities.DrainState, error) {
		return activities.DrainState{Mode: p.Mode, Left: left}, nil
	}); err != nil {
		return "", err
	}
	for {
		if err := workflow.ExecuteActivity(ctx, a.DrainStep, p).Get(ctx, &left); err != nil {
			return "", err
		}
		switch {
		case left < 0:
			return "ended", nil
		case left == 0:
			var marked bool
			if err := workflow.ExecuteActivity(ctx, a.MarkDrained, p).Get(ctx, &marked); err != nil {
				return "", err
			}
			if marked {
				return "drained", nil
			}
			return "ended", nil
		}
		// A timer as Sleep's, with a summary for the UI.
		if err := workflow.NewTimerWithOptions(ctx, drainPoll, workflow.TimerOptions{Summary: "drain poll"}).Get(ctx, nil); err != nil {
			return "", err
		}
	}
}

// Package stepping is the loop of workflows whose state is all in rows
// (rollouts, command batches): run one step activity, then wait a poll
// interval or less when the API signals a change, and continue as new
// before the history grows unbounded.
package stepping

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/better-compute/better-compute/activities/visibility"
)

// Outcome is what one step asks of the loop.
type Outcome struct {
	Done   bool // the work is over: the workflow returns
	NewRun bool // continue as new now (a new wave begins)
}

// Loop runs step until it is done. After a step that is neither done nor
// asks for a new run it waits every, or until signal arrives. After
// maxSteps steps, or when a step asks for it, it answers continueAsNew()
// having first drained the signals not yet read (the next run reads the
// rows anyway, and a signal left unread would be lost).
func Loop(ctx workflow.Context, every time.Duration, signal string, maxSteps int,
	step func(workflow.Context) (Outcome, error), continueAsNew func() error) error {
	changed := workflow.GetSignalChannel(ctx, signal)
	for n := 0; ; n++ {
		o, err := step(ctx)
		switch {
		case err != nil:
			return err
		case o.Done:
			return nil
		case o.NewRun || n+1 >= maxSteps:
			for changed.ReceiveAsync(nil) {
			}
			return continueAsNew()
		}
		timer := workflow.NewTimerWithOptions(ctx, every, workflow.TimerOptions{Summary: "poll"})
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(timer, func(workflow.Future) {})
		sel.AddReceive(changed, func(c workflow.ReceiveChannel, _ bool) {
			for c.ReceiveAsync(nil) {
			}
		})
		sel.Select(ctx)
	}
}

// Run is such a workflow's body: it runs the activity step with p (a
// two-minute attempt, retried) through Loop until outcome says done, and
// answers the last step's state, which its state query
// (visibility.QueryState) answers meanwhile. self is the workflow, which
// continues as new with p.
func Run[P, S any](ctx workflow.Context, every time.Duration, signal string, maxSteps int, step any, p P,
	outcome func(S) Outcome, self any) (S, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumInterval: time.Minute},
	})
	var state S
	if err := workflow.SetQueryHandler(ctx, visibility.QueryState, func() (S, error) { return state, nil }); err != nil {
		return state, err
	}
	err := Loop(ctx, every, signal, maxSteps, func(ctx workflow.Context) (Outcome, error) {
		err := workflow.ExecuteActivity(ctx, step, p).Get(ctx, &state)
		return outcome(state), err
	}, func() error { return workflow.NewContinueAsNewError(ctx, self, p) })
	return state, err
}

package sandboxes

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/testsuite"

	activities "github.com/better-compute/better-compute/activities/sandboxes"
)

// fakeRow is a sandbox row whose deadline only the test moves (as only
// sandboxes.extend does); Step ends it once the clock passes the deadline,
// as store/sandboxes.Step does.
type fakeRow struct {
	env      *testsuite.TestWorkflowEnvironment
	deadline time.Time
	endedAt  time.Time
	steps    int
}

func (r *fakeRow) step(context.Context, string) (activities.Progress, error) {
	r.steps++
	now := r.env.Now()
	if !r.endedAt.IsZero() || !now.Before(r.deadline) {
		if r.endedAt.IsZero() {
			r.endedAt = now
		}
		return activities.Progress{Ended: true, State: "deleted"}, nil
	}
	return activities.Progress{State: "live", UntilDeadline: r.deadline.Sub(now)}, nil
}

// The workflow ends the sandbox at the row's deadline, not the one it
// first read: an extend signalled mid-way moves the end, a missed signal
// is found when the timer fires at the old deadline, and a long deadline
// is waited on in bounded timers (no busy polling).
func TestSandboxWorkflowEndsAtTheRowsDeadline(t *testing.T) {
	cases := []struct {
		name   string
		signal bool
	}{{"signalled", true}, {"signal lost", false}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var suite testsuite.WorkflowTestSuite
			env := suite.NewTestWorkflowEnvironment()
			start := env.Now()
			row := &fakeRow{env: env, deadline: start.Add(10 * time.Minute)}
			a := &activities.Sandboxes{}
			Register(env, a)
			env.OnActivity(a.Step, mock.Anything, mock.Anything).Return(row.step)
			env.RegisterDelayedCallback(func() {
				row.deadline = start.Add(25 * time.Minute) // sandboxes.extend
				if c.signal {
					env.SignalWorkflow(activities.SignalChanged, nil)
				}
			}, time.Minute)
			env.ExecuteWorkflow(SandboxWorkflow, activities.SandboxParams{SandboxID: "sbx_x", SettledPoll: 30 * time.Second})
			if err := env.GetWorkflowError(); err != nil {
				t.Fatal(err)
			}
			if got := row.endedAt.Sub(start); got < 25*time.Minute || got > 25*time.Minute+time.Second {
				t.Fatalf("ended %s after the start, want at the extended deadline (25m)", got)
			}
			// 25 minutes in steps of at most 30 s, plus the signal's round.
			if row.steps > 25*2+3 {
				t.Fatalf("%d steps: the workflow polls more than its settled poll", row.steps)
			}
		})
	}
}

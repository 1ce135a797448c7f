package workflows

import (
	"context"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
)

func TestNodeDrainWaitsThenMarksDrained(t *testing.T) {
	for _, tc := range []struct {
		name   string
		steps  []int
		marked bool
		want   string
		polls  int
	}{
		{"drained after two polls", []int{2, 1, 0}, true, "drained", 2},
		{"uncordoned meanwhile", []int{1, -1}, false, "ended", 1},
		{"uncordoned before the mark", []int{0}, false, "ended", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s testsuite.WorkflowTestSuite
			env := s.NewTestWorkflowEnvironment()
			env.SetStartTime(t0)
			step := 0
			var at []time.Time
			env.RegisterActivityWithOptions(func(_ context.Context, p NodeDrainParams) (int, error) {
				at = append(at, env.Now())
				step++
				return tc.steps[step-1], nil
			}, activity.RegisterOptions{Name: ActivityDrainStep})
			env.RegisterActivityWithOptions(func(_ context.Context, p NodeDrainParams) (bool, error) {
				return tc.marked, nil
			}, activity.RegisterOptions{Name: ActivityMarkDrained})
			env.ExecuteWorkflow(NodeDrainWorkflow, NodeDrainParams{TenantID: "t_1", NodeID: "node_1", Mode: DrainWait})
			var got string
			if err := env.GetWorkflowResult(&got); err != nil || got != tc.want {
				t.Fatalf("result = %q, %v; want %q", got, err, tc.want)
			}
			if step != len(tc.steps) || !at[len(at)-1].Equal(t0.Add(time.Duration(tc.polls)*drainPoll)) {
				t.Fatalf("%d steps, the last at %v", step, at[len(at)-1])
			}
		})
	}
}

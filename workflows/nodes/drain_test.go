package nodes

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/testsuite"

	activities "github.com/better-compute/better-compute/activities/nodes"
	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/internal/temporaltest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

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
			Register(env, &activities.Nodes{})
			env.OnActivity(activities.ActivityDrainStep, mock.Anything, mock.Anything).Return(func(_ context.Context, p activities.NodeDrainParams) (int, error) {
				at = append(at, env.Now())
				step++
				return tc.steps[step-1], nil
			})
			env.OnActivity(activities.ActivityMarkDrained, mock.Anything, mock.Anything).Return(func(_ context.Context, p activities.NodeDrainParams) (bool, error) {
				return tc.marked, nil
			})
			env.ExecuteWorkflow(NodeDrainWorkflow, activities.NodeDrainParams{TenantID: "t_1", NodeID: "node_1", Mode: activities.DrainWait})
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

func TestRegisterKeepsThePersistedNames(t *testing.T) {
	r := temporaltest.NewRegistry()
	Register(r, &activities.Nodes{})
	if want := []string{"NodeDrainWorkflow"}; !slices.Equal(r.Workflows, want) {
		t.Errorf("workflows = %q, want %q", r.Workflows, want)
	}
	want := map[string]string{"NodeDrainStep": "DrainStep", "NodeMarkDrained": "MarkDrained"}
	if len(r.Activities) != len(want) || !maps.Equal(r.Methods, want) {
		t.Errorf("activities = %q (%v), want %v", r.Activities, r.Methods, want)
	}
	if got := activities.NodeDrainWorkflowID("node_1"); got != "node_1/drain" {
		t.Errorf("drain workflow id = %q", got)
	}
}

// Between steps, the state query says how many reservations the last one
// found on the node.
func TestNodeDrainStateQuery(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.SetStartTime(t0)
	Register(env, &activities.Nodes{})
	steps := []int{3, 0}
	env.OnActivity(activities.ActivityDrainStep, mock.Anything, mock.Anything).Return(func(context.Context, activities.NodeDrainParams) (int, error) {
		left := steps[0]
		steps = steps[1:]
		return left, nil
	})
	env.OnActivity(activities.ActivityMarkDrained, mock.Anything, mock.Anything).Return(true, nil)
	var between activities.DrainState
	env.RegisterDelayedCallback(func() {
		v, err := env.QueryWorkflow(visibility.QueryState)
		if err == nil {
			err = v.Get(&between)
		}
		if err != nil {
			t.Errorf("state query: %v", err)
		}
	}, drainPoll/2)
	env.ExecuteWorkflow(NodeDrainWorkflow, activities.NodeDrainParams{TenantID: "t_1", NodeID: "node_1", Mode: activities.DrainRelease})
	if between != (activities.DrainState{Mode: activities.DrainRelease, Left: 3}) {
		t.Fatalf("state between the steps = %+v", between)
	}
}

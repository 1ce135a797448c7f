package sites

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"

	"github.com/better-compute/better-compute/internal/temporaltest"
)

func TestSiteHealthRunsOnTheSiteQueue(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name    string
		in      SiteHealthInput
		health  func(context.Context, string) (SiteHealth, error)
		want    SiteHealth
		wantErr bool
	}{
		{"the agent answers", SiteHealthInput{SiteID: "site_1"}, func(_ context.Context, id string) (SiteHealth, error) {
			return SiteHealth{SiteID: id, Holder: "h1", Epoch: 3, Time: at}, nil
		}, SiteHealth{SiteID: "site_1", Holder: "h1", Epoch: 3, Time: at}, false},
		{"the agent fails", SiteHealthInput{SiteID: "site_1"}, func(context.Context, string) (SiteHealth, error) {
			return SiteHealth{}, errors.New("lease lost")
		}, SiteHealth{}, true},
		{"no site", SiteHealthInput{}, nil, SiteHealth{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s testsuite.WorkflowTestSuite
			env := s.NewTestWorkflowEnvironment()
			if c.health != nil {
				env.RegisterActivityWithOptions(c.health, activity.RegisterOptions{Name: ActivitySiteHealth})
			}
			var queues []string
			env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
				queues = append(queues, info.TaskQueue)
			})
			env.ExecuteWorkflow(SiteHealthWorkflow, c.in)
			if !env.IsWorkflowCompleted() {
				t.Fatal("workflow did not complete")
			}
			if err := env.GetWorkflowError(); (err != nil) != c.wantErr {
				t.Fatalf("workflow error = %v, want error %v", err, c.wantErr)
			}
			for _, q := range queues {
				if q != "site-site_1" {
					t.Fatalf("activity ran on %q, want site-site_1", q)
				}
			}
			if c.wantErr {
				return
			}
			var got SiteHealth
			if err := env.GetWorkflowResult(&got); err != nil || got != c.want {
				t.Fatalf("result = %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

func TestRegisterKeepsThePersistedNames(t *testing.T) {
	r := temporaltest.NewRegistry()
	Register(r)
	if want := []string{"SiteHealthWorkflow"}; !slices.Equal(r.Workflows, want) || len(r.Activities) != 0 {
		t.Errorf("control plane: workflows = %q, activities = %q; want %q and none", r.Workflows, r.Activities, want)
	}
	agent := temporaltest.NewRegistry()
	RegisterAgent(agent, func(context.Context, string) (SiteHealth, error) { return SiteHealth{}, nil })
	if want := []string{"SiteHealth"}; !slices.Equal(agent.Activities, want) || len(agent.Workflows) != 0 {
		t.Errorf("site agent: activities = %q, workflows = %q; want %q and none", agent.Activities, agent.Workflows, want)
	}
	if got := SiteTaskQueue("site_1"); got != "site-site_1" {
		t.Errorf("site task queue = %q", got)
	}
}

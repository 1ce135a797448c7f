package health

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/testsuite"

	activities "github.com/better-compute/better-compute/activities/health"
	"github.com/better-compute/better-compute/internal/temporaltest"
)

func TestHealthCheckEchoesThroughTheActivity(t *testing.T) {
	cases := []struct {
		name    string
		echo    func(context.Context, string) (string, error)
		want    string
		wantErr bool
	}{
		{"echo", func(_ context.Context, n string) (string, error) { return n, nil }, "nonce-1", false},
		{"worker cannot reach its database", func(context.Context, string) (string, error) {
			return "", errors.New("database down")
		}, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s testsuite.WorkflowTestSuite
			env := s.NewTestWorkflowEnvironment()
			Register(env, &activities.Health{})
			env.OnActivity("HealthEcho", mock.Anything, mock.Anything).Return(c.echo)
			env.ExecuteWorkflow(HealthCheck, "nonce-1")
			if !env.IsWorkflowCompleted() {
				t.Fatal("workflow did not complete")
			}
			if err := env.GetWorkflowError(); (err != nil) != c.wantErr {
				t.Fatalf("workflow error = %v, want error %v", err, c.wantErr)
			}
			if c.wantErr {
				return
			}
			var got string
			if err := env.GetWorkflowResult(&got); err != nil || got != c.want {
				t.Fatalf("result = %q, %v", got, err)
			}
		})
	}
}

func TestRegisterKeepsThePersistedNames(t *testing.T) {
	r := temporaltest.NewRegistry()
	Register(r, &activities.Health{})
	if want := []string{"HealthCheck"}; !slices.Equal(r.Workflows, want) {
		t.Errorf("workflows = %q, want %q", r.Workflows, want)
	}
	if want := map[string]string{"HealthEcho": "HealthEcho"}; len(r.Activities) != len(want) || !maps.Equal(r.Methods, want) {
		t.Errorf("activities = %q (%v), want %v", r.Activities, r.Methods, want)
	}
}

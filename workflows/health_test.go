package workflows

import (
	"context"
	"errors"
	"testing"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
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
			env.RegisterActivityWithOptions(c.echo, activity.RegisterOptions{Name: "HealthEcho"})
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

package workers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

func failingStep(context.Context) error { return errors.New("step failed") }

// failingFlow runs failingStep twice (two attempts) and fails with it.
func failingFlow(ctx workflow.Context) error {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 2, InitialInterval: time.Millisecond},
	})
	return workflow.ExecuteActivity(ctx, "FailingStep").Get(ctx, nil)
}

func cancelledFlow(workflow.Context) error { return temporal.NewCanceledError() }

func TestMetricsCountWorkflowAndActivityFailuresByType(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var suite testsuite.WorkflowTestSuite
	run := func(wf any, name string) error {
		env := suite.NewTestWorkflowEnvironment()
		env.SetWorkerOptions(worker.Options{Interceptors: []interceptor.WorkerInterceptor{m.Interceptor()}})
		env.RegisterWorkflowWithOptions(wf, workflow.RegisterOptions{Name: name})
		env.RegisterActivityWithOptions(failingStep, activity.RegisterOptions{Name: "FailingStep"})
		env.ExecuteWorkflow(name)
		if !env.IsWorkflowCompleted() {
			t.Fatalf("%s did not complete", name)
		}
		return env.GetWorkflowError()
	}
	if err := run(failingFlow, "FailingFlow"); err == nil {
		t.Fatal("FailingFlow succeeded")
	}
	_ = run(cancelledFlow, "CancelledFlow")
	if got := promtest.ToFloat64(m.workflowFailures.WithLabelValues("FailingFlow")); got != 1 {
		t.Errorf("FailingFlow failures = %v, want 1", got)
	}
	if got := promtest.ToFloat64(m.workflowFailures.WithLabelValues("CancelledFlow")); got != 0 {
		t.Errorf("a cancelled workflow counted as a failure: %v", got)
	}
	if got := promtest.ToFloat64(m.activityFailures.WithLabelValues("FailingStep")); got != 2 {
		t.Errorf("FailingStep failures = %v, want 2 (one per attempt)", got)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Error("registering the worker's series twice succeeded")
	}
}

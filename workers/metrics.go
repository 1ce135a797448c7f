package workers

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// Metrics count the control plane's workflow and activity failures by type.
// A small interceptor rather than the SDK's tally reporter: these two
// counters are what operators alert on, and the contrib module would link
// tally and its Prometheus reporter into every worker.
type Metrics struct {
	workflowFailures *prometheus.CounterVec
	activityFailures *prometheus.CounterVec
}

// NewMetrics registers the worker's series on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		workflowFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_workflow_failures_total",
			Help: "Workflow runs that ended in failure (not cancellation or continue-as-new), by workflow type.",
		}, []string{"workflow_type"}),
		activityFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_activity_failures_total",
			Help: "Activity attempts that returned an error, by activity type (each retry counts).",
		}, []string{"activity_type"}),
	}
	for _, c := range []prometheus.Collector{m.workflowFailures, m.activityFailures} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("worker metrics: %w", err)
		}
	}
	return m, nil
}

// Interceptor is the worker interceptor that feeds m.
func (m *Metrics) Interceptor() interceptor.WorkerInterceptor { return &failureCounter{m: m} }

type failureCounter struct {
	interceptor.WorkerInterceptorBase
	m *Metrics
}

func (f *failureCounter) InterceptActivity(_ context.Context, next interceptor.ActivityInboundInterceptor) interceptor.ActivityInboundInterceptor {
	a := &activityFailureCounter{m: f.m}
	a.Next = next
	return a
}

func (f *failureCounter) InterceptWorkflow(_ workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	w := &workflowFailureCounter{m: f.m}
	w.Next = next
	return w
}

type activityFailureCounter struct {
	interceptor.ActivityInboundInterceptorBase
	m *Metrics
}

func (a *activityFailureCounter) ExecuteActivity(ctx context.Context, in *interceptor.ExecuteActivityInput) (any, error) {
	out, err := a.Next.ExecuteActivity(ctx, in)
	if err != nil {
		a.m.activityFailures.WithLabelValues(activity.GetInfo(ctx).ActivityType.Name).Inc()
	}
	return out, err
}

type workflowFailureCounter struct {
	interceptor.WorkflowInboundInterceptorBase
	m *Metrics
}

// ExecuteWorkflow counts a run's failure once: not while a history is
// replayed (the run's end was counted when it happened), and not for the
// ends that are not failures.
func (w *workflowFailureCounter) ExecuteWorkflow(ctx workflow.Context, in *interceptor.ExecuteWorkflowInput) (any, error) {
	out, err := w.Next.ExecuteWorkflow(ctx, in)
	if err != nil && !workflow.IsReplaying(ctx) && !workflow.IsContinueAsNewError(err) && !temporal.IsCanceledError(err) {
		w.m.workflowFailures.WithLabelValues(workflow.GetInfo(ctx).WorkflowType.Name).Inc()
	}
	return out, err
}

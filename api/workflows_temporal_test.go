package api_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	metalact "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/metal"
	"github.com/better-compute/better-compute/api/workflows"
)

// signalled counts the signals named name in the run's history.
func signalled(t *testing.T, tc client.Client, workflowID, name string) int {
	t.Helper()
	it := tc.GetWorkflowHistory(context.Background(), workflowID, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	n := 0
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		if a := e.GetWorkflowExecutionSignaledEventAttributes(); a != nil && a.GetSignalName() == name {
			n++
		}
	}
	return n
}

// TestWorkflowsWithTemporal: against a real Temporal (no worker runs the
// lifecycle here, so nothing moves but what the calls do), deploy starts
// the node's lifecycle workflow, pause and resume signal it, and retry
// starts the retry operation's run.
func TestWorkflowsWithTemporal(t *testing.T) {
	ctx := context.Background()
	m := newMetalEnv(t)
	tc, temporalAddr := startTemporal(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	gw, err := agentgateway.New(agentgateway.Deps{Store: m.store, Catalog: m.catalog, Logger: quiet, Secrets: m.vault, Temporal: tc,
		TemporalAddress: temporalAddr, TemporalNamespace: "default", SiteLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Deps{Store: m.store, IAM: m.outer, Catalog: m.catalog, Routes: gw, Logger: quiet, Secrets: m.vault,
		Temporal: tc, TaskQueue: "wf-test-queue"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	m.server, m.url = srv, hs.URL
	c := m.client(m.boot.UserToken)

	node := m.ready("t1", "https://10.0.3.1")
	profile := m.profile("acme", "temporal")
	d, err := metal.Deploy.Call(ctx, c, metal.DeployInput{TenantID: "acme", NodeID: node, ProfileID: profile})
	if err != nil || !d.Lifecycle.WorkflowStarted {
		t.Fatalf("deploy: %+v %v", d.Lifecycle, err)
	}
	ref := workflows.WorkflowInput{TenantID: "acme", NodeID: node, WorkflowID: d.WorkflowID}
	if _, err := workflows.Pause.Call(ctx, c, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := workflows.Resume.Call(ctx, c, ref); err != nil {
		t.Fatal(err)
	}
	if n := signalled(t, tc, metalact.MetalWorkflowID(node), metalact.SignalWorkflowChanged); n != 2 {
		t.Fatalf("%d workflow-changed signals, want 2", n)
	}

	// The deploy fails at its first step; retry starts the retry's run.
	ps := metalact.NewDBStore(m.store, m.catalog)
	if _, err := ps.BeginStep(ctx, "acme", d.WorkflowID, d.Lifecycle.OpSeq, 0); err != nil {
		t.Fatal(err)
	}
	if err := (&dbFail{ps}).fail(ctx, node, d.Lifecycle.OpSeq, "check-image"); err != nil {
		t.Fatal(err)
	}
	r, err := workflows.Retry.Call(ctx, c, ref)
	if err != nil {
		t.Fatal(err)
	}
	now := m.get(node)
	if now.Lifecycle.Operation != "retry" || now.Lifecycle.OpSeq != r.OpSeq || !now.Lifecycle.WorkflowStarted {
		t.Fatalf("after retry: %+v", now.Lifecycle)
	}
	desc, err := tc.DescribeWorkflowExecution(ctx, metalact.MetalWorkflowID(node), "")
	if err != nil || desc.GetWorkflowExecutionInfo().GetStatus() != enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
		t.Fatalf("the retry's run: %v %v", desc.GetWorkflowExecutionInfo().GetStatus(), err)
	}
}

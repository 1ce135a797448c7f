package lifecycle

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	activities "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/agent/protocol"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/core/provisioning"
	dtemporal "github.com/better-compute/better-compute/deploy/temporal"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/workflows/sites"
)

const controlPlaneQueue = "control-plane"

// world is a real Temporal server with the control-plane worker (over the
// fake store) and the site's worker (over the fake site).
type world struct {
	t     *testing.T
	c     client.Client
	store *fakeStore
	site  *fakeSite
	a     *activities.Metal
	// siteID is the site the site worker serves.
	siteID string
}

func startWorld(t *testing.T, ctx context.Context) *world {
	t.Helper()
	fs := newFakeStore()
	w := startWorldOn(t, ctx, "site_1", fs, newFakeSite(fs))
	w.store = fs
	return w
}

// startWorldOn starts the server, the control-plane worker over st and
// the worker of siteID over site.
func startWorldOn(t *testing.T, ctx context.Context, siteID string, st activities.Store, site *fakeSite) *world {
	t.Helper()
	ts, err := dtemporal.Start(ctx, dtemporal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ts.Stop)
	c, err := client.DialContext(ctx, client.Options{HostPort: ts.FrontendAddr(),
		Logger: log.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	w := &world{t: t, c: c, siteID: siteID, site: site}
	w.a = &activities.Metal{Store: st, Temporal: c, TaskQueue: controlPlaneQueue, OwedGrace: time.Nanosecond}
	cp := worker.New(c, controlPlaneQueue, worker.Options{DeadlockDetectionTimeout: time.Minute})
	Register(cp, w.a)
	if err := cp.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	sw := worker.New(c, sites.SiteTaskQueue(siteID), worker.Options{DeadlockDetectionTimeout: time.Minute})
	registerFakeSite(sw, site)
	if err := sw.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Stop)
	return w
}

// runOp begins op as the API does, starts its workflow, waits for its
// result and answers it with the number of events in its history.
func (w *world) runOp(ctx context.Context, node string, op coremetal.Operation, args string) (activities.LifecycleResult, int) {
	w.t.Helper()
	e, _ := coremetal.EdgeOf(op)
	p := w.store.begin(node, op, args, coremetal.DefaultDeadlines[e.DuringFrom(w.store.node(node).State)])
	if err := activities.StartLifecycle(ctx, w.c, controlPlaneQueue, p); err != nil {
		w.t.Fatal(err)
	}
	run := w.c.GetWorkflow(ctx, activities.MetalWorkflowID(node), "")
	var res activities.LifecycleResult
	if err := run.Get(ctx, &res); err != nil {
		w.t.Fatalf("%s: %v", op, err)
	}
	return res, w.events(ctx, node, run.GetRunID())
}

func (w *world) events(ctx context.Context, node, runID string) int {
	it := w.c.GetWorkflowHistory(ctx, activities.MetalWorkflowID(node), runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	n := 0
	for it.HasNext() {
		if _, err := it.Next(); err != nil {
			w.t.Fatal(err)
		}
		n++
	}
	return n
}

// reconcile runs the reconciler's activity as a worker would.
func (w *world) reconcile() int {
	w.t.Helper()
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	env.RegisterActivity(w.a.ReconcileMetal)
	v, err := env.ExecuteActivity(w.a.ReconcileMetal)
	if err != nil {
		w.t.Fatal(err)
	}
	var n int
	if err := v.Get(&n); err != nil {
		w.t.Fatal(err)
	}
	return n
}

func (w *world) running(ctx context.Context, node string) bool {
	d, err := w.c.DescribeWorkflowExecution(ctx, activities.MetalWorkflowID(node), "")
	if err != nil {
		w.t.Fatal(err)
	}
	return d.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
}

// A whole lifecycle on a real Temporal, enroll → manage → inspect →
// provide → deploy → undeploy → retire: each operation ends in its target
// state; the test reports each one's history length and wall time.
func TestFullLifecycleOnTemporal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := startWorld(t, ctx)
	w.store.enroll("node_1")
	total := 0
	for _, step := range []struct {
		op   coremetal.Operation
		want nodes.ProvisionState
	}{
		{coremetal.Manage, nodes.Enrolling}, {coremetal.Inspect, nodes.Enrolling}, {coremetal.Provide, nodes.Ready},
		{coremetal.Deploy, nodes.Deployed}, {coremetal.Undeploy, nodes.Ready}, {coremetal.Retire, nodes.Retired},
	} {
		began := time.Now()
		res, events := w.runOp(ctx, "node_1", step.op, "")
		if res.Outcome != activities.OutcomeFinished || res.State != string(step.want) {
			t.Fatalf("%s: %+v", step.op, res)
		}
		t.Logf("%-8s %3d history events, %v (simulated machine)", step.op, events, time.Since(began).Round(time.Millisecond))
		total += events
	}
	t.Logf("one lifecycle (manage..retire) takes %d history events", total)
}

// A workflow terminated mid-operation is started again by the reconciler,
// which resumes at the recorded step (the machine is not booted twice) and
// finishes; one whose deadline passed while it was gone is failed with
// reason workflowLost; an owed start is made. No node is left in flight.
func TestReconcilerRestartsAndFailsLostWorkflows(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := startWorld(t, ctx)
	for _, n := range []string{"node_1", "node_2", "node_3"} {
		w.store.enroll(n)
		if res, _ := w.runOp(ctx, n, coremetal.Manage, ""); res.Outcome != activities.OutcomeFinished {
			t.Fatalf("manage %s: %+v", n, res)
		}
	}
	if n := w.reconcile(); n != 0 {
		t.Fatalf("the reconciler acted on %d settled nodes", n)
	}

	// node_1: inspect waits on its ramdisk; its workflow is terminated.
	w.site.autoReport = false
	p := w.store.begin("node_1", coremetal.Inspect, "", time.Hour)
	if err := activities.StartLifecycle(ctx, w.c, controlPlaneQueue, p); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "inspect awaits the ramdisk", func() bool {
		return w.store.node("node_1").Step == coremetal.StepAwaitRamdisk
	})
	if err := w.c.TerminateWorkflow(ctx, activities.MetalWorkflowID("node_1"), "", "test: the workflow is lost"); err != nil {
		t.Fatal(err)
	}
	boots := w.site.count("BootRamdisk inspect")
	if n := w.reconcile(); n != 1 {
		t.Fatalf("reconciler acted %d times, want 1 restart", n)
	}
	if !w.running(ctx, "node_1") {
		t.Fatal("the reconciler did not start node_1's workflow again")
	}
	// The ramdisk reports now: the restarted run finishes the inspection.
	w.store.mu.Lock()
	var bootID string
	for _, b := range w.store.boots {
		if b.nodeID == "node_1" && b.opSeq == p.OpSeq {
			b.report("hk-node_1")
			bootID = b.id
		}
	}
	w.store.mu.Unlock()
	if err := w.c.SignalWorkflow(ctx, activities.MetalWorkflowID("node_1"), "", activities.SignalBootReported,
		activities.BootReported{BootID: bootID}); err != nil {
		t.Fatal(err)
	}
	var res activities.LifecycleResult
	if err := w.c.GetWorkflow(ctx, activities.MetalWorkflowID("node_1"), "").Get(ctx, &res); err != nil {
		t.Fatal(err)
	}
	if n := w.store.node("node_1"); res.Outcome != activities.OutcomeFinished || !n.Inspected || n.Operation != "" {
		t.Fatalf("restarted inspect: %+v, node %+v", res, n)
	}
	if got := w.site.count("BootRamdisk inspect"); got != boots {
		t.Fatalf("the restarted run booted the machine again (%d boots, want %d)", got, boots)
	}

	// node_2: inspect is lost and its deadline passes before anyone looks.
	p = w.store.begin("node_2", coremetal.Inspect, "", 3*time.Second)
	if err := activities.StartLifecycle(ctx, w.c, controlPlaneQueue, p); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "node_2 awaits the ramdisk", func() bool {
		return w.store.node("node_2").Step == coremetal.StepAwaitRamdisk
	})
	if err := w.c.TerminateWorkflow(ctx, activities.MetalWorkflowID("node_2"), "", "test: the workflow is lost"); err != nil {
		t.Fatal(err)
	}
	deadline := w.store.node("node_2").Deadline
	testutil.Eventually(t, time.Minute, "node_2's deadline passes", func() bool { return time.Now().After(deadline) })

	// node_3: the API committed manage again but its start was lost.
	w.store.begin("node_3", coremetal.Inspect, "", time.Hour)
	w.site.autoReport = true

	if n := w.reconcile(); n != 2 {
		t.Fatalf("reconciler acted %d times, want 2 (fail node_2, start node_3)", n)
	}
	if n := w.store.node("node_2"); n.State != nodes.Failed || n.LastError.Reason != coremetal.ReasonWorkflowLost {
		t.Fatalf("node_2: %s %+v", n.State, n.LastError)
	}
	if err := w.c.GetWorkflow(ctx, activities.MetalWorkflowID("node_3"), "").Get(ctx, &res); err != nil {
		t.Fatal(err)
	}
	if n := w.store.node("node_3"); res.Outcome != activities.OutcomeFinished || !n.Inspected {
		t.Fatalf("owed inspect: %+v", res)
	}
	if n := w.reconcile(); n != 0 {
		t.Fatalf("the reconciler acted on %d settled nodes", n)
	}
}

// A deploy whose workflow is terminated while the ramdisk writes the image
// is started again by the reconciler and resumes there on a real
// Temporal: the image is not staged again, the machine not booted again,
// and write-image starts its second attempt.
func TestDeployResumesAfterARestartOnTemporal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := startWorld(t, ctx)
	w.store.enroll("node_1")
	for _, op := range []coremetal.Operation{coremetal.Manage, coremetal.Inspect, coremetal.Provide} {
		if res, _ := w.runOp(ctx, "node_1", op, ""); res.Outcome != activities.OutcomeFinished {
			t.Fatalf("%s: %+v", op, res)
		}
	}
	var writing atomic.Bool
	writing.Store(true)
	w.store.onRamdiskStep = func(_ *fakeBoot, st protocol.RamdiskStep) (protocol.RamdiskStepResult, bool) {
		if st.Name == protocol.StepWriteImage && writing.Load() {
			return protocol.RamdiskStepResult{}, false
		}
		return protocol.RamdiskStepResult{Name: st.Name, OK: true, Message: st.Name + " done"}, true
	}
	p := w.store.begin("node_1", coremetal.Deploy, "", time.Hour)
	if err := activities.StartLifecycle(ctx, w.c, controlPlaneQueue, p); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the ramdisk writes the image", func() bool {
		return w.store.node("node_1").Step == "write-image"
	})
	if err := w.c.TerminateWorkflow(ctx, activities.MetalWorkflowID("node_1"), "", "test: the workflow is lost"); err != nil {
		t.Fatal(err)
	}
	if n := w.reconcile(); n != 1 {
		t.Fatalf("reconciler acted %d times, want 1 restart", n)
	}
	testutil.Eventually(t, time.Minute, "the restarted run writes the image again", func() bool {
		return slices.Contains(w.store.workflowOf("node_1").begun, "write-image#2")
	})
	writing.Store(false)
	if err := w.c.SignalWorkflow(ctx, activities.MetalWorkflowID("node_1"), "", activities.SignalBootReported,
		activities.BootReported{}); err != nil {
		t.Fatal(err)
	}
	var res activities.LifecycleResult
	if err := w.c.GetWorkflow(ctx, activities.MetalWorkflowID("node_1"), "").Get(ctx, &res); err != nil {
		t.Fatal(err)
	}
	if res.Outcome != activities.OutcomeFinished || res.State != string(nodes.Deployed) {
		t.Fatalf("result %+v", res)
	}
	wf := w.store.workflowOf("node_1")
	if wf.run.State != provisioning.WorkflowSucceeded || w.site.count("StageImage") != 1 || w.site.count("BootRamdisk deploy") != 1 {
		t.Fatalf("workflow %s, begun %q, calls %v", wf.run.State, wf.begun, w.site.calls)
	}
}

package lifecycle

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	activities "github.com/better-compute/better-compute/activities/metal"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/workflows/metal"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// harness is one node's world for the workflow's unit tests: the fake
// store behind the real control-plane activities, and a fake site agent
// serving the site activities under their names.
type harness struct {
	t     *testing.T
	store *fakeStore
	site  *fakeSite
	node  string
}

func newHarness(t *testing.T) *harness {
	s := newFakeStore()
	s.now = func() time.Time { return t0 }
	s.enroll("node_1")
	return &harness{t: t, store: s, site: newFakeSite(s), node: "node_1"}
}

func (h *harness) env() *testsuite.TestWorkflowEnvironment {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	// The machine is shared: a slow workflow task is not a deadlock.
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: time.Minute})
	env.SetStartTime(t0)
	Register(env, &activities.Metal{Store: h.store, Provision: h.store})
	registerFakeSite(env, h.site)
	return env
}

// run begins op on the node and runs its workflow to the end; setup may
// arrange callbacks on the environment first.
func (h *harness) run(op coremetal.Operation, args string, setup func(*testsuite.TestWorkflowEnvironment)) activities.LifecycleResult {
	h.t.Helper()
	e, _ := coremetal.EdgeOf(op)
	p := h.store.begin(h.node, op, args, coremetal.DefaultDeadlines[e.DuringFrom(h.store.node(h.node).State)])
	if op == coremetal.Power {
		p = h.reDeadline(coremetal.PowerDeadline)
	}
	return h.runParams(p, setup)
}

func (h *harness) reDeadline(d time.Duration) activities.MetalParams {
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	n := h.store.nodes[h.node]
	n.Deadline = t0.Add(d)
	return activities.MetalParams{TenantID: n.TenantID, NodeID: n.NodeID, OpSeq: n.OpSeq}
}

func (h *harness) runParams(p activities.MetalParams, setup func(*testsuite.TestWorkflowEnvironment)) activities.LifecycleResult {
	h.t.Helper()
	env := h.env()
	if setup != nil {
		setup(env)
	}
	env.ExecuteWorkflow(activities.MetalWorkflowName, p)
	if !env.IsWorkflowCompleted() {
		h.t.Fatal("workflow did not complete")
	}
	if err := env.GetWorkflowError(); err != nil {
		h.t.Fatalf("workflow: %v", err)
	}
	var res activities.LifecycleResult
	if err := env.GetWorkflowResult(&res); err != nil {
		h.t.Fatal(err)
	}
	return res
}

func (h *harness) mustFinish(op coremetal.Operation, args string, want nodes.ProvisionState) activities.LifecycleResult {
	h.t.Helper()
	before := len(h.store.stepsOf(h.node))
	res := h.run(op, args, nil)
	if res.Outcome != activities.OutcomeFinished || res.State != string(want) {
		h.t.Fatalf("%s: result %+v, want finished in %s", op, res, want)
	}
	n := h.store.node(h.node)
	if n.State != want || n.Operation != "" {
		h.t.Fatalf("%s: node %s op %q, want %s and no operation", op, n.State, n.Operation, want)
	}
	e, _ := coremetal.EdgeOf(op)
	if got := h.store.stepsOf(h.node)[before:]; !slices.Equal(got, e.Steps) {
		h.t.Fatalf("%s: steps %q, want %q", op, got, e.Steps)
	}
	return res
}

// Every operation's happy path, along the whole lifecycle, ends in the
// table's target state with each step recorded in order.
func TestLifecycleHappyPaths(t *testing.T) {
	h := newHarness(t)
	h.mustFinish(coremetal.Manage, "", nodes.Enrolling)
	if n := h.store.node(h.node); !n.Managed || n.Power != nodes.PowerOff {
		t.Fatalf("after manage: managed %v power %s", n.Managed, n.Power)
	}
	h.mustFinish(coremetal.Inspect, "", nodes.Enrolling)
	if n := h.store.node(h.node); !n.Inspected || n.HardwareKey != "hk-node_1" || n.Power != nodes.PowerOff {
		t.Fatalf("after inspect: %+v", n)
	}
	if h.site.count("InspectOOB") != 1 || h.site.count("BootRamdisk inspect") != 1 || h.site.count("EndBoot off") != 1 {
		t.Fatalf("inspect calls: %v", h.site.calls)
	}
	h.mustFinish(coremetal.Provide, "", nodes.Ready)
	if h.site.count("ResetBIOS") != 1 || h.site.count("BootRamdisk clean") != 1 {
		t.Fatalf("provide calls: %v", h.site.calls)
	}
	h.mustFinish(coremetal.Deploy, "", nodes.Deployed)
	if n := h.store.node(h.node); n.Power != nodes.PowerOn {
		t.Fatalf("deployed machine is %s, want on", n.Power)
	}
	h.mustFinish(coremetal.Rescue, "", nodes.Rescue)
	if h.store.openBoots(h.node) != 1 {
		t.Fatal("a rescued machine keeps its boot open")
	}
	h.mustFinish(coremetal.Unrescue, "", nodes.Deployed)
	if h.store.openBoots(h.node) != 0 || h.site.powerOf(h.node) != "on" {
		t.Fatalf("unrescue: open boots %d, power %s", h.store.openBoots(h.node), h.site.powerOf(h.node))
	}
	res := h.mustFinish(coremetal.Power, `{"action":"off"}`, nodes.Deployed)
	if res.Power != "off" || h.store.node(h.node).Power != nodes.PowerOff {
		t.Fatalf("power off answered %q, node %s", res.Power, h.store.node(h.node).Power)
	}
	h.mustFinish(coremetal.Power, `{"action":"on"}`, nodes.Deployed)
	h.mustFinish(coremetal.Undeploy, "", nodes.Ready)
	if h.site.count("BootRamdisk clean") != 2 || h.site.powerOf(h.node) != "off" {
		t.Fatalf("undeploy calls: %v", h.site.calls)
	}
	h.mustFinish(coremetal.Retire, "", nodes.Retired)
	if h.store.openBoots(h.node) != 0 {
		t.Fatal("boots left open after retire")
	}
}

// An abort while inspect waits for the ramdisk cancels the wait, powers
// the machine off (ending the boot) and fails the node with reason
// aborted; the update answers once the node is failed.
func TestAbortMidInspect(t *testing.T) {
	h := newHarness(t)
	h.mustFinish(coremetal.Manage, "", nodes.Enrolling)
	h.site.autoReport = false
	var answer activities.LifecycleResult
	var updateErr error
	answered := false
	res := h.run(coremetal.Inspect, "", func(env *testsuite.TestWorkflowEnvironment) {
		env.RegisterDelayedCallback(func() {
			env.UpdateWorkflow(activities.UpdateAbort, "abort-1", &testsuite.TestUpdateCallback{
				OnReject: func(err error) { updateErr = err },
				OnComplete: func(v any, err error) {
					answered, updateErr = true, err
					if r, ok := v.(activities.LifecycleResult); ok {
						answer = r
					}
				},
			})
		}, 17*time.Second)
	})
	if !answered || updateErr != nil {
		t.Fatalf("abort answered %v err %v", answered, updateErr)
	}
	if answer.Reason != coremetal.ReasonAborted || answer.State != string(nodes.Failed) {
		t.Fatalf("abort answered %+v", answer)
	}
	if res.Outcome != activities.OutcomeFailed || res.Reason != coremetal.ReasonAborted || res.Step != coremetal.StepAwaitRamdisk {
		t.Fatalf("result %+v", res)
	}
	n := h.store.node(h.node)
	if n.State != nodes.Failed || n.LastError == nil || n.LastError.Reason != coremetal.ReasonAborted ||
		n.LastError.Step != coremetal.StepAwaitRamdisk {
		t.Fatalf("node %+v, last error %+v", n, n.LastError)
	}
	if h.site.count("EndBoot off") != 1 || h.site.powerOf(h.node) != "off" || n.Power != nodes.PowerOff {
		t.Fatalf("abort did not power off: calls %v", h.site.calls)
	}
	if h.store.openBoots(h.node) != 0 {
		t.Fatal("the aborted boot is still open")
	}
	// recover takes it back to where inspect started.
	h.mustFinish(coremetal.Recover, "", nodes.Enrolling)
}

// An abort the API recorded before the run began (no workflow was there
// to take the update) fails the operation at once.
func TestAbortRequestedBeforeTheRun(t *testing.T) {
	h := newHarness(t)
	p := h.store.begin(h.node, coremetal.Manage, "", time.Minute)
	h.store.nodes[h.node].AbortRequested = true
	res := h.runParams(p, nil)
	if res.Reason != coremetal.ReasonAborted || h.site.count("VerifyBMC") != 0 {
		t.Fatalf("result %+v calls %v", res, h.site.calls)
	}
}

// Past the deadline the step in flight is cancelled and the node fails
// with reason deadline and the step.
func TestDeadlineFailsTheNodeWithTheStep(t *testing.T) {
	h := newHarness(t)
	h.mustFinish(coremetal.Manage, "", nodes.Enrolling)
	h.mustFinish(coremetal.Inspect, "", nodes.Enrolling)
	h.site.autoReport = false
	h.store.begin(h.node, coremetal.Provide, "", 0)
	p := h.reDeadline(3 * time.Minute)
	res := h.runParams(p, nil)
	if res.Outcome != activities.OutcomeFailed || res.Reason != coremetal.ReasonDeadline || res.Step != coremetal.StepAwaitRamdisk {
		t.Fatalf("result %+v", res)
	}
	n := h.store.node(h.node)
	if n.State != nodes.Failed || n.LastError.Reason != coremetal.ReasonDeadline || n.LastError.Step != coremetal.StepAwaitRamdisk {
		t.Fatalf("node %s, last error %+v", n.State, n.LastError)
	}
	if h.site.powerOf(h.node) != "off" {
		t.Fatal("the machine was left on past the deadline")
	}
	// A failed provide recovers to enrolling, to be cleaned again.
	h.site.autoReport = true
	h.mustFinish(coremetal.Recover, "", nodes.Enrolling)
}

// A BMC that refuses the credentials fails manage with reason bmc and the
// driver's message, without retrying.
func TestBMCAuthErrorFailsWithTheReason(t *testing.T) {
	h := newHarness(t)
	h.site.verifyErr = temporal.NewNonRetryableApplicationError("redfish: 401 Unauthorized for user admin", metal.ErrTypeBMCAuth, nil)
	res := h.run(coremetal.Manage, "", nil)
	if res.Outcome != activities.OutcomeFailed || res.Reason != coremetal.ReasonBMC || !strings.Contains(res.Message, "401 Unauthorized") {
		t.Fatalf("result %+v", res)
	}
	n := h.store.node(h.node)
	if n.State != nodes.Failed || n.Managed || n.LastError.Step != coremetal.StepVerifyBMC {
		t.Fatalf("node %+v", n)
	}
	if h.site.count("VerifyBMC") != 1 {
		t.Fatalf("an auth error was retried: %d calls", h.site.count("VerifyBMC"))
	}
}

// A start whose op_seq is not the one in flight (late or duplicate)
// changes nothing.
func TestStaleOpSeqIsANoOp(t *testing.T) {
	h := newHarness(t)
	p := h.store.begin(h.node, coremetal.Manage, "", time.Minute)
	stale := p
	stale.OpSeq--
	res := h.runParams(stale, nil)
	if res.Outcome != activities.OutcomeStale {
		t.Fatalf("result %+v", res)
	}
	if len(h.store.stepsOf(h.node)) != 0 || len(h.site.calls) != 0 || h.store.node(h.node).Operation != coremetal.Manage {
		t.Fatalf("a stale run acted: steps %q calls %v", h.store.stepsOf(h.node), h.site.calls)
	}
	// A second run of an operation that already finished is stale too.
	if res := h.runParams(p, nil); res.Outcome != activities.OutcomeFinished {
		t.Fatalf("first run %+v", res)
	}
	calls := h.site.count("VerifyBMC")
	if res := h.runParams(p, nil); res.Outcome != activities.OutcomeStale || h.site.count("VerifyBMC") != calls {
		t.Fatalf("duplicate run %+v", res)
	}
}

// The ramdisk's report arrives with a signal: the wait ends on the signal,
// before the next poll would have read the row.
func TestBootReportedSignalEndsTheWait(t *testing.T) {
	h := newHarness(t)
	h.mustFinish(coremetal.Manage, "", nodes.Enrolling)
	h.site.autoReport = false
	var mu sync.Mutex
	pollDue := false  // the poll after the signal would now have come
	readLate := false // the row was read once that poll was due
	h.store.onBootStatus = func(b *fakeBoot) {
		mu.Lock()
		defer mu.Unlock()
		if b.reported && pollDue {
			readLate = true
		}
	}
	res := h.run(coremetal.Inspect, "", func(env *testsuite.TestWorkflowEnvironment) {
		env.RegisterDelayedCallback(func() {
			h.store.mu.Lock()
			var id string
			for _, b := range h.store.boots {
				if b.booted && !b.reported {
					b.report("hk-node_1")
					id = b.id
				}
			}
			h.store.mu.Unlock()
			env.SignalWorkflow(activities.SignalBootReported, activities.BootReported{BootID: id})
		}, 11*time.Second)
		env.RegisterDelayedCallback(func() {
			mu.Lock()
			defer mu.Unlock()
			pollDue = true
		}, 12*time.Second)
	})
	if res.Outcome != activities.OutcomeFinished {
		t.Fatalf("result %+v", res)
	}
	if readLate {
		t.Fatal("the wait ended on a poll, not on the signal")
	}
}

// A report whose signal is lost is found by the poll.
func TestLostSignalIsCoveredByThePoll(t *testing.T) {
	h := newHarness(t)
	h.mustFinish(coremetal.Manage, "", nodes.Enrolling)
	h.site.autoReport = false
	polls := 0
	h.store.onBootStatus = func(b *fakeBoot) {
		polls++
		if b.booted && polls == 4 {
			b.report("hk-node_1") // no signal
		}
	}
	res := h.run(coremetal.Inspect, "", nil)
	if res.Outcome != activities.OutcomeFinished || polls != 4 {
		t.Fatalf("result %+v after %d polls", res, polls)
	}
	if n := h.store.node(h.node); !n.Inspected {
		t.Fatal("not inspected")
	}
}

// A hardware key already another node's fails inspect with CONFLICT naming
// that node, and nothing is ingested.
func TestInspectHardwareKeyConflict(t *testing.T) {
	h := newHarness(t)
	h.store.owners["hk-node_1"] = "node_other"
	h.mustFinish(coremetal.Manage, "", nodes.Enrolling)
	res := h.run(coremetal.Inspect, "", nil)
	if res.Reason != coremetal.ReasonHardwareConflict || !strings.Contains(res.Message, "node_other") {
		t.Fatalf("result %+v", res)
	}
	n := h.store.node(h.node)
	if n.LastError.Code != "CONFLICT" || n.HardwareKey != "" || n.Inspected {
		t.Fatalf("node %+v", n)
	}
}

// A deploy whose installed system joins with another hardware key (the
// join with the boot's token is refused) fails at the reboot step with
// reason hardwareKeyMismatch.
func TestDeployRejoinMismatchFails(t *testing.T) {
	h := newHarness(t)
	h.mustFinish(coremetal.Manage, "", nodes.Enrolling)
	h.mustFinish(coremetal.Inspect, "", nodes.Enrolling)
	h.mustFinish(coremetal.Provide, "", nodes.Ready)
	h.site.hardwareKey[h.node] = "hk-impostor"
	res := h.run(coremetal.Deploy, "", nil)
	if res.Reason != coremetal.ReasonHardwareMismatch || res.Step != "reboot" || !strings.Contains(res.Message, "hk-impostor") {
		t.Fatalf("result %+v", res)
	}
	if n := h.store.node(h.node); n.LastError == nil || n.LastError.Reason != coremetal.ReasonHardwareMismatch || n.LastError.Step != "reboot" {
		t.Fatalf("node %s, last error %+v", n.State, n.LastError)
	}
	if wf := h.store.workflowOf(h.node); wf.run.State != provisioning.WorkflowFailed || wf.run.Steps[6].State != provisioning.StepFailed {
		t.Fatalf("workflow %s, reboot %s", wf.run.State, wf.run.Steps[6].State)
	}
	// A failed deploy recovers to ready.
	h.mustFinish(coremetal.Recover, "", nodes.Ready)
}

// A site whose agent never takes the step (its schedule-to-start timeout
// fires) fails the node at that step, not at its deadline.
func TestSiteWithoutAgentFailsTheStep(t *testing.T) {
	h := newHarness(t)
	res := h.run(coremetal.Manage, "", func(env *testsuite.TestWorkflowEnvironment) {
		env.OnActivity(metal.ActivityVerifyBMC, mock.Anything, mock.Anything).Return(metal.BMCStatus{},
			temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START, nil))
	})
	if res.Outcome != activities.OutcomeFailed || res.Step != coremetal.StepVerifyBMC ||
		!strings.Contains(res.Message, "no agent of site site_1") {
		t.Fatalf("result %+v", res)
	}
	if n := h.store.node(h.node); n.State != nodes.Failed || n.LastError.Code != "UNAVAILABLE" {
		t.Fatalf("node %s, last error %+v", n.State, n.LastError)
	}
}

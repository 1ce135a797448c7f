package lifecycle

import (
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	activities "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/agent/protocol"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/workflows/metal"
)

// ready takes the harness's node to ready (managed, inspected, cleaned).
func (h *harness) ready() {
	h.t.Helper()
	h.mustFinish(coremetal.Manage, "", nodes.Enrolling)
	h.mustFinish(coremetal.Inspect, "", nodes.Enrolling)
	h.mustFinish(coremetal.Provide, "", nodes.Ready)
}

// abortAt sends the abort update after d and answers what it answered.
func abortAt(env *testsuite.TestWorkflowEnvironment, d time.Duration, answer *activities.LifecycleResult, answered *bool) {
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(activities.UpdateAbort, "abort-1", &testsuite.TestUpdateCallback{
			OnReject: func(error) {},
			OnComplete: func(v any, err error) {
				if err == nil {
					*answered = true
				}
				if r, ok := v.(activities.LifecycleResult); ok {
					*answer = r
				}
			},
		})
	}, d)
}

func stepNames(wf fakeWorkflow) []string {
	var out []string
	for _, s := range wf.run.Steps {
		out = append(out, s.Name)
	}
	return out
}

// A default deploy runs every persisted step once, in order, on its
// runner: the image is checked and staged, the ramdisk boots and is handed
// write-image (with the staged image's URL and digest and the context's
// root device), write-seed and reboot one at a time, the boot device is
// set to disk, and once the installed system's agent joined the boot is
// closed with the machine left on: the node is deployed, the workflow
// succeeded.
func TestDeployRunsEveryStepInOrder(t *testing.T) {
	h := newHarness(t)
	h.ready()
	h.mustFinish(coremetal.Deploy, "", nodes.Deployed)
	wf := h.store.workflowOf(h.node)
	names := stepNames(wf)
	var want []string
	for _, n := range names {
		want = append(want, n+"#1")
	}
	if !slices.Equal(wf.begun, want) {
		t.Fatalf("begun %q, want %q", wf.begun, want)
	}
	if wf.run.State != provisioning.WorkflowSucceeded {
		t.Fatalf("workflow %s", wf.run.State)
	}
	for _, s := range wf.run.Steps {
		if s.State != provisioning.StepSucceeded || s.Attempts != 1 {
			t.Fatalf("step %s: %s after %d attempts", s.Name, s.State, s.Attempts)
		}
	}
	if !strings.Contains(wf.run.Steps[1].Output, `"url":"http://site_1.boot/images/node_1/`) {
		t.Fatalf("stage-image kept %q", wf.run.Steps[1].Output)
	}
	for _, c := range []string{"StageImage", "BootRamdisk deploy", "SetBootDevice disk true", "EndBoot"} {
		if h.site.count(c) != 1 {
			t.Fatalf("%s called %d times: %v", c, h.site.count(c), h.site.calls)
		}
	}
	var boot *fakeBoot
	for _, b := range h.store.boots {
		if b.purpose == activities.PurposeDeploy {
			boot = b
		}
	}
	var handed []string
	for _, st := range boot.handed {
		handed = append(handed, st.Name)
	}
	if !slices.Equal(handed, []string{protocol.StepWriteImage, protocol.StepWriteSeed, protocol.StepReboot}) {
		t.Fatalf("the ramdisk ran %q", handed)
	}
	wi := boot.handed[0].Args
	if wi["url"] == "" || wi["sha256"] != fakeImage.SHA256 || wi["sizeBytes"] != "67108864" || wi["rootDevice"] != "vda" {
		t.Fatalf("write-image args %v", wi)
	}
	if !boot.finished || h.store.openBoots(h.node) != 0 || h.site.powerOf(h.node) != "on" {
		t.Fatalf("boot finished %v, open %d, power %s", boot.finished, h.store.openBoots(h.node), h.site.powerOf(h.node))
	}
}

// A step that fails twice with MaxAttempts 3 succeeds on its third attempt,
// each attempt recorded, after a backoff.
func TestStepRetriedUntilItSucceeds(t *testing.T) {
	h := newHarness(t)
	h.ready()
	steps := provisioning.DefaultMetalSteps()
	steps[3].Retry = provisioning.Retry{MaxAttempts: 3, BackoffSeconds: 5}
	h.store.deploySteps = steps
	writes := 0
	h.store.onRamdiskStep = func(_ *fakeBoot, st protocol.RamdiskStep) (protocol.RamdiskStepResult, bool) {
		if st.Name == protocol.StepWriteImage {
			writes++
			if writes < 3 {
				return protocol.RamdiskStepResult{Name: st.Name, Message: "connection reset after 12 MiB"}, true
			}
		}
		return protocol.RamdiskStepResult{Name: st.Name, OK: true, Message: st.Name + " done"}, true
	}
	h.mustFinish(coremetal.Deploy, "", nodes.Deployed)
	wf := h.store.workflowOf(h.node)
	var got []string
	for _, o := range wf.outcomes {
		if strings.HasPrefix(o, "write-image") {
			got = append(got, o)
		}
	}
	if !slices.Equal(got, []string{"write-image#1 fail:stepFailed", "write-image#2 fail:stepFailed", "write-image#3 ok"}) {
		t.Fatalf("write-image attempts %q", got)
	}
	if s := wf.run.Steps[3]; s.Attempts != 3 || s.State != provisioning.StepSucceeded {
		t.Fatalf("write-image %s after %d attempts", s.State, s.Attempts)
	}
}

// A final failure fails the node at that step with the step's output
// kept; a Retry operation resumes the same workflow at that step (the
// steps before it are not run again; the machine, whose deploy boot
// belonged to the failed operation, boots a new one) and succeeds.
func TestFinalFailureThenRetryResumesThere(t *testing.T) {
	h := newHarness(t)
	h.ready()
	broken := true
	h.store.onRamdiskStep = func(_ *fakeBoot, st protocol.RamdiskStep) (protocol.RamdiskStepResult, bool) {
		if st.Name == protocol.StepWriteSeed && broken {
			return protocol.RamdiskStepResult{Name: st.Name, Message: "no free space after the image's partitions"}, true
		}
		return protocol.RamdiskStepResult{Name: st.Name, OK: true, Message: st.Name + " done"}, true
	}
	res := h.run(coremetal.Deploy, "", nil)
	if res.Outcome != activities.OutcomeFailed || res.Reason != coremetal.ReasonStepFailed || res.Step != "write-seed" ||
		!strings.Contains(res.Message, "no free space") {
		t.Fatalf("result %+v", res)
	}
	n := h.store.node(h.node)
	if n.State != nodes.Failed || n.LastError.Step != "write-seed" || n.LastError.Reason != coremetal.ReasonStepFailed {
		t.Fatalf("node %s, last error %+v", n.State, n.LastError)
	}
	wf := h.store.workflowOf(h.node)
	seed := wf.run.Steps[4]
	if wf.run.State != provisioning.WorkflowFailed || seed.State != provisioning.StepFailed || seed.Attempts != 3 ||
		!strings.Contains(seed.Output, "no free space") {
		t.Fatalf("workflow %s, write-seed %+v", wf.run.State, seed)
	}

	broken = false
	stages, boots := h.site.count("StageImage"), h.site.count("BootRamdisk deploy")
	res = h.run(coremetal.Retry, "", nil)
	if res.Outcome != activities.OutcomeFinished || res.State != string(nodes.Deployed) {
		t.Fatalf("retry: %+v", res)
	}
	wf = h.store.workflowOf(h.node)
	if wf.run.State != provisioning.WorkflowSucceeded {
		t.Fatalf("workflow %s", wf.run.State)
	}
	if !slices.Equal(wf.begun[len(wf.begun)-3:], []string{"write-seed#4", "boot-from-disk#1", "reboot#1"}) {
		t.Fatalf("the retry began %q", wf.begun)
	}
	if h.site.count("StageImage") != stages || h.site.count("BootRamdisk deploy") != boots+1 {
		t.Fatalf("retry: %d stagings (want %d), %d boots (want %d)", h.site.count("StageImage"), stages,
			h.site.count("BootRamdisk deploy"), boots+1)
	}
	if !strings.Contains(wf.run.Steps[4].Output, "no ramdisk boot of this operation was open") || h.store.openBoots(h.node) != 0 {
		t.Fatalf("write-seed output %q, open boots %d", wf.run.Steps[4].Output, h.store.openBoots(h.node))
	}
}

// A retry that resumes after write-seed (here at reboot, whose re-join
// timed out) boots a new ramdisk, so the seed is written again with the
// new boot's token before the reboot.
func TestRetryAfterTheSeedWritesItAgain(t *testing.T) {
	h := newHarness(t)
	h.ready()
	steps := provisioning.DefaultMetalSteps()
	steps[6].TimeoutSeconds = 300
	h.store.deploySteps = steps
	h.store.noJoin = true // the machine reboots, but nothing joins
	res := h.run(coremetal.Deploy, "", nil)
	if res.Reason != coremetal.ReasonStepTimeout || res.Step != "reboot" {
		t.Fatalf("result %+v", res)
	}
	h.store.noJoin = false
	res = h.run(coremetal.Retry, "", nil)
	if res.Outcome != activities.OutcomeFinished || res.State != string(nodes.Deployed) {
		t.Fatalf("retry: %+v", res)
	}
	var retried *fakeBoot
	for _, b := range h.store.boots {
		if b.purpose == activities.PurposeDeploy && b.opSeq == h.store.node(h.node).OpSeq {
			retried = b
		}
	}
	var handed []string
	for _, st := range retried.handed {
		handed = append(handed, st.Name)
	}
	if !slices.Equal(handed, []string{protocol.StepWriteSeed, protocol.StepReboot}) {
		t.Fatalf("the retry's boot ran %q", handed)
	}
	if out := h.store.workflowOf(h.node).run.Steps[6].Output; !strings.Contains(out, "the seed was written again") {
		t.Fatalf("reboot output %q", out)
	}
}

// A pause requested while a step runs holds the workflow before the next
// one, past the operation's deadline; the resume (which pushes the
// deadline by the time paused) continues from that step.
func TestPauseBeforeTheNextStepThenResume(t *testing.T) {
	h := newHarness(t)
	h.ready()
	h.store.onEndStep = func(wf *fakeWorkflow, index int, o activities.StepOutcome) {
		if index == 0 && o.OK {
			wf.run.PauseRequested = true
		}
	}
	paused := 50 * time.Minute // longer than the deploy's 40-minute deadline
	var during fakeWorkflow
	res := h.run(coremetal.Deploy, "", func(env *testsuite.TestWorkflowEnvironment) {
		env.RegisterDelayedCallback(func() {
			during = h.store.workflowOf(h.node)
			h.store.setPause(h.node, false, paused)
			env.SignalWorkflow(activities.SignalWorkflowChanged, nil)
		}, paused)
	})
	if res.Outcome != activities.OutcomeFinished || res.State != string(nodes.Deployed) {
		t.Fatalf("result %+v", res)
	}
	if during.run.State != provisioning.WorkflowPaused || !slices.Equal(during.begun, []string{"check-image#1"}) || during.pauses == 0 {
		t.Fatalf("while paused: workflow %s, begun %q, %d paused answers", during.run.State, during.begun, during.pauses)
	}
	if wf := h.store.workflowOf(h.node); wf.run.State != provisioning.WorkflowSucceeded || len(wf.begun) != len(wf.run.Steps) {
		t.Fatalf("after the resume: %s, begun %q", wf.run.State, wf.begun)
	}
}

// A step past its own timeout fails (its last attempt) with reason
// stepTimeout, and so does the node.
func TestStepTimeoutFailsWithStepTimeout(t *testing.T) {
	h := newHarness(t)
	h.ready()
	steps := provisioning.DefaultMetalSteps()
	steps[3].TimeoutSeconds, steps[3].Retry = 120, provisioning.Retry{MaxAttempts: 1}
	h.store.deploySteps = steps
	h.store.onRamdiskStep = func(_ *fakeBoot, st protocol.RamdiskStep) (protocol.RamdiskStepResult, bool) {
		return protocol.RamdiskStepResult{Name: st.Name, OK: true}, st.Name != protocol.StepWriteImage
	}
	res := h.run(coremetal.Deploy, "", nil)
	if res.Outcome != activities.OutcomeFailed || res.Reason != coremetal.ReasonStepTimeout || res.Step != "write-image" {
		t.Fatalf("result %+v", res)
	}
	if n := h.store.node(h.node); n.LastError.Reason != coremetal.ReasonStepTimeout || n.LastError.Step != "write-image" {
		t.Fatalf("last error %+v", n.LastError)
	}
	wf := h.store.workflowOf(h.node)
	if wf.run.Steps[3].State != provisioning.StepFailed || wf.outcomes[len(wf.outcomes)-1] != "write-image#1 final:stepTimeout" {
		t.Fatalf("write-image %s, outcomes %q", wf.run.Steps[3].State, wf.outcomes)
	}
}

// An abort before any destructive step started takes the node back to
// ready (the machine off, the boot ended) and ends the workflow aborted.
func TestAbortBeforeAnyDestructiveStepIsBackToReady(t *testing.T) {
	h := newHarness(t)
	h.ready()
	steps := provisioning.DefaultMetalSteps()
	settle := provisioning.Step{Name: "settle", On: provisioning.RunnerControlPlane, Action: provisioning.ActionSleep,
		Args: map[string]any{"seconds": 600}}
	h.store.deploySteps = slices.Insert(steps, 3, settle)
	var answer activities.LifecycleResult
	answered := false
	res := h.run(coremetal.Deploy, "", func(env *testsuite.TestWorkflowEnvironment) {
		abortAt(env, 5*time.Minute, &answer, &answered)
	})
	if !answered || answer.State != string(nodes.Ready) || res.State != string(nodes.Ready) || res.Reason != coremetal.ReasonAborted {
		t.Fatalf("abort answered %v %+v, result %+v", answered, answer, res)
	}
	n := h.store.node(h.node)
	if n.State != nodes.Ready || n.Operation != "" || n.LastError != nil || n.Power != nodes.PowerOff {
		t.Fatalf("node %s op %q power %s last error %+v", n.State, n.Operation, n.Power, n.LastError)
	}
	wf := h.store.workflowOf(h.node)
	if wf.run.State != provisioning.WorkflowAborted || wf.run.Steps[3].State != provisioning.StepAborted {
		t.Fatalf("workflow %s, settle %s", wf.run.State, wf.run.Steps[3].State)
	}
	if h.store.openBoots(h.node) != 0 || h.site.count("EndBoot off") != 3 {
		t.Fatalf("open boots %d, calls %v", h.store.openBoots(h.node), h.site.calls)
	}
}

// An abort while the ramdisk writes the image (a destructive step) fails
// the node with reason aborted at that step and ends the workflow aborted.
func TestAbortDuringWriteImageFails(t *testing.T) {
	h := newHarness(t)
	h.ready()
	h.store.onRamdiskStep = func(_ *fakeBoot, st protocol.RamdiskStep) (protocol.RamdiskStepResult, bool) {
		return protocol.RamdiskStepResult{Name: st.Name, OK: true}, st.Name != protocol.StepWriteImage
	}
	var answer activities.LifecycleResult
	answered := false
	res := h.run(coremetal.Deploy, "", func(env *testsuite.TestWorkflowEnvironment) {
		abortAt(env, 5*time.Minute, &answer, &answered)
	})
	if !answered || answer.Reason != coremetal.ReasonAborted || res.State != string(nodes.Failed) || res.Step != "write-image" {
		t.Fatalf("abort answered %v %+v, result %+v", answered, answer, res)
	}
	n := h.store.node(h.node)
	if n.State != nodes.Failed || n.LastError.Reason != coremetal.ReasonAborted || n.LastError.Step != "write-image" {
		t.Fatalf("node %s, last error %+v", n.State, n.LastError)
	}
	wf := h.store.workflowOf(h.node)
	if wf.run.State != provisioning.WorkflowAborted || wf.run.Steps[3].State != provisioning.StepAborted {
		t.Fatalf("workflow %s, write-image %s", wf.run.State, wf.run.Steps[3].State)
	}
	if h.site.powerOf(h.node) != "off" || h.store.openBoots(h.node) != 0 {
		t.Fatalf("power %s, open boots %d", h.site.powerOf(h.node), h.store.openBoots(h.node))
	}
}

// A run started again (the reconciler's) resumes from the persisted
// steps: the succeeded ones are skipped (the staged image is read back
// from its output), the boot is found again rather than made twice, and
// the step that was running starts a new attempt.
func TestRestartedRunResumesAtThePersistedStep(t *testing.T) {
	h := newHarness(t)
	h.ready()
	p := h.store.begin(h.node, coremetal.Deploy, "", time.Hour)
	h.store.mu.Lock()
	var wf *fakeWorkflow
	for _, w := range h.store.workflows {
		wf = w
	}
	for i := range 3 {
		wf.run.Steps[i].State, wf.run.Steps[i].Attempts = provisioning.StepSucceeded, 1
	}
	wf.run.Steps[1].Output = `{"url":"http://site_1.boot/images/node_1/abc","sha256":"abc","sizeBytes":42,"cached":false}`
	wf.run.Steps[3].State, wf.run.Steps[3].Attempts = provisioning.StepRunning, 1
	wf.run.State = provisioning.WorkflowRunning
	h.store.nodes[h.node].Step, h.store.nodes[h.node].WorkflowStarted = "write-image", true
	h.store.seq++
	boot := &fakeBoot{id: "boot_resumed", nodeID: h.node, opSeq: p.OpSeq, purpose: activities.PurposeDeploy, booted: true}
	boot.report("hk-node_1")
	h.store.boots[boot.id] = boot
	h.store.mu.Unlock()
	stages, boots := h.site.count("StageImage"), h.site.count("BootRamdisk deploy")

	res := h.runParams(p, nil)
	if res.Outcome != activities.OutcomeFinished || res.State != string(nodes.Deployed) {
		t.Fatalf("result %+v", res)
	}
	got := h.store.workflowOf(h.node)
	if !slices.Equal(got.begun, []string{"write-image#2", "write-seed#1", "boot-from-disk#1", "reboot#1"}) {
		t.Fatalf("the restarted run began %q", got.begun)
	}
	if h.site.count("StageImage") != stages || h.site.count("BootRamdisk deploy") != boots {
		t.Fatalf("the restarted run staged or booted again: %v", h.site.calls)
	}
	if wi := boot.handed[0]; wi.Name != protocol.StepWriteImage || wi.Args["url"] != "http://site_1.boot/images/node_1/abc" || wi.Args["sizeBytes"] != "42" {
		t.Fatalf("write-image handed %+v", wi)
	}
	if !boot.finished {
		t.Fatal("the resumed boot was not closed")
	}
}

// A refused image (check-image's answer) fails the deploy at once, for
// good, with nothing staged or booted.
func TestCheckImageRefusalBootsNothing(t *testing.T) {
	h := newHarness(t)
	h.ready()
	h.store.imageProblem = "image debian@12 is not verified and the pool requires verified images"
	res := h.run(coremetal.Deploy, "", nil)
	if res.Outcome != activities.OutcomeFailed || res.Step != "check-image" || !strings.Contains(res.Message, "not verified") {
		t.Fatalf("result %+v", res)
	}
	if h.site.count("StageImage") != 0 || h.site.count("BootRamdisk deploy") != 0 {
		t.Fatalf("calls %v", h.site.calls)
	}
	if wf := h.store.workflowOf(h.node); wf.run.Steps[0].Attempts != 1 {
		t.Fatalf("a refusal was retried: %d attempts", wf.run.Steps[0].Attempts)
	}
}

// An image whose bytes do not match its digest is refused by the site at
// staging: the step fails for good on its first attempt and nothing boots.
func TestTamperedImageFailsAtStaging(t *testing.T) {
	h := newHarness(t)
	h.ready()
	h.site.stageErr = temporal.NewNonRetryableApplicationError("image img_1: sha256 is 5e88…, want 9f86…", metal.ErrTypeDigestMismatch, nil)
	res := h.run(coremetal.Deploy, "", nil)
	if res.Outcome != activities.OutcomeFailed || res.Step != "stage-image" || !strings.Contains(res.Message, "want 9f86") {
		t.Fatalf("result %+v", res)
	}
	if h.site.count("StageImage") != 1 || h.site.count("BootRamdisk deploy") != 0 {
		t.Fatalf("calls %v", h.site.calls)
	}
	if wf := h.store.workflowOf(h.node); wf.run.Steps[1].Attempts != 1 || wf.run.Steps[1].State != provisioning.StepFailed {
		t.Fatalf("stage-image %+v", wf.run.Steps[1])
	}
}

// A node step after the re-join is a command to the node's agent, queued
// once per attempt and awaited; its output is the step's.
func TestNodeExecStepAwaitsTheCommand(t *testing.T) {
	h := newHarness(t)
	h.ready()
	h.store.deploySteps = append(provisioning.DefaultMetalSteps(),
		provisioning.Step{Name: "hello", On: provisioning.RunnerNode, Action: provisioning.ActionExec,
			Args: map[string]any{"argv": []any{"echo", "hello"}}},
		provisioning.Step{Name: "accept", On: provisioning.RunnerControlPlane, Action: provisioning.ActionAcceptance})
	reads := 0
	h.store.onNodeCommand = func(c *fakeCommand) {
		reads++
		if reads == 2 {
			c.outcome = activities.CommandOutcome{Done: true, OK: true, Output: "hello\n"}
		}
	}
	h.mustFinish(coremetal.Deploy, "", nodes.Deployed)
	wf := h.store.workflowOf(h.node)
	if out := wf.run.Steps[7].Output; out != "hello\n" {
		t.Fatalf("exec output %q", out)
	}
	if len(h.store.commands) != 1 {
		t.Fatalf("%d commands", len(h.store.commands))
	}
	for _, c := range h.store.commands {
		if c.key != wf.run.ID+"/hello/1" || c.kind != "exec" {
			t.Fatalf("command %+v", c)
		}
	}
}

// An output is kept to its last MaxOutputBytes, as valid UTF-8; a backoff
// doubles per attempt up to MaxBackoff.
func TestBoundedOutputAndBackoff(t *testing.T) {
	long := strings.Repeat("é", provisioning.MaxOutputBytes) // two bytes each
	if got := bounded(long); len(got) > provisioning.MaxOutputBytes || !utf8.ValidString(got) || !strings.HasSuffix(long, got) {
		t.Fatalf("bounded: %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	r := provisioning.Retry{MaxAttempts: 10, BackoffSeconds: 5}
	for n, want := range map[int]time.Duration{1: 5 * time.Second, 2: 10 * time.Second, 3: 20 * time.Second, 9: provisioning.MaxBackoff} {
		if got := backoff(r, n); got != want {
			t.Errorf("backoff after attempt %d: %v, want %v", n, got, want)
		}
	}
}

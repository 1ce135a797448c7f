package lifecycle

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/workflows/metal"
)

// The provisioning engine: StepProvision runs the operation's provisioning
// workflow (a deploy's, or the one a retry resumes) as its persisted
// steps, one attempt at a time, each begun and ended in the database, so
// a run the reconciler starts again resumes at the first step not
// succeeded.

// provisionState is what a run knows of its provisioning workflow.
type provisionState struct {
	wf *activities.WorkflowRun
	// destructive: a destructive step of the workflow started (in this
	// run or an earlier one), so an abort leaves the node failed.
	destructive bool
	// staged is the image the site staged (stage-image's output).
	staged *metal.StageImageResult
	// bootMine: bootID is this operation's boot (found or made by this
	// run), not an earlier operation's left open.
	bootMine bool
	// paused: the workflow is held by a pause (the deadline waits).
	paused bool
	// changed: a workflow-changed signal arrived since the last read.
	changed bool
}

// provision runs the operation's provisioning workflow from its first
// step not succeeded.
func (l *lifecycle) provision(ctx workflow.Context) error {
	if err := l.loadWorkflow(ctx); err != nil {
		return err
	}
	for i := range l.prov.wf.Steps {
		if l.prov.wf.Steps[i].State == provisioning.StepSucceeded {
			continue
		}
		if err := l.runStep(ctx, i); err != nil {
			return err
		}
	}
	return nil
}

// loadWorkflow reads the operation's workflow once per run.
func (l *lifecycle) loadWorkflow(ctx workflow.Context) error {
	if l.prov.wf != nil {
		return nil
	}
	lc := localControlPlane(ctx)
	var wf activities.WorkflowRun
	if err := workflow.ExecuteLocalActivity(lc, activities.ActivityLoadWorkflow, l.p).Get(lc, &wf); err != nil {
		if isType(err, string(core.CodeNotFound)) {
			return &stepError{code: string(core.CodeInvalidState), reason: coremetal.ReasonStepFailed,
				message: fmt.Sprintf("%s has no provisioning workflow", l.lc.Operation)}
		}
		return err
	}
	l.prov.wf = &wf
	for _, st := range wf.Steps {
		if destructive(st.Step) && (st.Attempts > 0 || st.State != provisioning.StepPending) {
			l.prov.destructive = true
		}
		if st.Action == provisioning.ActionStageImage && st.State == provisioning.StepSucceeded {
			var staged metal.StageImageResult
			if json.Unmarshal([]byte(st.Output), &staged) == nil && staged.URL != "" {
				l.prov.staged = &staged
			}
		}
	}
	return nil
}

func destructive(s provisioning.Step) bool {
	a, ok := provisioning.ActionOf(s.On, s.Action)
	return ok && a.Destructive
}

func (l *lifecycle) stepRef(i int) activities.StepRef {
	return activities.StepRef{TenantID: l.p.TenantID, WorkflowID: l.prov.wf.ID, OpSeq: l.p.OpSeq, Index: i}
}

// runStep runs step i to its end: its attempts by its retry policy, each
// begun and ended in the database. A final failure is the error.
func (l *lifecycle) runStep(ctx workflow.Context, i int) error {
	st := &l.prov.wf.Steps[i]
	lc := localControlPlane(ctx)
	maxAttempts := max(st.Retry.MaxAttempts, 1)
	for {
		start, err := l.beginStep(ctx, i)
		if err != nil {
			return err
		}
		l.step, st.Attempts, st.State = st.Name, start.Attempt, provisioning.StepRunning
		if destructive(st.Step) {
			l.prov.destructive = true
		}
		out, err := l.attempt(ctx, st)
		if l.aborting || l.expired {
			return workflow.ErrCanceled
		}
		if err == nil {
			if err := workflow.ExecuteLocalActivity(lc, activities.ActivityEndStep, l.stepRef(i),
				activities.StepOutcome{OK: true, Output: bounded(out)}).Get(lc, nil); err != nil {
				return err
			}
			st.State, st.Output = provisioning.StepSucceeded, out
			return nil
		}
		se := classify(err, l.lc.SiteID)
		final := se.final || start.Attempt >= maxAttempts
		if out == "" {
			out = se.message
		}
		if err := workflow.ExecuteLocalActivity(lc, activities.ActivityEndStep, l.stepRef(i), activities.StepOutcome{Final: final,
			Output: bounded(out), Error: se.message, Reason: se.reason}).Get(lc, nil); err != nil {
			return err
		}
		if final {
			return se
		}
		workflow.GetLogger(ctx).Info("step attempt failed", "node", l.p.NodeID, "step", st.Name,
			"attempt", start.Attempt, "error", se.message)
		if err := workflow.NewTimerWithOptions(ctx, backoff(st.Retry, start.Attempt),
			workflow.TimerOptions{Summary: "retry " + st.Name}).Get(ctx, nil); err != nil {
			return err
		}
	}
}

// backoff is the wait after attempt n failed: BackoffSeconds doubling per
// attempt, at most provisioning.MaxBackoff.
func backoff(r provisioning.Retry, n int) time.Duration {
	d := time.Duration(r.BackoffSeconds) * time.Second
	for k := 1; k < n && d < provisioning.MaxBackoff; k++ {
		d *= 2
	}
	return max(min(d, provisioning.MaxBackoff), time.Millisecond)
}

// bounded keeps the end of an output (where a failure says why) within
// provisioning.MaxOutputBytes, as valid UTF-8 (a cut may split a rune).
func bounded(s string) string {
	if len(s) > provisioning.MaxOutputBytes {
		s = s[len(s)-provisioning.MaxOutputBytes:]
	}
	return strings.ToValidUTF8(s, "")
}

// beginStep begins an attempt of step i; while a pause holds the workflow
// it waits (for the workflow-changed signal or the next poll) and asks
// again. The deadline follows the row's, which a resume pushes.
func (l *lifecycle) beginStep(ctx workflow.Context, i int) (activities.StepStart, error) {
	lc := localControlPlane(ctx)
	for {
		l.prov.changed = false
		var ss activities.StepStart
		if err := workflow.ExecuteLocalActivity(lc, activities.ActivityBeginStep, l.stepRef(i)).Get(lc, &ss); err != nil {
			return ss, err
		}
		if !ss.Deadline.IsZero() {
			l.deadline = ss.Deadline
		}
		l.prov.paused = ss.Paused
		if !ss.Paused {
			return ss, nil
		}
		if _, err := workflow.AwaitWithOptions(ctx, workflow.AwaitOptions{Timeout: BootPoll,
			TimerOptions: workflow.TimerOptions{Summary: "paused"}},
			func() bool { return l.prov.changed }); err != nil {
			return ss, err
		}
	}
}

// attempt runs one attempt of a step under the step's timeout, and its
// rejoin wait when it awaits one. It answers the attempt's output.
func (l *lifecycle) attempt(ctx workflow.Context, st *activities.StepRun) (string, error) {
	timeout := st.Timeout()
	if timeout <= 0 {
		timeout = provisioning.WithDefaults(st.Step).Timeout()
	}
	actx, cancel := workflow.WithCancel(ctx)
	defer cancel()
	timedOut := false
	workflow.Go(actx, func(gctx workflow.Context) {
		if err := workflow.NewTimerWithOptions(gctx, timeout, workflow.TimerOptions{Summary: "timeout " + st.Name}).Get(gctx, nil); err == nil {
			timedOut = true
			cancel()
		}
	})
	out, err := l.act(actx, st)
	if err == nil && st.Await == provisioning.AwaitRejoin {
		err = l.awaitRejoin(actx)
	}
	if err != nil && timedOut {
		return out, &stepError{code: string(core.CodeUnavailable), reason: coremetal.ReasonStepTimeout,
			message: fmt.Sprintf("step %s ran past its timeout of %s", st.Name, timeout)}
	}
	return out, err
}

// act runs a step's action on its runner.
func (l *lifecycle) act(ctx workflow.Context, st *activities.StepRun) (string, error) {
	switch st.On {
	case provisioning.RunnerControlPlane:
		return l.actControlPlane(ctx, st)
	case provisioning.RunnerSite:
		return l.actSite(ctx, st)
	case provisioning.RunnerRamdisk:
		return l.actRamdisk(ctx, st)
	case provisioning.RunnerNode:
		return l.actNode(ctx, st)
	}
	return "", finalErr(coremetal.ReasonStepFailed, fmt.Sprintf("step %s: unknown runner %q", st.Name, st.On))
}

// localControlPlane are the options of the provisioning steps' database
// calls: local activities of the control-plane worker (each one short
// transaction), so each is one marker in the history, not three events
// and a workflow task; retried until it lands, except a fenced write.
func localControlPlane(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{MaximumInterval: 30 * time.Second,
			NonRetryableErrorTypes: []string{activities.ErrTypeStale, string(core.CodeNotFound)}},
	})
}

// finalErr is a failure no retry can fix.
func finalErr(reason, message string) *stepError {
	return &stepError{code: string(core.CodeInvalidState), reason: reason, message: message, final: true}
}

func (l *lifecycle) actControlPlane(ctx workflow.Context, st *activities.StepRun) (string, error) {
	lc := localControlPlane(ctx)
	switch st.Action {
	case provisioning.ActionSleep:
		secs, err := intArg(st.Args, "seconds")
		if err != nil || secs < 1 {
			return "", finalErr(coremetal.ReasonStepFailed, fmt.Sprintf("step %s: seconds must be a positive number", st.Name))
		}
		if err := workflow.NewTimerWithOptions(ctx, time.Duration(secs)*time.Second,
			workflow.TimerOptions{Summary: "sleep " + st.Name}).Get(ctx, nil); err != nil {
			return "", err
		}
		return fmt.Sprintf("slept %ds", secs), nil
	case provisioning.ActionCheckImage:
		var why string
		if err := workflow.ExecuteLocalActivity(lc, activities.ActivityCheckImage, l.p.TenantID, l.prov.wf.ID).Get(lc, &why); err != nil {
			return "", err
		}
		if why != "" {
			return why, finalErr(coremetal.ReasonStepFailed, why)
		}
		return "the image is deployable", nil
	case provisioning.ActionAcceptance:
		var failures []string
		if err := workflow.ExecuteLocalActivity(lc, activities.ActivityAccept, l.p.TenantID, l.prov.wf.ID).Get(lc, &failures); err != nil {
			return "", err
		}
		if len(failures) > 0 {
			msg := "acceptance failed: " + strings.Join(failures, "; ")
			return msg, finalErr(coremetal.ReasonStepFailed, msg)
		}
		return "every acceptance check holds", nil
	}
	return "", finalErr(coremetal.ReasonStepFailed, fmt.Sprintf("step %s: unknown control-plane action %q", st.Name, st.Action))
}

// provisionSite are the site activities' options for a step: l.site()'s,
// with a start-to-close that lets a long step (staging an image) finish
// within the step's own timeout; the heartbeat finds a dead agent.
func (l *lifecycle) provisionSite(ctx workflow.Context, st *activities.StepRun) workflow.Context {
	ctx = l.site(ctx)
	opts := workflow.GetActivityOptions(ctx)
	opts.StartToCloseTimeout = max(siteStartToClose, st.Timeout())
	return workflow.WithActivityOptions(ctx, opts)
}

func (l *lifecycle) actSite(ctx workflow.Context, st *activities.StepRun) (string, error) {
	sctx := l.provisionSite(ctx, st)
	m := l.machine()
	switch st.Action {
	case provisioning.ActionStageImage:
		img := l.prov.wf.Context.Image
		if img == nil {
			return "", finalErr(coremetal.ReasonStepFailed, "the workflow names no image to stage")
		}
		var res metal.StageImageResult
		if err := workflow.ExecuteActivity(sctx, metal.ActivityStageImage, metal.StageImageRequest{Machine: m,
			ImageID: img.ID, Format: img.Format, SHA256: img.SHA256, SizeBytes: img.SizeBytes}).Get(sctx, &res); err != nil {
			if isType(err, metal.ErrTypeDigestMismatch) {
				se := classify(err, l.lc.SiteID)
				return "", finalErr(coremetal.ReasonStepFailed, se.message)
			}
			return "", err
		}
		l.prov.staged = &res
		out, err := json.Marshal(res)
		if err != nil {
			return "", err
		}
		return string(out), nil
	case provisioning.ActionBootRamdisk:
		if _, err := l.ownBoot(ctx); err != nil {
			return "", err
		}
		return l.bootRamdisk(ctx, st, stringArg(st.Args, "via"))
	case provisioning.ActionSetBootDevice:
		device := stringArg(st.Args, "device")
		persistent := true
		if v, ok := st.Args["persistent"].(bool); ok {
			persistent = v
		} else if s := stringArg(st.Args, "persistent"); s != "" {
			persistent = s != "false"
		}
		if err := workflow.ExecuteActivity(sctx, metal.ActivitySetBootDevice,
			metal.BootDeviceRequest{Machine: m, Device: device, Persistent: persistent}).Get(sctx, nil); err != nil {
			return "", err
		}
		return fmt.Sprintf("boot device %s (persistent %v)", device, persistent), nil
	case provisioning.ActionPower:
		action := stringArg(st.Args, "action")
		if err := l.powerAction(sctx, action); err != nil {
			return "", err
		}
		if err := l.setPower(ctx, l.power); err != nil {
			return "", err
		}
		return "power " + l.power, nil
	}
	return "", finalErr(coremetal.ReasonStepFailed, fmt.Sprintf("step %s: unknown site action %q", st.Name, st.Action))
}

// ownBoot makes this operation's deploy boot, or finds it again (a run
// started again never makes a second one), and answers whether it was
// already the open boot. An earlier operation's boot left open (a retry
// of a failed deploy) is closed: its token is refused from then on.
func (l *lifecycle) ownBoot(ctx workflow.Context) (bool, error) {
	prev := l.bootID
	if err := l.newBoot(ctx); err != nil {
		return false, err
	}
	l.prov.bootMine = true
	if prev != "" && prev != l.bootID {
		if err := l.closeBoot(ctx, prev); err != nil {
			return false, err
		}
	}
	return prev == l.bootID, nil
}

// bootRamdisk boots the machine into the boot's ramdisk.
func (l *lifecycle) bootRamdisk(ctx workflow.Context, st *activities.StepRun, via string) (string, error) {
	sctx := l.provisionSite(ctx, st)
	var br metal.BootResult
	if err := workflow.ExecuteActivity(sctx, metal.ActivityBootRamdisk,
		metal.BootRequest{Machine: l.machine(), BootID: l.bootID, Purpose: purposeOf(l.lc.Operation), Via: via}).Get(sctx, &br); err != nil {
		return "", err
	}
	l.power = br.Power
	return fmt.Sprintf("boot %s started via %s", l.bootID, br.Via), nil
}

// actRamdisk hands the step to the open boot's ramdisk and waits for its
// result. Without a boot of this operation open (a retry, or a machine
// whose boot ended), it boots one first; the NoCloud seed holds the boot's
// token the installed system joins with, so a seed an earlier boot wrote
// is written again in the new one before a later step runs.
func (l *lifecycle) actRamdisk(ctx workflow.Context, st *activities.StepRun) (string, error) {
	var out strings.Builder
	if !l.prov.bootMine {
		open, err := l.ownBoot(ctx)
		if err != nil {
			return "", err
		}
		if !open {
			msg, err := l.bootRamdisk(ctx, st, "")
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&out, "no ramdisk boot of this operation was open: %s\n", msg)
			if err := l.awaitBoot(ctx, func(p activities.BootProgress) bool { return p.Reported }); err != nil {
				return out.String(), err
			}
			if seed := l.seedBefore(st); seed != nil {
				msg, err := l.onRamdisk(ctx, seed)
				if err != nil {
					return out.String(), err
				}
				fmt.Fprintf(&out, "the seed was written again for boot %s: %s\n", l.bootID, msg)
			}
		}
	}
	msg, err := l.onRamdisk(ctx, st)
	out.WriteString(msg)
	return out.String(), err
}

// seedBefore is the write-seed step that succeeded before st, if any.
func (l *lifecycle) seedBefore(st *activities.StepRun) *activities.StepRun {
	var seed *activities.StepRun
	for i := range l.prov.wf.Steps {
		s := &l.prov.wf.Steps[i]
		if s.Name == st.Name {
			return seed
		}
		if s.On == provisioning.RunnerRamdisk && s.Action == provisioning.ActionWriteSeed && s.State == provisioning.StepSucceeded {
			seed = s
		}
	}
	return nil
}

// onRamdisk hands one step to the boot's ramdisk and awaits its result.
func (l *lifecycle) onRamdisk(ctx workflow.Context, st *activities.StepRun) (string, error) {
	step, err := l.ramdiskStep(st)
	if err != nil {
		return "", err
	}
	lc := localControlPlane(ctx)
	if err := workflow.ExecuteLocalActivity(lc, activities.ActivityHandRamdiskStep, l.p.TenantID, l.bootID, step).Get(lc, nil); err != nil {
		return "", err
	}
	var result protocol.RamdiskStepResult
	err = l.awaitProgress(ctx, func(p activities.BootProgress) (bool, error) {
		for _, r := range p.Results {
			if r.Name == step.Name {
				result = r
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return "", err
	}
	if !result.OK {
		return result.Message, &stepError{code: string(core.CodeInternal), reason: coremetal.ReasonStepFailed,
			message: fmt.Sprintf("ramdisk step %s failed: %s", step.Name, result.Message)}
	}
	return result.Message, nil
}

// ramdiskStep is the step as the ramdisk takes it: string arguments (a
// list or an object as its JSON); write-image's the staged image's and the
// root device hints.
func (l *lifecycle) ramdiskStep(st *activities.StepRun) (protocol.RamdiskStep, error) {
	args := map[string]string{}
	for k, v := range st.Args {
		if s, ok := v.(string); ok {
			args[k] = s
			continue
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return protocol.RamdiskStep{}, finalErr(coremetal.ReasonStepFailed, fmt.Sprintf("step %s: argument %s: %v", st.Name, k, err))
		}
		args[k] = string(raw)
	}
	if st.Action == provisioning.ActionWriteImage || st.Action == provisioning.ActionWriteSeed {
		if rd := l.prov.wf.Context.RootDevice; rd != nil && args["rootDevice"] == "" {
			if rd.Name != "" {
				args["rootDevice"] = rd.Name
			} else if rd.Serial != "" {
				args["rootDevice"] = rd.Serial
			}
			if rd.MinSizeGiB > 0 {
				args["minSizeBytes"] = strconv.FormatInt(int64(rd.MinSizeGiB)<<30, 10)
			}
		}
	}
	if st.Action == provisioning.ActionWriteImage {
		if l.prov.staged == nil {
			return protocol.RamdiskStep{}, finalErr(coremetal.ReasonStepFailed,
				fmt.Sprintf("step %s: no image was staged (a stage-image step must succeed before it)", st.Name))
		}
		args["url"] = l.prov.staged.URL
		args["sha256"] = l.prov.staged.SHA256
		args["sizeBytes"] = strconv.FormatInt(l.prov.staged.SizeBytes, 10)
	}
	// A seed written in a boot other than the image's finds the disk by
	// write-image's rule for the staged size.
	if st.Action == provisioning.ActionWriteSeed && l.prov.staged != nil {
		args["sizeBytes"] = strconv.FormatInt(l.prov.staged.SizeBytes, 10)
	}
	if len(args) == 0 {
		args = nil
	}
	return protocol.RamdiskStep{Name: st.Action, Args: args}, nil
}

// awaitRejoin waits until the installed system's agent joined with the
// boot's token, then closes the boot without powering the machine off. A
// join refused for its hardware key fails the step for good.
func (l *lifecycle) awaitRejoin(ctx workflow.Context) error {
	if l.bootID == "" {
		return finalErr(coremetal.ReasonStepFailed, "no boot to await the re-join of")
	}
	if err := l.awaitProgress(ctx, func(p activities.BootProgress) (bool, error) {
		if p.JoinError != "" {
			return false, &stepError{code: string(core.CodeConflict), reason: coremetal.ReasonHardwareMismatch,
				message: p.JoinError, final: true}
		}
		return p.Joined, nil
	}); err != nil {
		return err
	}
	return l.endBoot(ctx, false)
}

// nodeCommandKind is the node command an exec step sends.
const nodeCommandKind = "exec"

func (l *lifecycle) actNode(ctx workflow.Context, st *activities.StepRun) (string, error) {
	if st.Action != provisioning.ActionExec {
		return "", finalErr(coremetal.ReasonStepFailed, fmt.Sprintf("step %s: unknown node action %q", st.Name, st.Action))
	}
	lc := localControlPlane(ctx)
	// One command per attempt: a retried activity finds its command, a
	// new attempt sends a new one.
	key := fmt.Sprintf("%s/%s/%d", l.prov.wf.ID, st.Name, st.Attempts)
	var id string
	if err := workflow.ExecuteLocalActivity(lc, activities.ActivityEnqueueNodeCommand, activities.NodeCommandRequest{TenantID: l.p.TenantID,
		NodeID: l.p.NodeID, Key: key, Kind: nodeCommandKind, Args: st.Args}).Get(lc, &id); err != nil {
		return "", err
	}
	for {
		var co activities.CommandOutcome
		if err := workflow.ExecuteLocalActivity(lc, activities.ActivityNodeCommand, l.p.TenantID, id).Get(lc, &co); err != nil {
			return "", err
		}
		if co.Done {
			if !co.OK {
				msg := co.Error
				if msg == "" {
					msg = "the command failed"
				}
				return co.Output, &stepError{code: string(core.CodeInternal), reason: coremetal.ReasonStepFailed,
					message: fmt.Sprintf("command %s: %s", id, msg)}
			}
			return co.Output, nil
		}
		if err := workflow.NewTimerWithOptions(ctx, BootPoll, workflow.TimerOptions{Summary: "await command"}).Get(ctx, nil); err != nil {
			return "", err
		}
	}
}

// awaitProgress waits on the boot's progress until done says so (or
// fails): it reads the boot row, then waits for the boot-reported signal
// or the next poll.
func (l *lifecycle) awaitProgress(ctx workflow.Context, done func(activities.BootProgress) (bool, error)) error {
	lc := localControlPlane(ctx)
	purpose := purposeOf(l.lc.Operation)
	for {
		l.signalled = false
		var bp activities.BootProgress
		if err := workflow.ExecuteLocalActivity(lc, activities.ActivityBootProgress, l.p.TenantID, l.bootID, purpose).Get(lc, &bp); err != nil {
			return err
		}
		ok, err := done(bp)
		if err != nil || ok {
			return err
		}
		if _, err := workflow.AwaitWithOptions(ctx, workflow.AwaitOptions{Timeout: BootPoll,
			TimerOptions: workflow.TimerOptions{Summary: "await ramdisk"}},
			func() bool { return l.signalled }); err != nil {
			return err
		}
	}
}

func stringArg(args map[string]any, name string) string {
	switch v := args[name].(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

func intArg(args map[string]any, name string) (int, error) {
	switch v := args[name].(type) {
	case float64:
		return int(v), nil
	case int:
		return v, nil
	case int64:
		return int(v), nil
	case string:
		return strconv.Atoi(v)
	case json.Number:
		n, err := v.Int64()
		return int(n), err
	}
	return 0, fmt.Errorf("%s is not a number", name)
}

// abortEnd ends an aborted operation that runs a provisioning workflow:
// back where it started when no destructive step of the workflow started
// (the workflow aborted), else failed with reason aborted.
func (l *lifecycle) abortEnd(ctx workflow.Context) (activities.LifecycleResult, error) {
	msg := fmt.Sprintf("%s aborted at step %s", l.lc.Operation, l.step)
	if l.prov.wf == nil {
		// An abort before the workflow was read: read it to know whether
		// an earlier run of it wrote anything.
		if err := l.loadWorkflow(ctx); err != nil {
			workflow.GetLogger(ctx).Warn("could not read the provisioning workflow after an abort", "node", l.p.NodeID, "error", err)
		}
	}
	if l.prov.wf == nil || l.prov.destructive {
		return l.fail(ctx, &stepError{code: string(core.CodeInvalidState), reason: coremetal.ReasonAborted,
			message: msg, workflowState: provisioning.WorkflowAborted})
	}
	// A retry starts from failed: safe, it goes where a recover would.
	origin := l.lc.Origin
	if origin == nodes.Failed {
		origin = l.edge.RecoveryFrom(origin)
	}
	f := activities.Finish{TenantID: l.p.TenantID, NodeID: l.p.NodeID, OpSeq: l.p.OpSeq, State: origin,
		WorkflowState: provisioning.WorkflowAborted}
	if l.power != "" {
		f.Power = activities.NormalPower(l.power)
	}
	cp := controlPlane(ctx)
	var a *activities.Metal
	if err := workflow.ExecuteActivity(cp, a.FinishOperation, f).Get(cp, nil); err != nil {
		return l.endOn(ctx, err)
	}
	l.publish(ctx, string(origin))
	return activities.LifecycleResult{Outcome: activities.OutcomeFinished, State: string(origin), Power: l.power,
		Reason: coremetal.ReasonAborted, Step: l.step, Message: msg + " before anything was written; back to " + string(origin)}, nil
}

// runsProvisioning says whether the operation runs a provisioning workflow.
func (l *lifecycle) runsProvisioning() bool {
	for _, s := range l.edge.Steps {
		if s == coremetal.StepProvision {
			return true
		}
	}
	return false
}

// workflowChanged listens for the workflow-changed signal.
func (l *lifecycle) workflowChanged(ctx workflow.Context) {
	workflow.Go(ctx, func(ctx workflow.Context) {
		ch := workflow.GetSignalChannel(ctx, activities.SignalWorkflowChanged)
		for {
			ch.Receive(ctx, nil)
			l.prov.changed = true
		}
	})
}

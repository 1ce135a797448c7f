package lifecycle

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/worker"

	activities "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/workflows/metal"
)

// The fake store's provisioning workflows: an in-memory
// activities.ProvisionStore with store/workflows' rules (writes fenced by
// the operation's op_seq, a pause taken at the next BeginStep, one
// command per key), under the fake store's lock, so a workflow's steps and
// the node's step move together.

// fakeWorkflow is one provisioning workflow.
type fakeWorkflow struct {
	run   activities.WorkflowRun
	opSeq int64
	// outcomes records every EndStep, in order ("name#attempt ok|fail|final").
	outcomes []string
	// begun records every BeginStep that started an attempt ("name#attempt").
	begun []string
	// pauses counts the BeginSteps answered Paused.
	pauses int
}

// fakeCommand is a node command.
type fakeCommand struct {
	id, key, kind string
	args          map[string]any
	outcome       activities.CommandOutcome
}

// image is the image every fake workflow writes.
var fakeImage = provisioning.ImageRef{ID: "img_1", TenantID: "ten_a", Name: "debian", Version: "12", Format: "raw",
	SHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", SizeBytes: 64 << 20, Verified: true}

// newWorkflow creates the workflow of the node's operation opSeq with steps
// (the default metal steps when nil), as metal.deploy does. Call with s.mu
// held.
func (s *fakeStore) newWorkflow(nodeID, tenantID string, opSeq int64, steps []provisioning.Step) *fakeWorkflow {
	if steps == nil {
		steps = provisioning.DefaultMetalSteps()
	}
	s.seq++
	wf := &fakeWorkflow{opSeq: opSeq, run: activities.WorkflowRun{ID: fmt.Sprintf("wf_%d", s.seq), TenantID: tenantID,
		NodeID: nodeID, State: provisioning.WorkflowPending,
		Context: provisioning.Context{ProfileID: "prof_1", ProfileVersion: 1, Target: "metal", Image: &fakeImage,
			RootDevice: &provisioning.RootDevice{Name: "vda"}}}}
	for _, st := range steps {
		wf.run.Steps = append(wf.run.Steps, activities.StepRun{Step: provisioning.WithDefaults(st), State: provisioning.StepPending})
	}
	s.workflows[wf.run.ID] = wf
	return wf
}

// retryWorkflow moves the node's failed workflow to the retry operation
// opSeq, its failed step and the rest back to pending (attempts kept), as
// workflows.retry does. Call with s.mu held.
func (s *fakeStore) retryWorkflow(nodeID string, opSeq int64) {
	for _, wf := range s.workflows {
		if wf.run.NodeID != nodeID || wf.run.State != provisioning.WorkflowFailed {
			continue
		}
		wf.opSeq, wf.run.State = opSeq, provisioning.WorkflowPending
		for i := range wf.run.Steps {
			if wf.run.Steps[i].State != provisioning.StepSucceeded {
				wf.run.Steps[i].State = provisioning.StepPending
			}
		}
		return
	}
	panic("no failed workflow to retry on " + nodeID)
}

// workflowOf answers a copy of the node's latest workflow.
func (s *fakeStore) workflowOf(nodeID string) fakeWorkflow {
	s.mu.Lock()
	defer s.mu.Unlock()
	var last *fakeWorkflow
	for _, wf := range s.workflows {
		if wf.run.NodeID == nodeID && (last == nil || wf.opSeq > last.opSeq || (wf.opSeq == last.opSeq && wf.run.ID > last.run.ID)) {
			last = wf
		}
	}
	if last == nil {
		return fakeWorkflow{}
	}
	out := *last
	out.run.Steps = slices.Clone(last.run.Steps)
	out.outcomes, out.begun = slices.Clone(last.outcomes), slices.Clone(last.begun)
	return out
}

// setPause requests (or lifts) a pause of the node's workflows; a lift
// pushes the node's deadline by pushBy, as workflows.resume does.
func (s *fakeStore) setPause(nodeID string, pause bool, pushBy time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, wf := range s.workflows {
		if wf.run.NodeID == nodeID && provisioning.Live(wf.run.State) {
			wf.run.PauseRequested = pause
			if !pause && wf.run.State == provisioning.WorkflowPaused {
				wf.run.State = provisioning.WorkflowRunning
			}
		}
	}
	if n, ok := s.nodes[nodeID]; ok && !pause && !n.Deadline.IsZero() {
		n.Deadline = n.Deadline.Add(pushBy)
	}
}

// endWorkflow ends the workflow of the node's operation opSeq as Finish or
// Fail does. Call with s.mu held.
func (s *fakeStore) endWorkflow(nodeID string, opSeq int64, state string) {
	for _, wf := range s.workflows {
		if wf.run.NodeID != nodeID || wf.opSeq != opSeq || !provisioning.Live(wf.run.State) {
			continue
		}
		wf.run.State = state
		for i := range wf.run.Steps {
			if wf.run.Steps[i].State == provisioning.StepRunning {
				if state == provisioning.WorkflowAborted {
					wf.run.Steps[i].State = provisioning.StepAborted
				} else {
					wf.run.Steps[i].State = provisioning.StepFailed
				}
			}
		}
	}
}

// fencedWorkflow finds the workflow and checks that opSeq is its
// operation and still in flight (when the fake store holds the node).
func (s *fakeStore) fencedWorkflow(tenantID, workflowID string, opSeq int64) (*fakeWorkflow, error) {
	wf, ok := s.workflows[workflowID]
	if !ok || wf.run.TenantID != tenantID {
		return nil, activities.ErrNotFound
	}
	if wf.opSeq != opSeq {
		return nil, activities.ErrStale
	}
	if _, ok := s.nodes[wf.run.NodeID]; ok {
		if _, err := s.inFlight(tenantID, wf.run.NodeID, opSeq); err != nil {
			return nil, err
		}
	}
	return wf, nil
}

func (s *fakeStore) LoadWorkflow(_ context.Context, tenantID, nodeID string, opSeq int64) (activities.WorkflowRun, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, wf := range s.workflows {
		if wf.run.TenantID == tenantID && wf.run.NodeID == nodeID && wf.opSeq == opSeq {
			run := wf.run
			run.Steps = slices.Clone(wf.run.Steps)
			return run, nil
		}
	}
	return activities.WorkflowRun{}, activities.ErrNotFound
}

func (s *fakeStore) BeginStep(_ context.Context, tenantID, workflowID string, opSeq int64, index int) (activities.StepStart, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	wf, err := s.fencedWorkflow(tenantID, workflowID, opSeq)
	if err != nil {
		return activities.StepStart{}, err
	}
	var deadline time.Time
	n, hasNode := s.nodes[wf.run.NodeID]
	if hasNode {
		deadline = n.Deadline
	}
	if wf.run.PauseRequested {
		wf.run.State = provisioning.WorkflowPaused
		wf.pauses++
		return activities.StepStart{Paused: true, Deadline: deadline}, nil
	}
	st := &wf.run.Steps[index]
	st.State = provisioning.StepRunning
	st.Attempts++
	wf.run.State = provisioning.WorkflowRunning
	wf.begun = append(wf.begun, fmt.Sprintf("%s#%d", st.Name, st.Attempts))
	if hasNode {
		n.Step = st.Name
	}
	return activities.StepStart{Attempt: st.Attempts, Deadline: deadline}, nil
}

func (s *fakeStore) EndStep(_ context.Context, tenantID, workflowID string, opSeq int64, index int, o activities.StepOutcome) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	wf, err := s.fencedWorkflow(tenantID, workflowID, opSeq)
	if err != nil {
		return err
	}
	st := &wf.run.Steps[index]
	st.Output, st.Error = o.Output, o.Error
	what := "ok"
	switch {
	case o.OK:
		st.State = provisioning.StepSucceeded
	case o.Final:
		st.State, what = provisioning.StepFailed, "final"
	default:
		what = "fail"
	}
	if !o.OK && o.Reason != "" {
		what += ":" + o.Reason
	}
	wf.outcomes = append(wf.outcomes, fmt.Sprintf("%s#%d %s", st.Name, st.Attempts, what))
	if s.onEndStep != nil {
		s.onEndStep(wf, index, o)
	}
	return nil
}

func (s *fakeStore) CheckImage(_ context.Context, tenantID, workflowID string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if wf, ok := s.workflows[workflowID]; !ok || wf.run.TenantID != tenantID {
		return "", activities.ErrNotFound
	}
	return s.imageProblem, nil
}

func (s *fakeStore) Accept(_ context.Context, tenantID, workflowID string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if wf, ok := s.workflows[workflowID]; !ok || wf.run.TenantID != tenantID {
		return nil, activities.ErrNotFound
	}
	return slices.Clone(s.acceptFailures), nil
}

func (s *fakeStore) EnqueueNodeCommand(_ context.Context, _, nodeID, key, kind string, args map[string]any) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.commands {
		if c.key == key {
			return c.id, nil
		}
	}
	s.seq++
	c := &fakeCommand{id: fmt.Sprintf("cmd_%d", s.seq), key: key, kind: kind, args: args}
	s.commands[c.id] = c
	return c.id, nil
}

func (s *fakeStore) NodeCommand(_ context.Context, _, commandID string) (activities.CommandOutcome, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.commands[commandID]
	if !ok {
		return activities.CommandOutcome{}, activities.ErrNotFound
	}
	if s.onNodeCommand != nil {
		s.onNodeCommand(c)
	}
	return c.outcome, nil
}

// runRamdisk is a deploy boot's ramdisk taking the steps it was handed,
// on a read of its row: each gets the result onRamdiskStep says (or an OK
// one), until one is not done yet; a reboot that succeeded boots the
// installed system, whose agent joins with the boot's token (refused when
// the machine's hardware key is not the node's). Call with s.mu held.
func (s *fakeStore) runRamdisk(b *fakeBoot) {
	if b.purpose != activities.PurposeDeploy || !b.reported || b.finished {
		return
	}
	for len(b.results) < len(b.steps) {
		st := b.steps[len(b.results)]
		res := protocol.RamdiskStepResult{Name: st.Name, OK: true, Message: st.Name + " done", DurationMs: 5}
		if s.onRamdiskStep != nil {
			r, done := s.onRamdiskStep(b, st)
			if !done {
				return
			}
			res = r
		}
		b.results = append(b.results, res)
		b.handed = append(b.handed, st)
		if st.Name == protocol.StepReboot && res.OK && !s.noJoin {
			if want := s.nodes[b.nodeID].HardwareKey; want != "" && want != b.hardwareKey {
				b.joinError = fmt.Sprintf("the machine joined with hardware key %s, not the node's %s", b.hardwareKey, want)
			} else {
				b.joined = true
			}
		}
	}
}

// registerFakeSite registers the fake site's activities under the names
// the workflow calls (workflows/metal), not through metal.RegisterAgent:
// the fake serves the provisioning activities as well, whatever the
// agent's interface holds.
func registerFakeSite(r worker.ActivityRegistry, f *fakeSite) {
	for name, fn := range map[string]any{
		metal.ActivityVerifyBMC:     f.VerifyBMC,
		metal.ActivityPower:         f.Power,
		metal.ActivityInspectOOB:    f.InspectOOB,
		metal.ActivityBootRamdisk:   f.BootRamdisk,
		metal.ActivityEndBoot:       f.EndBoot,
		metal.ActivityResetBIOS:     f.ResetBIOS,
		metal.ActivityConsoleLog:    f.ConsoleLog,
		metal.ActivityStageImage:    f.StageImage,
		metal.ActivitySetBootDevice: f.SetBootDevice,
	} {
		r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
}

// StageImage stages the image on the simulated site: stageErr, when set,
// is its answer.
func (f *fakeSite) StageImage(_ context.Context, r metal.StageImageRequest) (metal.StageImageResult, error) {
	f.record("StageImage")
	f.mu.Lock()
	err := f.stageErr
	f.mu.Unlock()
	if err != nil {
		return metal.StageImageResult{}, err
	}
	return metal.StageImageResult{URL: "http://site_1.boot/images/" + r.Machine.NodeID + "/" + r.SHA256,
		SHA256: r.SHA256, SizeBytes: r.SizeBytes}, nil
}

// SetBootDevice sets the simulated machine's boot device.
func (f *fakeSite) SetBootDevice(_ context.Context, r metal.BootDeviceRequest) error {
	f.record(fmt.Sprintf("SetBootDevice %s %v", r.Device, r.Persistent))
	return nil
}

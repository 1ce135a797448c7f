package lifecycle

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.temporal.io/sdk/temporal"

	activities "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/agent/protocol"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/workflows/metal"
)

// fakeStore is an in-memory activities.Store with store/metal's rules
// (fenced writes, one boot per operation and purpose, hardware-key
// conflicts), for the workflow's unit tests.
type fakeStore struct {
	mu    sync.Mutex
	nodes map[string]*activities.Lifecycle
	boots map[string]*fakeBoot
	// steps records every SetStep, per node.
	steps map[string][]string
	// owners maps a hardware key to the node that has it.
	owners map[string]string
	now    func() time.Time
	seq    int
	// onBootStatus, when set, runs on every BootStatus read (a simulated
	// ramdisk that reports when the test says).
	onBootStatus func(b *fakeBoot)
	bootReads    int

	// The provisioning workflows (provision_fake_test.go).
	workflows map[string]*fakeWorkflow
	commands  map[string]*fakeCommand
	// deploySteps are the steps of the workflow a deploy begins with
	// (nil: the default metal steps).
	deploySteps []provisioning.Step
	// imageProblem is CheckImage's answer; acceptFailures Accept's.
	imageProblem   string
	acceptFailures []string
	// onEndStep runs on every EndStep (with s.mu held).
	onEndStep func(wf *fakeWorkflow, index int, o activities.StepOutcome)
	// onRamdiskStep, when set, is a deploy ramdisk's result of a step it
	// was handed; done false: still running (with s.mu held).
	onRamdiskStep func(b *fakeBoot, st protocol.RamdiskStep) (protocol.RamdiskStepResult, bool)
	// noJoin: a deploy's installed system never joins.
	noJoin bool
	// onNodeCommand runs on every read of a node command (with s.mu held).
	onNodeCommand func(c *fakeCommand)
}

type fakeBoot struct {
	id, nodeID, purpose string
	opSeq               int64
	steps               []protocol.RamdiskStep
	reported, finished  bool
	hardwareKey         string
	results             []protocol.RamdiskStepResult
	booted              bool
	// joined / joinError: the installed system's agent joined with the
	// boot's token, or why that join was refused.
	joined    bool
	joinError string
	// handed are the ramdisk steps the boot ran, in order.
	handed []protocol.RamdiskStep
}

func newFakeStore() *fakeStore {
	return &fakeStore{nodes: map[string]*activities.Lifecycle{}, boots: map[string]*fakeBoot{},
		steps: map[string][]string{}, owners: map[string]string{}, now: time.Now,
		workflows: map[string]*fakeWorkflow{}, commands: map[string]*fakeCommand{}}
}

// enroll adds a node in enrolling, as metal.enroll leaves it.
func (s *fakeStore) enroll(nodeID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes[nodeID] = &activities.Lifecycle{TenantID: "ten_a", NodeID: nodeID, SiteID: "site_1", PoolID: "pool_1",
		State: nodes.Enrolling, Power: nodes.PowerUnknown, RedfishAddress: "https://bmc-" + nodeID, BootMAC: "52:54:00:00:00:01"}
}

// begin begins op on the node as the API does, and answers its params.
func (s *fakeStore) begin(nodeID string, op coremetal.Operation, args string, deadline time.Duration) activities.MetalParams {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[nodeID]
	e, ok := coremetal.EdgeOf(op)
	if !ok || !coremetal.Allows(op, n.State, n.Managed, n.Inspected) {
		panic(fmt.Sprintf("%s not allowed from %s", op, n.State))
	}
	n.Origin, n.State = n.State, e.DuringFrom(n.State)
	n.Operation, n.OpSeq, n.Step = op, n.OpSeq+1, e.Steps[0]
	n.OpArgs = nil
	if args != "" {
		n.OpArgs = []byte(args)
	}
	n.Deadline = s.now().Add(deadline)
	n.AbortRequested, n.WorkflowStarted = false, false
	switch op {
	case coremetal.Deploy:
		s.newWorkflow(nodeID, n.TenantID, n.OpSeq, s.deploySteps)
	case coremetal.Retry:
		s.retryWorkflow(nodeID, n.OpSeq)
	}
	return activities.MetalParams{TenantID: n.TenantID, NodeID: nodeID, OpSeq: n.OpSeq}
}

func (s *fakeStore) node(nodeID string) activities.Lifecycle {
	s.mu.Lock()
	defer s.mu.Unlock()
	return *s.nodes[nodeID]
}

func (s *fakeStore) stepsOf(nodeID string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.steps[nodeID])
}

// inFlight finds the node with opSeq in flight, or ErrStale.
func (s *fakeStore) inFlight(tenantID, nodeID string, opSeq int64) (*activities.Lifecycle, error) {
	n, ok := s.nodes[nodeID]
	if !ok || n.TenantID != tenantID {
		return nil, activities.ErrNotFound
	}
	if n.Operation == "" || n.OpSeq != opSeq {
		return nil, activities.ErrStale
	}
	return n, nil
}

func (s *fakeStore) Load(_ context.Context, tenantID, nodeID string) (activities.Lifecycle, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[nodeID]
	if !ok || n.TenantID != tenantID {
		return activities.Lifecycle{}, activities.ErrNotFound
	}
	lc := *n
	lc.OpenBoot = ""
	for _, b := range s.boots {
		if b.nodeID == nodeID && !b.finished {
			lc.OpenBoot = b.id
		}
	}
	return lc, nil
}

func (s *fakeStore) MarkStarted(_ context.Context, tenantID, nodeID string, opSeq int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.inFlight(tenantID, nodeID, opSeq)
	if err != nil {
		return err
	}
	n.WorkflowStarted = true
	return nil
}

func (s *fakeStore) SetStep(_ context.Context, tenantID, nodeID string, opSeq int64, step string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.inFlight(tenantID, nodeID, opSeq)
	if err != nil {
		return err
	}
	n.Step = step
	s.steps[nodeID] = append(s.steps[nodeID], step)
	return nil
}

func (s *fakeStore) Finish(_ context.Context, f activities.Finish) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.inFlight(f.TenantID, f.NodeID, f.OpSeq)
	if err != nil {
		return err
	}
	wfState := f.WorkflowState
	if wfState == "" {
		wfState = provisioning.WorkflowSucceeded
	}
	s.endWorkflow(f.NodeID, f.OpSeq, wfState)
	n.State, n.Operation, n.Step, n.OpArgs, n.Deadline, n.AbortRequested = f.State, "", "", nil, time.Time{}, false
	n.LastError = nil
	n.Managed = n.Managed || f.Managed
	n.Inspected = n.Inspected || f.Inspected
	if f.Power != "" {
		n.Power = f.Power
	}
	return nil
}

func (s *fakeStore) Fail(_ context.Context, f activities.Failure) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.inFlight(f.TenantID, f.NodeID, f.OpSeq)
	if err != nil {
		return err
	}
	wfState := f.WorkflowState
	if wfState == "" {
		wfState = provisioning.WorkflowFailed
	}
	s.endWorkflow(f.NodeID, f.OpSeq, wfState)
	n.LastError = &activities.LastError{Operation: n.Operation, Step: f.Step, Origin: n.Origin, Code: f.Code,
		Reason: f.Reason, Message: f.Message, At: s.now()}
	n.State, n.Operation, n.Step, n.Deadline = nodes.Failed, "", "", time.Time{}
	return nil
}

func (s *fakeStore) SetPower(_ context.Context, tenantID, nodeID string, power nodes.Power) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[nodeID]
	if !ok || n.TenantID != tenantID {
		return activities.ErrNotFound
	}
	n.Power = power
	return nil
}

func (s *fakeStore) Owed(_ context.Context, _ time.Duration, _ int) ([]activities.InFlight, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []activities.InFlight
	for _, id := range slices.Sorted(mapsKeys(s.nodes)) {
		n := s.nodes[id]
		if n.Operation != "" && !n.WorkflowStarted {
			out = append(out, activities.InFlight{MetalParams: activities.MetalParams{TenantID: n.TenantID, NodeID: id, OpSeq: n.OpSeq},
				Operation: n.Operation, Deadline: n.Deadline, OpArgs: n.OpArgs})
		}
	}
	return out, nil
}

func (s *fakeStore) InFlight(_ context.Context, after string, _ time.Duration, limit int) ([]activities.InFlight, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []activities.InFlight
	for _, id := range slices.Sorted(mapsKeys(s.nodes)) {
		n := s.nodes[id]
		if id > after && n.Operation != "" && n.WorkflowStarted && len(out) < limit {
			out = append(out, activities.InFlight{MetalParams: activities.MetalParams{TenantID: n.TenantID, NodeID: id, OpSeq: n.OpSeq},
				Operation: n.Operation, Deadline: n.Deadline, OpArgs: n.OpArgs})
		}
	}
	return out, nil
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func (s *fakeStore) NewBoot(_ context.Context, tenantID, nodeID string, opSeq int64, purpose string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.inFlight(tenantID, nodeID, opSeq); err != nil {
		return "", err
	}
	for _, b := range s.boots {
		if b.nodeID == nodeID && b.opSeq == opSeq && b.purpose == purpose {
			return b.id, nil
		}
	}
	s.seq++
	id := fmt.Sprintf("boot_%d", s.seq)
	s.boots[id] = &fakeBoot{id: id, nodeID: nodeID, opSeq: opSeq, purpose: purpose}
	return id, nil
}

func (s *fakeStore) SetBootSteps(_ context.Context, _ string, bootID string, steps []protocol.RamdiskStep) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.boots[bootID]
	if !ok {
		return activities.ErrNotFound
	}
	b.steps, b.results = steps, nil
	return nil
}

func (s *fakeStore) BootStatus(_ context.Context, _ string, bootID string) (activities.BootStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.boots[bootID]
	if !ok {
		return activities.BootStatus{}, activities.ErrNotFound
	}
	s.bootReads++
	if s.onBootStatus != nil {
		s.onBootStatus(b)
	}
	s.runRamdisk(b)
	return activities.BootStatus{Reported: b.reported, HardwareKey: b.hardwareKey, Results: slices.Clone(b.results),
		Finished: b.finished, Joined: b.joined, JoinError: b.joinError}, nil
}

// report is the ramdisk of a booted machine reporting (and running its
// steps, all successfully).
func (b *fakeBoot) report(hardwareKey string) {
	b.reported, b.hardwareKey = true, hardwareKey
	for _, st := range b.steps {
		if st.Name == protocol.StepWipeDisks {
			b.results = append(b.results, protocol.RamdiskStepResult{Name: st.Name, OK: true, DurationMs: 12})
		}
	}
}

func (s *fakeStore) CloseBoot(_ context.Context, _ string, bootID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b, ok := s.boots[bootID]; ok {
		b.finished = true
	}
	return nil
}

func (s *fakeStore) openBoots(nodeID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, b := range s.boots {
		if b.nodeID == nodeID && !b.finished {
			n++
		}
	}
	return n
}

func (s *fakeStore) IngestInspection(_ context.Context, tenantID, nodeID string, opSeq int64, bootID string) (activities.Ingest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.inFlight(tenantID, nodeID, opSeq)
	if err != nil {
		return activities.Ingest{}, err
	}
	b := s.boots[bootID]
	if owner, ok := s.owners[b.hardwareKey]; ok && owner != nodeID {
		return activities.Ingest{HardwareKey: b.hardwareKey, ConflictNodeID: owner}, nil
	}
	s.owners[b.hardwareKey] = nodeID
	n.HardwareKey = b.hardwareKey
	return activities.Ingest{HardwareKey: b.hardwareKey}, nil
}

func (s *fakeStore) CheckRejoin(_ context.Context, _ string, nodeID, bootID string) (activities.Rejoin, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	want, got := s.nodes[nodeID].HardwareKey, s.boots[bootID].hardwareKey
	return activities.Rejoin{Match: want != "" && want == got, Want: want, Got: got}, nil
}

func (s *fakeStore) RevokeIdentities(_ context.Context, tenantID, nodeID string, opSeq int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.inFlight(tenantID, nodeID, opSeq)
	return err
}

// fakeSite is a site agent over simulated machines: power is a field, a
// ramdisk boot marks the boot booted, and (with autoReport) its ramdisk
// reports at once with the machine's hardware key.
type fakeSite struct {
	store *fakeStore
	mu    sync.Mutex
	power map[string]string
	// calls counts the calls by activity and action ("Power off").
	calls map[string]int
	// hardwareKey is what each machine's ramdisk reports.
	hardwareKey map[string]string
	autoReport  bool
	// verifyErr, when set, is VerifyBMC's answer; stageErr StageImage's.
	verifyErr error
	stageErr  error
	// onBoot, when set, is what booting the ramdisk does instead of
	// reporting to the fake store (e.g. a ramdisk reporting to PostgreSQL).
	onBoot func(ctx context.Context, r metal.BootRequest) error
}

func newFakeSite(s *fakeStore) *fakeSite {
	return &fakeSite{store: s, power: map[string]string{}, calls: map[string]int{}, hardwareKey: map[string]string{}, autoReport: true}
}

func (f *fakeSite) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *fakeSite) record(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
}

func (f *fakeSite) powerOf(node string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.power[node]; ok {
		return p
	}
	return "off"
}

func (f *fakeSite) setPower(node, p string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.power[node] = p
}

func (f *fakeSite) VerifyBMC(_ context.Context, m metal.MachineRef) (metal.BMCStatus, error) {
	f.record("VerifyBMC")
	if f.verifyErr != nil {
		return metal.BMCStatus{}, f.verifyErr
	}
	return metal.BMCStatus{Driver: "redfish/v1", Power: f.powerOf(m.NodeID)}, nil
}

func (f *fakeSite) Power(_ context.Context, r metal.PowerRequest) (metal.PowerResult, error) {
	f.record("Power " + r.Action)
	switch r.Action {
	case "on", "cycle", "reset":
		f.setPower(r.Machine.NodeID, "on")
	case "off":
		f.setPower(r.Machine.NodeID, "off")
	case "status":
	default:
		return metal.PowerResult{}, temporal.NewNonRetryableApplicationError("unknown action "+r.Action, "INVALID_INPUT", nil)
	}
	return metal.PowerResult{Power: f.powerOf(r.Machine.NodeID), Driver: "redfish/v1"}, nil
}

func (f *fakeSite) InspectOOB(context.Context, metal.MachineRef) (metal.InspectOOBResult, error) {
	f.record("InspectOOB")
	return metal.InspectOOBResult{Supported: true, Manufacturer: "QEMU"}, nil
}

func (f *fakeSite) BootRamdisk(ctx context.Context, r metal.BootRequest) (metal.BootResult, error) {
	f.record("BootRamdisk " + r.Purpose)
	f.setPower(r.Machine.NodeID, "on")
	if f.onBoot != nil {
		return metal.BootResult{Via: "virtual-media", Power: "on"}, f.onBoot(ctx, r)
	}
	f.store.mu.Lock()
	if b, ok := f.store.boots[r.BootID]; ok {
		b.booted = true
		if f.autoReport {
			f.mu.Lock()
			key := f.hardwareKey[r.Machine.NodeID]
			f.mu.Unlock()
			if key == "" {
				key = "hk-" + r.Machine.NodeID
			}
			b.report(key)
		}
	}
	f.store.mu.Unlock()
	return metal.BootResult{Via: "virtual-media", Power: "on"}, nil
}

func (f *fakeSite) EndBoot(_ context.Context, r metal.EndBootRequest) error {
	if r.PowerOff {
		f.record("EndBoot off")
		f.setPower(r.Machine.NodeID, "off")
	} else {
		f.record("EndBoot")
	}
	return nil
}

func (f *fakeSite) ResetBIOS(context.Context, metal.MachineRef) (metal.ResetBIOSResult, error) {
	f.record("ResetBIOS")
	return metal.ResetBIOSResult{Supported: false}, nil
}

func (f *fakeSite) ConsoleLog(context.Context, metal.ConsoleLogRequest) ([]byte, error) {
	return []byte("console"), nil
}

package workflows_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/metal"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/workflows"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type fixture struct {
	t     *testing.T
	s     *store.Store
	types nodes.Types
	site  string
	pool  string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	cat, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, s: testenv.Store(t), types: nodes.TypesOf(cat)}
	f.site, f.pool = core.NewID("site"), core.NewID("pool")
	f.exec(`INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, 'acme', $1, 'eu', 'eu-west', 'custom', 'idn_x')`, f.site)
	f.exec(`INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, created_by)
		VALUES ($1, 'acme', $2, $1, 'metal-host', 'H100', 80, 'bcd', 'idn_x')`, f.pool, f.site)
	return f
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.s.Pool.Exec(context.Background(), sql, args...); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) tx(fn func(ctx context.Context, tx store.Tx) error) error {
	ctx := context.Background()
	return f.s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return fn(ctx, tx) })
}

func (f *fixture) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

// readyNode enrolls a machine and puts it in ready, as provide would.
func (f *fixture) readyNode(name string) string {
	f.t.Helper()
	var n metal.Node
	f.must(f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		n, err = metal.Enroll(ctx, tx, f.types, metal.Enrollment{TenantID: "acme", PoolID: f.pool, Name: name,
			BMC: metal.BMC{Redfish: &metal.RedfishEndpoint{Address: "https://" + name + ".bmc.test",
				Username: "admin", PasswordSecret: "secret://acme/bmc"}},
			RootTenant: "root", By: "idn_alice"})
		return err
	}))
	f.exec(`UPDATE nodes SET provision_state = 'ready' WHERE id = $1`, n.Node.ID)
	return n.Node.ID
}

func steps() []provisioning.Step {
	return []provisioning.Step{
		provisioning.WithDefaults(provisioning.Step{Name: "check-image", On: provisioning.RunnerControlPlane, Action: provisioning.ActionCheckImage}),
		provisioning.WithDefaults(provisioning.Step{Name: "wait", On: provisioning.RunnerControlPlane, Action: provisioning.ActionSleep,
			Args: map[string]any{"seconds": 1}}),
		provisioning.WithDefaults(provisioning.Step{Name: "accept", On: provisioning.RunnerControlPlane, Action: provisioning.ActionAcceptance}),
	}
}

// deploy begins the deploy operation and creates its workflow in one
// transaction, as metal.deploy does.
func (f *fixture) deploy(nodeID string) (workflows.Workflow, int64) {
	f.t.Helper()
	var w workflows.Workflow
	var seq int64
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		n, err := metal.BeginOperation(ctx, tx, f.types, metal.Begin{TenantID: "acme", NodeID: nodeID,
			Operation: coremetal.Deploy, By: "idn_alice"})
		if err != nil {
			return err
		}
		seq = n.Lifecycle.OpSeq
		w, err = workflows.Create(ctx, tx, workflows.New{TenantID: "acme", NodeID: nodeID, ProfileID: "prof_x",
			ProfileVersion: 2, OpSeq: seq, CreatedBy: "idn_alice", Steps: steps(),
			Context: provisioning.Context{ProfileID: "prof_x", ProfileVersion: 2, Target: "metal",
				Image:    &provisioning.ImageRef{ID: "img_1", Name: "debian", Version: "13", SHA256: "ab"},
				UserData: "#cloud-config\n"}})
		return err
	}))
	return w, seq
}

func (f *fixture) get(nodeID, id string) workflows.Workflow {
	f.t.Helper()
	var w workflows.Workflow
	f.must(f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		w, err = workflows.Get(ctx, tx, "acme", nodeID, id)
		return err
	}))
	return w
}

func (f *fixture) begin(id string, seq int64, index int) (workflows.Start, error) {
	var st workflows.Start
	err := f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		st, err = workflows.BeginStep(ctx, tx, "acme", id, seq, index)
		return err
	})
	return st, err
}

func (f *fixture) end(id string, seq int64, index int, o workflows.Outcome) error {
	return f.tx(func(ctx context.Context, tx store.Tx) error {
		return workflows.EndStep(ctx, tx, "acme", id, seq, index, o)
	})
}

func wantCode(t *testing.T, err error, code core.Code) *core.Error {
	t.Helper()
	var e *core.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("error = %v, want %s", err, code)
	}
	return e
}

func TestCreateGetList(t *testing.T) {
	f := newFixture(t)
	node := f.readyNode("m1")
	w, seq := f.deploy(node)
	if !strings.HasPrefix(w.ID, "wf_") || w.State != provisioning.WorkflowPending || w.OpSeq != seq ||
		w.ProfileVersion != 2 || len(w.Steps) != 3 || w.Step != "check-image" {
		t.Fatalf("created = %+v", w)
	}
	for _, s := range w.Steps {
		if s.State != provisioning.StepPending || s.Attempts != 0 || s.DurationMs != nil {
			t.Fatalf("step = %+v", s)
		}
	}
	if got := f.get(node, ""); got.ID != w.ID {
		t.Fatalf("latest = %s, want %s", got.ID, w.ID)
	}
	// One live workflow per machine.
	err := f.tx(func(ctx context.Context, tx store.Tx) error {
		_, err := workflows.Create(ctx, tx, workflows.New{TenantID: "acme", NodeID: node, ProfileID: "prof_x",
			ProfileVersion: 1, OpSeq: seq, CreatedBy: "idn_alice", Steps: steps()})
		return err
	})
	wantCode(t, err, core.CodeInvalidState)
	// Another tenant sees neither the node nor the workflow.
	err = f.tx(func(ctx context.Context, tx store.Tx) error {
		_, err := workflows.Get(ctx, tx, "other", node, w.ID)
		return err
	})
	wantCode(t, err, core.CodeNotFound)
	var list []workflows.Workflow
	f.must(f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		list, err = workflows.List(ctx, tx, "acme", node, store.PageQuery{Limit: 10})
		return err
	}))
	if len(list) != 1 || list[0].ID != w.ID {
		t.Fatalf("list = %+v", list)
	}
	var live string
	f.must(f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		live, err = workflows.LiveForProfile(ctx, tx, "acme", "prof_x")
		return err
	}))
	if live != w.ID {
		t.Fatalf("LiveForProfile = %q", live)
	}
	// The site image endpoint serves the live workflow's image only.
	var ref provisioning.ImageRef
	var errSite, errImage error
	f.must(f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		ref, err = workflows.ImageForSite(ctx, tx, f.site, node, "img_1")
		_, errSite = workflows.ImageForSite(ctx, tx, "site_other", node, "img_1")
		_, errImage = workflows.ImageForSite(ctx, tx, f.site, node, "img_2")
		return err
	}))
	if ref.SHA256 != "ab" {
		t.Fatalf("ImageForSite = %+v", ref)
	}
	wantCode(t, errSite, core.CodeNotFound)
	wantCode(t, errImage, core.CodeNotFound)
}

func TestStepsAreFencedByOpSeq(t *testing.T) {
	f := newFixture(t)
	node := f.readyNode("m2")
	w, seq := f.deploy(node)

	// A stale op_seq writes nothing.
	_, err := f.begin(w.ID, seq-1, 0)
	if !metal.IsSuperseded(err) {
		t.Fatalf("stale BeginStep = %v, want superseded", err)
	}
	if got := f.get(node, w.ID); got.State != provisioning.WorkflowPending || got.Steps[0].Attempts != 0 {
		t.Fatalf("after a stale begin: %+v", got)
	}

	st, err := f.begin(w.ID, seq, 0)
	if err != nil || st.Paused || st.Attempt != 1 || st.Deadline.IsZero() {
		t.Fatalf("BeginStep = %+v, %v", st, err)
	}
	// A failed attempt that is not final keeps the step running, its
	// error in the history.
	f.must(f.end(w.ID, seq, 0, workflows.Outcome{Error: "registry unreachable", Output: "try 1"}))
	got := f.get(node, w.ID)
	if s := got.Steps[0]; got.State != provisioning.WorkflowRunning || s.State != provisioning.StepRunning ||
		len(s.History) != 1 || s.History[0].Error != "registry unreachable" || s.History[0].OK {
		t.Fatalf("after a failed attempt: %+v", got)
	}
	if st, err = f.begin(w.ID, seq, 0); err != nil || st.Attempt != 2 {
		t.Fatalf("second attempt = %+v, %v", st, err)
	}
	f.must(f.end(w.ID, seq, 0, workflows.Outcome{OK: true, Output: strings.Repeat("x", provisioning.MaxOutputBytes+10)}))
	got = f.get(node, w.ID)
	if s := got.Steps[0]; s.State != provisioning.StepSucceeded || s.Attempts != 2 || len(s.Output) != provisioning.MaxOutputBytes ||
		s.FinishedAt == nil || s.DurationMs == nil || len(s.History) != 2 || !s.History[1].OK {
		t.Fatalf("after success: %+v", s)
	}
	// An answer for a step that is no longer running writes nothing.
	f.must(f.end(w.ID, seq, 0, workflows.Outcome{Final: true, Error: "late"}))
	if s := f.get(node, w.ID).Steps[0]; s.State != provisioning.StepSucceeded || s.Error != "" {
		t.Fatalf("a late answer changed the step: %+v", s)
	}

	// The operation finishes: the workflow succeeded, and its run's
	// writes are stale from then on.
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		return metal.FinishOperation(ctx, tx, f.types, metal.Finish{NodeID: node, OpSeq: seq})
	}))
	if got := f.get(node, w.ID); got.State != provisioning.WorkflowSucceeded || got.FinishedAt == nil {
		t.Fatalf("after finish: %+v", got)
	}
	if _, err := f.begin(w.ID, seq, 1); !metal.IsSuperseded(err) {
		t.Fatalf("BeginStep after the finish = %v", err)
	}
	if err := f.end(w.ID, seq, 0, workflows.Outcome{OK: true}); !metal.IsSuperseded(err) {
		t.Fatalf("EndStep after the finish = %v", err)
	}
}

func TestPauseResumePushesDeadline(t *testing.T) {
	f := newFixture(t)
	node := f.readyNode("m3")
	w, seq := f.deploy(node)
	if _, err := f.begin(w.ID, seq, 0); err != nil {
		t.Fatal(err)
	}
	f.must(f.end(w.ID, seq, 0, workflows.Outcome{OK: true}))

	var paused workflows.Workflow
	f.must(f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		paused, err = workflows.Pause(ctx, tx, "acme", node, w.ID)
		return err
	}))
	if !paused.PauseRequested || paused.Paused || paused.Allowed[0] != workflows.ActionResume {
		t.Fatalf("after pause: %+v", paused)
	}
	st, err := f.begin(w.ID, seq, 1)
	if err != nil || !st.Paused {
		t.Fatalf("BeginStep while a pause is requested = %+v, %v", st, err)
	}
	got := f.get(node, w.ID)
	if got.State != provisioning.WorkflowPaused || !got.Paused || got.Step != "wait" || got.Steps[1].Attempts != 0 {
		t.Fatalf("after the paused begin: %+v", got)
	}
	// It paused an hour ago: the resume gives the operation that hour back.
	f.exec(`UPDATE workflows SET paused_at = paused_at - interval '1 hour' WHERE id = $1`, w.ID)
	var before, after time.Time
	f.must(f.s.Pool.QueryRow(context.Background(), `SELECT deadline_at FROM node_metal WHERE node_id = $1`, node).Scan(&before))
	var resumed workflows.Workflow
	f.must(f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		resumed, err = workflows.Resume(ctx, tx, "acme", node, w.ID)
		return err
	}))
	f.must(f.s.Pool.QueryRow(context.Background(), `SELECT deadline_at FROM node_metal WHERE node_id = $1`, node).Scan(&after))
	if after.Sub(before) < time.Hour {
		t.Fatalf("deadline moved by %v, want at least the hour paused", after.Sub(before))
	}
	if resumed.State != provisioning.WorkflowRunning || resumed.Paused || resumed.PauseRequested {
		t.Fatalf("after resume: %+v", resumed)
	}
	if st, err := f.begin(w.ID, seq, 1); err != nil || st.Paused || st.Attempt != 1 {
		t.Fatalf("BeginStep after resume = %+v, %v", st, err)
	}
	// Resuming what is not paused is INVALID_STATE naming what it admits.
	err = f.tx(func(ctx context.Context, tx store.Tx) error {
		_, err := workflows.Resume(ctx, tx, "acme", node, w.ID)
		return err
	})
	e := wantCode(t, err, core.CodeInvalidState)
	if a, _ := e.Details["allowed"].([]string); len(a) != 2 || a[0] != workflows.ActionPause {
		t.Fatalf("details = %v", e.Details)
	}
}

func TestFailureAndRetryResetsFromFailedStep(t *testing.T) {
	f := newFixture(t)
	node := f.readyNode("m4")
	w, seq := f.deploy(node)
	for i := 0; i < 2; i++ {
		if _, err := f.begin(w.ID, seq, i); err != nil {
			t.Fatal(err)
		}
	}
	f.exec(`UPDATE workflow_steps SET state = 'succeeded' WHERE workflow_id = $1 AND idx = 0`, w.ID)
	f.must(f.end(w.ID, seq, 1, workflows.Outcome{Final: true, Output: "slept", Error: "timed out", Reason: coremetal.ReasonStepTimeout}))
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		return metal.FailOperation(ctx, tx, f.types, metal.Failure{NodeID: node, OpSeq: seq, Step: "wait",
			Code: "DEADLINE_EXCEEDED", Reason: coremetal.ReasonStepTimeout, Message: "step wait timed out"})
	}))
	got := f.get(node, w.ID)
	if got.State != provisioning.WorkflowFailed || got.Step != "wait" || got.Steps[1].State != provisioning.StepFailed ||
		got.Steps[1].Output != "slept" || got.Steps[1].Error != "timed out" || got.Allowed[0] != workflows.ActionRetry {
		t.Fatalf("after the failure: %+v", got)
	}
	var n metal.Node
	f.must(f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		n, err = metal.Get(ctx, tx, "acme", node, false)
		return err
	}))
	if n.Lifecycle.LastError == nil || n.Lifecycle.LastError.WorkflowID != w.ID {
		t.Fatalf("last error = %+v", n.Lifecycle.LastError)
	}

	var retrySeq int64
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		if _, err := workflows.CheckRetry(ctx, tx, "acme", node, w.ID); err != nil {
			return err
		}
		n, err := metal.BeginOperation(ctx, tx, f.types, metal.Begin{TenantID: "acme", NodeID: node,
			Operation: coremetal.Retry, By: "idn_alice"})
		if err != nil {
			return err
		}
		retrySeq = n.Lifecycle.OpSeq
		return workflows.Rerun(ctx, tx, w.ID, retrySeq)
	}))
	got = f.get(node, w.ID)
	if got.State != provisioning.WorkflowPending || got.OpSeq != retrySeq || got.Error != "" {
		t.Fatalf("after retry: %+v", got)
	}
	if s := got.Steps; s[0].State != provisioning.StepSucceeded || s[1].State != provisioning.StepPending ||
		s[1].Attempts != 1 || len(s[1].History) != 1 || s[2].State != provisioning.StepPending {
		t.Fatalf("steps after retry: %+v", s)
	}
	// The old operation's run is fenced out; the retry's runs the step.
	if _, err := f.begin(w.ID, seq, 1); !metal.IsSuperseded(err) {
		t.Fatalf("the failed run's BeginStep = %v", err)
	}
	if st, err := f.begin(w.ID, retrySeq, 1); err != nil || st.Attempt != 2 {
		t.Fatalf("the retry's BeginStep = %+v, %v", st, err)
	}
	// A retried workflow that is not failed is INVALID_STATE.
	err := f.tx(func(ctx context.Context, tx store.Tx) error {
		_, err := workflows.CheckRetry(ctx, tx, "acme", node, w.ID)
		return err
	})
	wantCode(t, err, core.CodeInvalidState)

	// An abort ends the step in flight aborted.
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		return metal.FailOperation(ctx, tx, f.types, metal.Failure{NodeID: node, OpSeq: retrySeq,
			Code: "INVALID_STATE", Reason: coremetal.ReasonAborted, Message: "aborted by idn_alice",
			WorkflowState: provisioning.WorkflowAborted})
	}))
	got = f.get(node, w.ID)
	if got.State != provisioning.WorkflowAborted || got.Steps[1].State != provisioning.StepAborted ||
		got.Steps[2].State != provisioning.StepPending || len(got.Allowed) != 0 {
		t.Fatalf("after the abort: %+v", got)
	}
}

func TestSafeAbortFinishesAborted(t *testing.T) {
	f := newFixture(t)
	node := f.readyNode("m5")
	w, seq := f.deploy(node)
	if _, err := f.begin(w.ID, seq, 0); err != nil {
		t.Fatal(err)
	}
	f.must(f.tx(func(ctx context.Context, tx store.Tx) error {
		return metal.FinishOperation(ctx, tx, f.types, metal.Finish{NodeID: node, OpSeq: seq, State: "ready",
			WorkflowState: provisioning.WorkflowAborted})
	}))
	got := f.get(node, w.ID)
	if got.State != provisioning.WorkflowAborted || got.Steps[0].State != provisioning.StepAborted {
		t.Fatalf("after a safe abort: %+v", got)
	}
	// Nothing live is left: the profile may be deleted, and a new deploy
	// may make a new workflow.
	var live string
	f.must(f.tx(func(ctx context.Context, tx store.Tx) (err error) {
		live, err = workflows.LiveForProfile(ctx, tx, "acme", "prof_x")
		return err
	}))
	if live != "" {
		t.Fatalf("LiveForProfile = %q", live)
	}
	w2, _ := f.deploy(node)
	if w2.ID == w.ID || f.get(node, "").ID != w2.ID {
		t.Fatalf("the latest workflow is not the new one")
	}
}

func TestAcceptanceChecks(t *testing.T) {
	inv := &inventory.NodeInventory{CPU: inventory.CPU{LogicalCPUs: 8}, Memory: inventory.Memory{TotalBytes: 16 << 30},
		Disks: []inventory.Disk{{Name: "vda", SizeBytes: 10 << 30}},
		GPUs:  inventory.GPUs{Devices: []inventory.GPU{{Index: 0, Name: "NVIDIA H100 80GB HBM3"}}}}
	pass := []provisioning.Check{{Kind: provisioning.CheckMinCPUs, Value: float64(8)}, {Kind: provisioning.CheckMinMemoryGiB, Value: float64(16)},
		{Kind: provisioning.CheckMinDisks, Value: float64(1)}, {Kind: provisioning.CheckGPUCount, Value: float64(1)},
		{Kind: provisioning.CheckGPUModel, Value: "H100"}}
	if got := workflows.Check(inv, pass); len(got) != 0 {
		t.Fatalf("checks that hold failed: %v", got)
	}
	fail := []provisioning.Check{{Kind: provisioning.CheckMinCPUs, Value: float64(9)}, {Kind: provisioning.CheckMinMemoryGiB, Value: float64(32)},
		{Kind: provisioning.CheckMinDisks, Value: float64(2)}, {Kind: provisioning.CheckGPUCount, Value: float64(8)},
		{Kind: provisioning.CheckGPUModel, Value: "A100"}, {Kind: "nonsense"}}
	if got := workflows.Check(inv, fail); len(got) != len(fail) {
		t.Fatalf("failing checks answered %v", got)
	}
}

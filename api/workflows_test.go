package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	metalact "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/api/metal"
	"github.com/better-compute/better-compute/api/profiles"
	"github.com/better-compute/better-compute/api/workflows"
	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/store"
	metaldomain "github.com/better-compute/better-compute/store/metal"
	profilestore "github.com/better-compute/better-compute/store/profiles"
)

// profile registers an available image of tenant and a metal profile of
// two control-plane steps that runs it, and answers the profile's id.
func (m *metalEnv) profile(tenant, name string) string {
	m.t.Helper()
	return m.profileWith(tenant, name, `"userData": "#cloud-config\n"`)
}

func (m *metalEnv) profileWith(tenant, name, extra string) string {
	m.t.Helper()
	ctx := context.Background()
	if _, err := m.store.Pool.Exec(ctx, `INSERT INTO images (id, tenant_id, name, version, format, sha256, size_bytes, state, created_by)
		VALUES ($1, $2, $3, '1', 'raw', $4, 1048576, 'available', 'idn_x')`,
		core.NewID("img"), tenant, "img-"+name, strings.Repeat("b", 64)); err != nil {
		m.t.Fatal(err)
	}
	doc := fmt.Sprintf(`{"target": "metal", "image": {"name": "img-%s", "version": "1"}, %s,
		"steps": [{"name": "check-image", "on": "control-plane", "action": "check-image"},
			{"name": "wait", "on": "control-plane", "action": "sleep", "args": {"seconds": 1}}]}`, name, extra)
	if tenant != "acme" {
		// The test's user is acme's: another tenant's profile is made in
		// the store.
		var p profilestore.Profile
		if err := m.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			p, _, err = profilestore.Create(ctx, tx, m.catalog.FullName(profilestore.ResourceType), tenant, "idn_x", name, json.RawMessage(doc))
			return err
		}); err != nil {
			m.t.Fatalf("profile %s: %v", name, err)
		}
		return p.ID
	}
	p, err := profiles.Create.Call(ctx, m.client(m.boot.UserToken), profiles.CreateInput{TenantID: tenant, Name: name,
		Document: json.RawMessage(doc)})
	if err != nil {
		m.t.Fatalf("profile %s: %v", name, err)
	}
	return p.ID
}

// ready enrolls a machine and takes it to ready, each operation finished
// as its workflow would.
func (m *metalEnv) ready(name, address string) string {
	m.t.Helper()
	ctx := context.Background()
	c := m.client(m.boot.UserToken)
	n := m.enroll(name, address)
	in := metal.NodeInput{TenantID: "acme", NodeID: n.Node.ID}
	for _, s := range []struct {
		ref rpc1
		fin metaldomain.Finish
	}{{metal.Manage, metaldomain.Finish{Managed: true, Power: nodestate.PowerOff}}, {metal.Inspect, metaldomain.Finish{Inspected: true}},
		{metal.Provide, metaldomain.Finish{}}} {
		got, err := s.ref.Call(ctx, c, in)
		if err != nil {
			m.t.Fatalf("%s: %v", s.ref, err)
		}
		m.finish(got, s.fin)
	}
	return n.Node.ID
}

func allowedIn(t *testing.T, err error) string {
	t.Helper()
	e := wantError(t, err, core.CodeInvalidState, "")
	return fmt.Sprint(e.Details["allowed"])
}

// TestWorkflowsMethods deploys a node from a profile over HTTP, runs its
// steps through the lifecycle's store (DBStore, as the lifecycle workflow
// does), and walks pause, resume, a failure, retry and abort.
func TestWorkflowsMethods(t *testing.T) {
	m := newMetalEnv(t)
	ctx := context.Background()
	c := m.client(m.boot.UserToken)
	node := m.ready("w1", "https://10.0.1.1")
	profile := m.profile("acme", "plain")

	d, err := metal.Deploy.Call(ctx, c, metal.DeployInput{TenantID: "acme", NodeID: node, ProfileID: profile})
	if err != nil {
		t.Fatal(err)
	}
	if d.Lifecycle.State != "deploying" || !strings.HasPrefix(d.WorkflowID, "wf_") {
		t.Fatalf("deploy = %+v", d)
	}
	w, err := workflows.Get.Call(ctx, c, workflows.GetInput{TenantID: "acme", NodeID: node})
	if err != nil {
		t.Fatal(err)
	}
	if w.ID != d.WorkflowID || w.State != provisioning.WorkflowPending || w.ProfileID != profile || w.ProfileVersion != 1 ||
		len(w.Steps) != 2 || w.Steps[1].Name != "wait" || w.Steps[1].State != provisioning.StepPending || w.Image == nil ||
		w.OpSeq != d.Lifecycle.OpSeq || fmt.Sprint(w.Allowed) != "[pause abort]" {
		t.Fatalf("workflows.get = %+v", w)
	}
	// The answer carries no user data.
	if raw := jsonOf(t, w); strings.Contains(raw, "cloud-config") {
		t.Fatalf("workflows.get shows the user data: %s", raw)
	}
	l, err := workflows.ListOf.Call(ctx, c, workflows.ListInput{TenantID: "acme", NodeID: node})
	if err != nil || len(l.Items) != 1 || l.Items[0].ID != w.ID {
		t.Fatalf("workflows.list = %+v, %v", l, err)
	}
	ref := workflows.WorkflowInput{TenantID: "acme", NodeID: node, WorkflowID: w.ID}
	// The profile a live workflow runs cannot be deleted.
	if _, err := profiles.Delete.Call(ctx, c, profiles.ProfileInput{TenantID: "acme", ProfileID: profile}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("delete of a profile a live workflow runs = %v, want INVALID_STATE", err)
	}
	// Another tenant sees nothing.
	if _, err := workflows.Get.Call(ctx, c, workflows.GetInput{TenantID: "globex", NodeID: node, WorkflowID: w.ID}); codeOf(err) != core.CodeNotFound &&
		codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("another tenant's get: %v", err)
	}

	// Nothing to resume or retry yet: INVALID_STATE names what it admits.
	_, err = workflows.Resume.Call(ctx, c, ref)
	if got := allowedIn(t, err); got != "[pause abort]" {
		t.Fatalf("resume allowed = %s", got)
	}
	_, err = workflows.Retry.Call(ctx, c, ref)
	if got := allowedIn(t, err); got != "[pause abort]" {
		t.Fatalf("retry allowed = %s", got)
	}

	// The run: the first step succeeds, then a pause stops it before the
	// second; resume lets it go on.
	ps := metalact.NewDBStore(m.store, m.catalog)
	seq := d.Lifecycle.OpSeq
	run, err := ps.LoadWorkflow(ctx, "acme", node, seq)
	if err != nil || run.ID != w.ID || run.Context.UserData != "#cloud-config\n" || len(run.Steps) != 2 {
		t.Fatalf("LoadWorkflow = %+v, %v", run, err)
	}
	st, err := ps.BeginStep(ctx, "acme", w.ID, seq, 0)
	if err != nil || st.Paused || st.Attempt != 1 {
		t.Fatalf("BeginStep = %+v, %v", st, err)
	}
	if now := m.get(node); now.Lifecycle.Step != "check-image" {
		t.Fatalf("node step = %q", now.Lifecycle.Step)
	}
	why, err := ps.CheckImage(ctx, "acme", w.ID)
	if err != nil || why != "" {
		t.Fatalf("CheckImage = %q, %v", why, err)
	}
	if err := ps.EndStep(ctx, "acme", w.ID, seq, 0, metalact.StepOutcome{OK: true, Output: "image ok"}); err != nil {
		t.Fatal(err)
	}
	p, err := workflows.Pause.Call(ctx, c, ref)
	if err != nil || !p.PauseRequested || fmt.Sprint(p.Allowed) != "[resume abort]" {
		t.Fatalf("pause = %+v, %v", p, err)
	}
	if st, err := ps.BeginStep(ctx, "acme", w.ID, seq, 1); err != nil || !st.Paused {
		t.Fatalf("BeginStep while paused = %+v, %v", st, err)
	}
	if g, _ := workflows.Get.Call(ctx, c, workflows.GetInput{TenantID: "acme", NodeID: node}); !g.Paused || g.Step != "wait" {
		t.Fatalf("paused = %+v", g)
	}
	r, err := workflows.Resume.Call(ctx, c, ref)
	if err != nil || r.Paused || r.PauseRequested || r.State != provisioning.WorkflowRunning {
		t.Fatalf("resume = %+v, %v", r, err)
	}

	// The second step times out: the workflow fails there, its output kept.
	if _, err := ps.BeginStep(ctx, "acme", w.ID, seq, 1); err != nil {
		t.Fatal(err)
	}
	if err := ps.EndStep(ctx, "acme", w.ID, seq, 1, metalact.StepOutcome{Final: true, Output: "slept a while",
		Error: "step wait timed out", Reason: coremetal.ReasonStepTimeout}); err != nil {
		t.Fatal(err)
	}
	if err := (&dbFail{ps}).fail(ctx, node, seq, "wait"); err != nil {
		t.Fatal(err)
	}
	g, err := workflows.Get.Call(ctx, c, workflows.GetInput{TenantID: "acme", NodeID: node, WorkflowID: w.ID})
	if err != nil || g.State != provisioning.WorkflowFailed || g.Step != "wait" || g.Steps[1].Output != "slept a while" ||
		g.Steps[1].State != provisioning.StepFailed || g.Steps[0].State != provisioning.StepSucceeded || g.Steps[1].DurationMs == nil {
		t.Fatalf("failed = %+v, %v", g, err)
	}
	if now := m.get(node); now.Lifecycle.State != "failed" || now.Lifecycle.LastError.WorkflowID != w.ID {
		t.Fatalf("node after the failure: %+v", now.Lifecycle)
	}
	_, err = workflows.Pause.Call(ctx, c, ref)
	if got := allowedIn(t, err); got != "[retry]" {
		t.Fatalf("pause of a failed workflow: allowed %s", got)
	}

	// Retry: the retry operation runs the failed step and the rest again.
	rt, err := workflows.Retry.Call(ctx, c, ref)
	if err != nil {
		t.Fatal(err)
	}
	now := m.get(node)
	if rt.State != provisioning.WorkflowPending || rt.OpSeq != now.Lifecycle.OpSeq || now.Lifecycle.Operation != string(coremetal.Retry) ||
		now.Lifecycle.State != "deploying" || rt.Steps[0].State != provisioning.StepSucceeded ||
		rt.Steps[1].State != provisioning.StepPending || rt.Steps[1].Attempts != 1 {
		t.Fatalf("retry = %+v, node %+v", rt, now.Lifecycle)
	}
	var args workflows.RetryArgs
	if err := m.store.Pool.QueryRow(ctx, `SELECT op_args FROM node_metal WHERE node_id = $1`, node).Scan(&args); err != nil || args.WorkflowID != w.ID {
		t.Fatalf("retry args: %+v %v", args, err)
	}
	// The failed run's writes are stale now.
	if _, err := ps.BeginStep(ctx, "acme", w.ID, seq, 1); err == nil {
		t.Fatal("the failed operation's run began a step")
	}
	if st, err := ps.BeginStep(ctx, "acme", w.ID, rt.OpSeq, 1); err != nil || st.Attempt != 2 {
		t.Fatalf("the retry's BeginStep = %+v, %v", st, err)
	}

	// Abort (no lifecycle workflow runs here: the call fails the node
	// itself): the workflow is aborted at its step.
	ab, err := workflows.Abort.Call(ctx, c, ref)
	if err != nil {
		t.Fatal(err)
	}
	if ab.State != provisioning.WorkflowAborted || ab.Steps[1].State != provisioning.StepAborted {
		t.Fatalf("abort = %+v", ab)
	}
	if now := m.get(node); now.Lifecycle.State != "failed" || now.Lifecycle.LastError.Reason != coremetal.ReasonAborted {
		t.Fatalf("node after abort: %+v", now.Lifecycle)
	}
	_, err = workflows.Abort.Call(ctx, c, ref)
	if got := allowedIn(t, err); got != "[]" {
		t.Fatalf("abort of an aborted workflow: allowed %s", got)
	}
}

// dbFail fails the node's operation as the lifecycle does after a step
// failed.
type dbFail struct{ s *metalact.DBStore }

func (f *dbFail) fail(ctx context.Context, nodeID string, seq int64, step string) error {
	return f.s.Fail(ctx, metalact.Failure{TenantID: "acme", NodeID: nodeID, OpSeq: seq, Step: step,
		Code: "DEADLINE_EXCEEDED", Reason: coremetal.ReasonStepTimeout, Message: "step " + step + " timed out"})
}

// TestMetalDeployRefusesProfiles: a missing or another tenant's profile is
// NOT_FOUND, and nothing changes.
func TestMetalDeployRefusesProfiles(t *testing.T) {
	m := newMetalEnv(t)
	ctx := context.Background()
	c := m.client(m.boot.UserToken)
	node := m.ready("w2", "https://10.0.1.2")
	foreign := m.profile("globex", "theirs")
	before := m.get(node)
	for _, profile := range []string{core.NewID("prof"), foreign} {
		_, err := metal.Deploy.Call(ctx, c, metal.DeployInput{TenantID: "acme", NodeID: node, ProfileID: profile})
		if codeOf(err) != core.CodeNotFound {
			t.Fatalf("deploy with %s: %v", profile, err)
		}
	}
	// A profile whose user data's secret is gone names the field.
	gone := m.profileWith("acme", "gone", `"userData": "secret://acme/no-such-secret"`)
	_, err := metal.Deploy.Call(ctx, c, metal.DeployInput{TenantID: "acme", NodeID: node, ProfileID: gone})
	if e := wantError(t, err, core.CodeNotFound, "userData"); e == nil {
		t.Fatal("no error")
	}
	after := m.get(node)
	if after.Lifecycle.State != "ready" || after.Lifecycle.OpSeq != before.Lifecycle.OpSeq || after.Lifecycle.Operation != "" {
		t.Fatalf("a refused deploy changed the node: %+v", after.Lifecycle)
	}
	if n := m.count(`SELECT count(*) FROM workflows WHERE node_id = $1`, node); n != 0 {
		t.Fatalf("%d workflows after refused deploys", n)
	}
}

// TestProvisionStoreChecksAndCommands: the lifecycle's check-image step
// sees an image changed since the workflow pinned it, and a node step's
// command is queued once per key and read back with its outcome.
func TestProvisionStoreChecksAndCommands(t *testing.T) {
	m := newMetalEnv(t)
	ctx := context.Background()
	node := m.ready("ps-1", "https://10.0.4.1")
	d, err := metal.Deploy.Call(ctx, m.client(m.boot.UserToken), metal.DeployInput{TenantID: "acme", NodeID: node,
		ProfileID: m.profile("acme", "checks")})
	if err != nil {
		t.Fatal(err)
	}
	ps := metalact.NewDBStore(m.store, m.catalog)
	if why, err := ps.CheckImage(ctx, "acme", d.WorkflowID); err != nil || why != "" {
		t.Fatalf("CheckImage = %q, %v", why, err)
	}
	if _, err := m.store.Pool.Exec(ctx, `UPDATE images SET sha256 = $1 WHERE name = 'img-checks'`, strings.Repeat("d", 64)); err != nil {
		t.Fatal(err)
	}
	if why, err := ps.CheckImage(ctx, "acme", d.WorkflowID); err != nil || !strings.Contains(why, "digest") {
		t.Fatalf("CheckImage of a changed image = %q, %v", why, err)
	}
	if _, err := m.store.Pool.Exec(ctx, `DELETE FROM images WHERE name = 'img-checks'`); err != nil {
		t.Fatal(err)
	}
	if why, err := ps.CheckImage(ctx, "acme", d.WorkflowID); err != nil || !strings.Contains(why, "gone") {
		t.Fatalf("CheckImage of a deleted image = %q, %v", why, err)
	}

	args := map[string]any{"argv": []string{"hostname"}}
	id, err := ps.EnqueueNodeCommand(ctx, "acme", node, d.WorkflowID+"/1/1", "exec", args)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := ps.EnqueueNodeCommand(ctx, "acme", node, d.WorkflowID+"/1/1", "exec", args); err != nil || again != id {
		t.Fatalf("a retried enqueue = %s, %v (want %s)", again, err, id)
	}
	if o, err := ps.NodeCommand(ctx, "acme", id); err != nil || o.Done {
		t.Fatalf("a queued command = %+v, %v", o, err)
	}
	result := func(id string, r store.NodeCommandResult) {
		t.Helper()
		if err := m.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			cmd, err := store.GetNodeCommand(ctx, tx, "acme", node, id)
			if err != nil {
				return err
			}
			return store.RecordNodeCommandResult(ctx, tx, node, cmd.Seq, r)
		}); err != nil {
			t.Fatal(err)
		}
	}
	zero, two := 0, 2
	result(id, store.NodeCommandResult{State: store.CommandSucceeded, ExitCode: &zero, Stdout: "ps-1\n"})
	if o, err := ps.NodeCommand(ctx, "acme", id); err != nil || !o.Done || !o.OK || o.Output != "ps-1\n" {
		t.Fatalf("a succeeded command = %+v, %v", o, err)
	}
	failing, err := ps.EnqueueNodeCommand(ctx, "acme", node, d.WorkflowID+"/1/2", "exec", map[string]any{"argv": []string{"false"}})
	if err != nil {
		t.Fatal(err)
	}
	result(failing, store.NodeCommandResult{State: store.CommandFailed, ExitCode: &two, Stderr: "no"})
	if o, err := ps.NodeCommand(ctx, "acme", failing); err != nil || !o.Done || o.OK || !strings.Contains(o.Error, "exit code 2") {
		t.Fatalf("a failed command = %+v, %v", o, err)
	}
	if _, err := ps.NodeCommand(ctx, "globex", id); err == nil {
		t.Fatal("another tenant read the command")
	}
}

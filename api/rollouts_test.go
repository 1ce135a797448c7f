package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	batchesact "github.com/better-compute/better-compute/activities/batches"
	nodesact "github.com/better-compute/better-compute/activities/nodes"
	rolloutsact "github.com/better-compute/better-compute/activities/rollouts"
	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/session"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/agentgateway"
	imagesapi "github.com/better-compute/better-compute/api/images"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/rollouts"
	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	corerollouts "github.com/better-compute/better-compute/core/rollouts"
	"github.com/better-compute/better-compute/internal/sshsigtest"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	imagesdomain "github.com/better-compute/better-compute/store/images"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
	workflowbatches "github.com/better-compute/better-compute/workflows/batches"
	workflownodes "github.com/better-compute/better-compute/workflows/nodes"
	workflowrollouts "github.com/better-compute/better-compute/workflows/rollouts"
)

// rolloutEnv is the agent gateway (with a blob store, so it serves release
// artifacts) and the API over a real Temporal whose worker runs the
// rollout, drain and command batch workflows, with a pool of four nodes.
type rolloutEnv struct {
	*agentEnv
	tc    client.Client
	blobs *blobs.Dir
	key   sshsigtest.Key
	nodes []nodes.Node // all four, in id order; ae.node first
	ids   map[string]join.Identity
}

func newRolloutEnv(t *testing.T) *rolloutEnv {
	t.Helper()
	ctx := context.Background()
	bs, err := blobs.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ae := newAgentEnv(t, 5*time.Minute, "", func(d *agentgateway.Deps) { d.Blobs = bs })
	tc, _ := startTemporal(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	const queue = "rollouts-test"
	srv, err := api.New(api.Deps{Store: ae.store, IAM: ae.outer, Catalog: ae.catalog, Logger: quiet, Secrets: ae.vault,
		Blobs: bs, Temporal: tc, TaskQueue: queue, Approvers: ae.admin})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	ae.server, ae.env.url = srv, hs.URL
	w := worker.New(tc, queue, worker.Options{})
	workflowrollouts.Register(w, &rolloutsact.Rollouts{Store: ae.store, Temporal: tc, TaskQueue: queue})
	workflownodes.Register(w, &nodesact.Nodes{Store: ae.store, Temporal: tc})
	workflowbatches.Register(w, &batchesact.Batches{Store: ae.store, Temporal: tc, TaskQueue: queue})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)

	re := &rolloutEnv{agentEnv: ae, tc: tc, blobs: bs, key: sshsigtest.NewKey(t, "release@fleet"),
		nodes: []nodes.Node{ae.node}, ids: map[string]join.Identity{ae.node.ID: ae.identity}}
	for i := 2; i <= 4; i++ {
		n := ae.node2(fmt.Sprintf("gpu-%d", i))
		re.nodes = append(re.nodes, n)
		re.ids[n.ID] = ae.issue(n.ID, true)
	}
	m := imagesdomain.New(bs, api.DefaultRootTenant, imagesdomain.AuthzType, 0)
	if err := ae.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, _, err := m.AddSigner(ctx, tx, "fleet", re.key.AuthorizedKey)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return re
}

func (ae *agentEnv) node2(name string) nodes.Node {
	return ae.env.node(nodesdomain.NewNode{PoolID: ae.pool.ID, Name: name, ProvisionState: nodestate.Adopted,
		Role: nodestate.RoleHost, Power: nodestate.PowerOn, ObservedGeneration: 1}, nil)
}

// fleetBinary registers and uploads data as a fleet image in format
// binary, signed by the fleet's signer when signed.
func (re *rolloutEnv) fleetBinary(name string, data []byte, signed bool) coreimages.Image {
	re.t.Helper()
	ctx := context.Background()
	sig := ""
	if signed {
		sig = re.key.SignBytes(re.t, coreimages.SignatureNamespace, data)
	}
	reg, err := imagesapi.Register.Call(ctx, re.client(re.boot.AdminToken), imagesapi.RegisterInput{TenantID: api.DefaultRootTenant,
		Scope: "fleet", Name: name, Version: "1", Format: coreimages.FormatBinary, SHA256: hexSum(data),
		SizeBytes: int64(len(data)), Signature: sig})
	if err != nil {
		re.t.Fatal(err)
	}
	im, err := imagesapi.UploadBytes(ctx, nil, re.env.url, *reg.Upload, strings.NewReader(string(data)), int64(len(data)))
	if err != nil {
		re.t.Fatal(err)
	}
	return im
}

func (re *rolloutEnv) release(version string, im coreimages.Image) rollouts.Release {
	re.t.Helper()
	r, err := rollouts.RegisterRelease.Call(context.Background(), re.client(re.boot.AdminToken), rollouts.RegisterInput{
		TenantID: api.DefaultRootTenant, Name: "bcd", Version: version, Kind: corerollouts.KindBCD,
		Artifacts: []rollouts.ArtifactInput{{Name: "bcd", ImageID: im.ID}}, AgentVersion: "bcd/" + version})
	if err != nil {
		re.t.Fatal(err)
	}
	return r
}

// fakeAgent is a node agent as a rollout sees it: it holds a session,
// answers exec with exit 0, and answers agent.update by downloading the
// artifact from the gateway, checking its digest, and reconnecting with
// the new version, whose session sends the result (as bcd does after its
// restart); with fail it refuses every update.
type fakeAgent struct {
	re      *rolloutEnv
	id      join.Identity
	fail    bool
	mu      sync.Mutex
	version string
	last    int64
}

func (re *rolloutEnv) runAgents(fail map[string]bool) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, n := range re.nodes {
		a := &fakeAgent{re: re, id: re.ids[n.ID], fail: fail[n.ID], version: "bcd/0.0.1"}
		wg.Add(1)
		go func() { defer wg.Done(); a.run(ctx) }()
	}
	return func() { cancel(); wg.Wait() }
}

func (a *fakeAgent) hello() map[string]any {
	return map[string]any{"type": "hello", "agentVersion": a.version, "lastExecutedSeq": a.last, "clock": time.Now().UnixMilli()}
}

func (a *fakeAgent) run(ctx context.Context) {
	rs, status := a.re.open(a.id)
	if status != http.StatusOK {
		a.re.t.Errorf("agent %s: session %d", a.id.NodeID, status)
		return
	}
	rs.send(a.hello())
	var pending []map[string]any // results the next session sends
	for {
		select {
		case <-ctx.Done():
			rs.close()
			return
		case <-rs.ended:
			return
		case f := <-rs.frames:
			switch f["type"] {
			case "welcome":
				for _, r := range pending {
					rs.send(r)
				}
				pending = nil
				continue
			case "command":
			default:
				continue
			}
			seq := int64(f["seq"].(float64))
			if seq <= a.last {
				continue
			}
			a.last = seq
			result := map[string]any{"type": "result", "seq": seq, "state": "succeeded", "exitCode": 0}
			if f["kind"] == string(protocol.CommandAgentUpdate) {
				raw, _ := json.Marshal(f["args"])
				var args protocol.AgentUpdateArgs
				if err := json.Unmarshal(raw, &args); err != nil {
					a.re.t.Errorf("agent.update args: %v", err)
				}
				if err := a.fetch(args); err != nil || a.fail {
					rs.send(map[string]any{"type": "result", "seq": seq, "state": "failed", "error": fmt.Sprintf("refused: %v", err)})
					continue
				}
				// The new build's session sends the result.
				rs.close()
				a.mu.Lock()
				a.version = args.Version
				a.mu.Unlock()
				if rs, status = a.re.open(a.id); status != http.StatusOK {
					a.re.t.Errorf("agent %s: reconnect %d", a.id.NodeID, status)
					return
				}
				pending = append(pending, result)
				rs.send(a.hello())
				continue
			}
			rs.send(result)
		}
	}
}

// fetch downloads the artifact over the node's mutual TLS and checks its
// size and digest, as bcd does before it swaps anything.
func (a *fakeAgent) fetch(args protocol.AgentUpdateArgs) error {
	if len(args.Signers) == 0 || args.Signature == "" {
		return fmt.Errorf("no signers or signature")
	}
	resp, err := session.NewHTTPClient(a.id).Get(a.re.url + protocol.ReleaseArtifactPath + args.ReleaseID + "/" + args.Artifact)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET artifact: %d %v", resp.StatusCode, err)
	}
	sum := sha256.Sum256(body)
	if int64(len(body)) != args.SizeBytes || hex.EncodeToString(sum[:]) != args.SHA256 {
		return fmt.Errorf("artifact digest mismatch")
	}
	return nil
}

func (re *rolloutEnv) get(id string) rollouts.Rollout {
	re.t.Helper()
	o, err := rollouts.Get.Call(context.Background(), re.client(re.boot.AdminToken),
		rollouts.RolloutInput{TenantID: api.DefaultRootTenant, RolloutID: id})
	if err != nil {
		re.t.Fatal(err)
	}
	return o
}

func (re *rolloutEnv) waitState(id, state string) rollouts.Rollout {
	re.t.Helper()
	var o rollouts.Rollout
	testutil.EventuallyNil(re.t, 90*time.Second, func() error {
		if o = re.get(id); o.State != state {
			return fmt.Errorf("rollout is %s (%v), want %s; nodes %+v", o.State, o.Counts, state, o.Nodes)
		}
		return nil
	})
	return o
}

func (re *rolloutEnv) agentVersion(nodeID string) string {
	var v string
	if err := re.store.Pool.QueryRow(context.Background(), `SELECT agent_version FROM nodes WHERE id = $1`, nodeID).Scan(&v); err != nil {
		re.t.Fatal(err)
	}
	return v
}

func (re *rolloutEnv) updates(nodeID string) int {
	var n int
	if err := re.store.Pool.QueryRow(context.Background(), `SELECT count(*) FROM node_commands WHERE node_id = $1 AND kind = 'agent.update'`,
		nodeID).Scan(&n); err != nil {
		re.t.Fatal(err)
	}
	return n
}

// TestRolloutReleasesAndWaves registers releases (refusing an unverified
// artifact and an unserved kind), then rolls one out over three of the
// pool's four nodes in a canary wave and a second wave: the agents answer
// agent.update by reconnecting on the new version; the last node refuses
// its update, so the rollout pauses itself; resumed, it finishes. Then a
// second rollout is paused, and aborted with rollback.
func TestRolloutReleasesAndWaves(t *testing.T) {
	re := newRolloutEnv(t)
	ctx := context.Background()
	c := re.client(re.boot.AdminToken)
	root := api.DefaultRootTenant

	data := []byte(strings.Repeat("#!bcd build\n", 200))
	im := re.fleetBinary("bcd-build", data, true)
	unsigned := re.fleetBinary("bcd-unsigned", []byte("unsigned build"), false)
	if _, err := rollouts.RegisterRelease.Call(ctx, c, rollouts.RegisterInput{TenantID: root, Name: "bcd", Version: "9.9.9",
		Kind: corerollouts.KindBCD, Artifacts: []rollouts.ArtifactInput{{Name: "bcd", ImageID: unsigned.ID}},
		AgentVersion: "bcd/9.9.9"}); codeOf(err) != "INVALID_STATE" {
		t.Fatalf("an unverified artifact: %v", err)
	}
	if _, err := rollouts.RegisterRelease.Call(ctx, c, rollouts.RegisterInput{TenantID: root, Name: "gpu", Version: "1",
		Kind: "profile", Artifacts: []rollouts.ArtifactInput{{Name: "bcd", ImageID: im.ID}}}); codeOf(err) != "UNSUPPORTED" {
		t.Fatalf("a profile release: %v", err)
	}
	if _, err := rollouts.RegisterRelease.Call(ctx, re.client(re.boot.UserToken), rollouts.RegisterInput{TenantID: "acme",
		Name: "bcd", Version: "1", Kind: corerollouts.KindBCD, Artifacts: []rollouts.ArtifactInput{{Name: "bcd", ImageID: im.ID}},
		AgentVersion: "bcd/1"}); codeOf(err) == "" {
		t.Fatal("a tenant registered a release")
	}
	v1 := re.release("0.1.0", im)
	v2 := re.release("0.2.0", im)
	if again := re.release("0.2.0", im); again.ID != v2.ID {
		t.Fatalf("registering 0.2.0 again: %s, want %s", again.ID, v2.ID)
	}
	list, err := rollouts.ListReleases.Call(ctx, c, rollouts.ReleaseListInput{TenantID: root, Name: "bcd"})
	if err != nil || len(list.Items) != 2 || list.Items[0].ID != v1.ID {
		t.Fatalf("releases.list: %+v %v", list, err)
	}

	// Three of the four nodes carry the label; the last of them fails.
	sel, other := re.nodes[:3], re.nodes[3]
	for _, n := range sel {
		if _, err := re.store.Pool.Exec(ctx, `UPDATE nodes SET labels = '{"ring":"a"}' WHERE id = $1`, n.ID); err != nil {
			t.Fatal(err)
		}
	}
	bad := sel[2].ID
	stop := re.runAgents(map[string]bool{bad: true})
	defer stop()
	re.eventually("the agent connected", func(s agentNodeState) bool { return s.connectivity == "connected" })

	o, err := rollouts.Create.Call(ctx, c, rollouts.CreateInput{TenantID: root, ReleaseID: v2.ID,
		Selection: rollouts.Selection{PoolID: re.pool.ID, Labels: map[string]string{"ring": "a"}},
		Canary:    1, Waves: []corerollouts.Wave{{Percent: 100}},
		AcceptanceCommand: &rollouts.AcceptanceInput{Argv: []string{"bcd", "selfcheck"}}, NodeTimeoutSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(o.ID, "rollout_") || o.Waves != 2 || o.Counts[corerollouts.NodePending] != 3 {
		t.Fatalf("create: %+v", o)
	}
	paused := re.waitState(o.ID, corerollouts.PausedOnFailure)
	states := map[string]string{}
	for _, n := range paused.Nodes {
		states[n.NodeID] = n.State
	}
	if states[sel[0].ID] != corerollouts.NodeSucceeded || states[sel[1].ID] != corerollouts.NodeSucceeded ||
		states[bad] != corerollouts.NodeFailed || paused.Wave != 1 {
		t.Fatalf("paused on failure: %+v", paused)
	}
	for _, n := range sel[:2] {
		if v := re.agentVersion(n.ID); v != "bcd/0.2.0" {
			t.Fatalf("node %s runs %q", n.ID, v)
		}
	}
	if v := re.agentVersion(other.ID); v != "bcd/0.0.1" || re.updates(other.ID) != 0 {
		t.Fatalf("the unselected node was touched: %q, %d updates", v, re.updates(other.ID))
	}
	var st rolloutsact.State
	testutil.EventuallyNil(t, 20*time.Second, func() error {
		v, err := re.tc.QueryWorkflow(ctx, o.ID, "", visibility.QueryState)
		if err != nil {
			return err
		}
		if err := v.Get(&st); err != nil {
			return err
		}
		if st.State != corerollouts.PausedOnFailure || st.Counts[corerollouts.NodeFailed] != 1 {
			return fmt.Errorf("state query: %+v", st)
		}
		return nil
	})
	// Resumed past the failed node, the last wave is done.
	if _, err := rollouts.Resume.Call(ctx, c, rollouts.RolloutInput{TenantID: root, RolloutID: o.ID}); err != nil {
		t.Fatal(err)
	}
	done := re.waitState(o.ID, corerollouts.Succeeded)
	if done.FinishedAt == nil {
		t.Fatalf("succeeded without finishedAt: %+v", done)
	}
	for _, n := range sel {
		if got := re.updates(n.ID); got != 1 {
			t.Fatalf("node %s got %d agent.update commands, want 1", n.ID, got)
		}
	}
	// The updated nodes are schedulable again; the failed one stays cordoned.
	for _, n := range sel {
		var cordoned bool
		if err := re.store.Pool.QueryRow(ctx, `SELECT cordoned FROM nodes WHERE id = $1`, n.ID).Scan(&cordoned); err != nil {
			t.Fatal(err)
		}
		if cordoned != (n.ID == bad) {
			t.Fatalf("node %s cordoned %v", n.ID, cordoned)
		}
	}

	// A second rollout, paused at once: at most the node in flight moves;
	// aborted with rollback, it skips the rest and puts what it updated
	// back on 0.2.0.
	v3 := re.release("0.3.0", im)
	o2, err := rollouts.Create.Call(ctx, c, rollouts.CreateInput{TenantID: root, ReleaseID: v3.ID,
		Selection: rollouts.Selection{PoolID: re.pool.ID, Labels: map[string]string{"ring": "a"}}, NodeTimeoutSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rollouts.Pause.Call(ctx, c, rollouts.RolloutInput{TenantID: root, RolloutID: o2.ID}); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyNil(t, 60*time.Second, func() error {
		g := re.get(o2.ID)
		for _, n := range g.Nodes {
			if n.State == corerollouts.NodeDraining || n.State == corerollouts.NodeUpdating || n.State == corerollouts.NodeChecking {
				return fmt.Errorf("node %s still %s", n.NodeID, n.State)
			}
		}
		if g.State != corerollouts.Paused || g.Counts[corerollouts.NodePending] < 2 {
			return fmt.Errorf("paused rollout: %+v", g)
		}
		return nil
	})
	if _, err := rollouts.Abort.Call(ctx, c, rollouts.AbortInput{TenantID: root, RolloutID: o2.ID, Rollback: true}); err != nil {
		t.Fatal(err)
	}
	aborted := re.waitState(o2.ID, corerollouts.Aborted)
	for _, n := range aborted.Nodes {
		switch n.State {
		case corerollouts.NodeSkipped, corerollouts.NodeRolledBack, corerollouts.NodeFailed:
		default:
			t.Fatalf("after abort: node %+v", n)
		}
		if n.State == corerollouts.NodeRolledBack {
			id := n.NodeID
			testutil.Eventually(t, 30*time.Second, "the rolled-back node runs 0.2.0 again", func() bool {
				return re.agentVersion(id) == "bcd/0.2.0"
			})
		}
	}
	if _, err := rollouts.Resume.Call(ctx, c, rollouts.RolloutInput{TenantID: root, RolloutID: o2.ID}); codeOf(err) != "INVALID_STATE" {
		t.Fatalf("resuming an aborted rollout: %v", err)
	}
	all, err := rollouts.List.Call(ctx, c, rollouts.RolloutListInput{TenantID: root})
	if err != nil || len(all.Items) != 2 {
		t.Fatalf("rollouts.list: %+v %v", all, err)
	}
}

// TestRolloutBudgetImpossible: a pool whose disruption budget lets no
// node drain refuses a rollout at create, with the reason.
func TestRolloutBudgetImpossible(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	site := e.site(e.boot.UserToken, "acme", "fra-b", "custom")
	pool := e.poolWith("acme", site.ID, "frozen", "H100", "", `{"disruptionBudget":0}`)
	e.node(nodesdomain.NewNode{PoolID: pool.ID, Name: "frozen-1", ProvisionState: nodestate.Adopted, Role: nodestate.RoleHost,
		Power: nodestate.PowerOn, ObservedGeneration: 1}, nil)
	if _, err := e.store.Pool.Exec(ctx, `INSERT INTO releases (id, tenant_id, name, version, kind, artifacts, agent_version, created_by)
		VALUES ('rel_00000000000000000000000000', $1, 'bcd', '1', 'bcd', '[]', 'bcd/1', 'idn_x')`, api.DefaultRootTenant); err != nil {
		t.Fatal(err)
	}
	_, err := rollouts.Create.Call(ctx, e.client(e.boot.AdminToken), rollouts.CreateInput{TenantID: api.DefaultRootTenant,
		ReleaseID: "rel_00000000000000000000000000", Selection: rollouts.Selection{PoolID: pool.ID}})
	var ce *core.Error
	if !errors.As(err, &ce) || ce.Code != core.CodeInvalidState || detailsOf(ce)["reason"] != "disruptionBudget" {
		t.Fatalf("a budget-impossible rollout: %v", err)
	}
	var n int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM rollouts`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rollouts recorded, %v", n, err)
	}
}

// TestRolloutResumesAfterItsWorkflowIsTerminated: a rollout whose workflow
// is terminated mid-wave is started again by the reconciler and finishes
// from its rows, updating no node twice.
func TestRolloutResumesAfterItsWorkflowIsTerminated(t *testing.T) {
	re := newRolloutEnv(t)
	ctx := context.Background()
	c := re.client(re.boot.AdminToken)
	root := api.DefaultRootTenant
	rel := re.release("0.2.0", re.fleetBinary("bcd-build", []byte("a bcd build"), true))
	stop := re.runAgents(nil)
	defer stop()
	o, err := rollouts.Create.Call(ctx, c, rollouts.CreateInput{TenantID: root, ReleaseID: rel.ID,
		Selection: rollouts.Selection{PoolID: re.pool.ID}, NodeTimeoutSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, "the first node updated", func() bool {
		return re.get(o.ID).Counts[corerollouts.NodeSucceeded] >= 1
	})
	if err := re.tc.TerminateWorkflow(ctx, o.ID, "", "test: the worker lost it"); err != nil {
		t.Fatal(err)
	}
	mid := re.get(o.ID)
	if mid.State != corerollouts.Running || mid.Counts[corerollouts.NodeSucceeded] == len(re.nodes) {
		t.Fatalf("after the termination: %+v", mid)
	}
	n, err := (&rolloutsact.Rollouts{Store: re.store, Temporal: re.tc, TaskQueue: "rollouts-test"}).ReconcileRollouts(ctx)
	if err != nil || n != 1 {
		t.Fatalf("reconcile: %d %v", n, err)
	}
	re.waitState(o.ID, corerollouts.Succeeded)
	for _, n := range re.nodes {
		if got, v := re.updates(n.ID), re.agentVersion(n.ID); got != 1 || v != "bcd/0.2.0" {
			t.Fatalf("node %s: %d agent.update commands, version %q", n.ID, got, v)
		}
	}
}

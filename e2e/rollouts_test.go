package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/fleet"
	apiimages "github.com/better-compute/better-compute/api/images"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/rollouts"
	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	corerollouts "github.com/better-compute/better-compute/core/rollouts"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/sshsigtest"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	imagestore "github.com/better-compute/better-compute/store/images"
)

// bcdAt builds cmd/bcd reporting version (its hello says "bcd/<version>")
// into dir.
func bcdAt(t *testing.T, dir, version string) string {
	t.Helper()
	bin := filepath.Join(dir, "bcd-"+version)
	cmd := exec.Command("go", "build", "-ldflags", "-X github.com/better-compute/better-compute/internal/buildinfo.Version="+version,
		"-o", bin, "./cmd/bcd")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/bcd at %s: %v: %s", version, err, out)
	}
	return bin
}

// copyExecutable copies an executable: every agent of the test runs (and
// replaces) its own.
func copyExecutable(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// A bcd release rolled out over three real agents in two waves (a canary,
// then the rest one node at a time under the pool's disruption budget):
// each agent downloads the signed build, replaces itself in the same
// process and re-joins at the new version with the same identity; the
// control-plane worker killed with SIGKILL after the canary leaves the
// rollout to the next worker, which never updates a node twice; an agent
// killed before its turn never comes back, fails, and the rollout pauses
// itself; a resume finishes the wave past it. The updated agents then run
// a destructive command batch behind an approver registered on the IAM
// admin surface.
func TestRolloutOfABcdRelease(t *testing.T) {
	dir := stackDir(t)
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	builds := t.TempDir()
	v1 := bcdAt(t, builds, "e2e-1")
	v2 := bcdAt(t, builds, "e2e-2")

	s, err := devstack.Start(context.Background(), devstack.Options{Dir: dir, APIAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0",
		PostgresPort: pgPort, TemporalAddr: "127.0.0.1:0", UIAddr: "-", Agents: -1, NoWorker: true,
		AgentLease: 2 * time.Second, AgentHeartbeat: time.Second, LivenessSweep: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("devstack: %v", err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	worker := workerProcess(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	adminToken, err := s.AdminToken()
	if err != nil {
		t.Fatal(err)
	}
	admin := api.NewClient(s.APIURL(), adminToken)
	const root = "root"
	db, err := pgx.Connect(ctx, s.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())

	// The fleet's signer, as `better-compute image-signers add` adds one.
	signer := sshsigtest.NewKey(t, "e2e-release-signer")
	st, err := store.Open(ctx, s.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	catalog, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	signers := imagestore.New(nil, root, catalog.FullName(imagestore.ResourceType), 0)
	if err := st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, _, err := signers.AddSigner(ctx, tx, root, signer.AuthorizedKey)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	// Three agents at e2e-1 in a pool whose budget drains one at a time.
	budget := 0.34
	pool, err := pools.Create.Call(ctx, admin, pools.CreateInput{TenantID: root, SiteID: s.Demo().SiteID, Name: "rollout",
		Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80, Policy: &pools.Policy{DisruptionBudget: &budget}})
	if err != nil {
		t.Fatal(err)
	}
	uses := int64(3)
	tok, err := nodes.CreateJoinToken.Call(ctx, admin, nodes.CreateJoinTokenInput{TenantID: root, PoolID: pool.ID, Name: "rollout", MaxUses: &uses})
	if err != nil {
		t.Fatal(err)
	}
	agents := map[string]*agent{} // by node name
	for i := 1; i <= 3; i++ {
		a := &agent{t: t, dir: filepath.Join(dir, fmt.Sprintf("rollout-agent-%d", i)), name: fmt.Sprintf("rollout-agent-%d", i)}
		a.bin = filepath.Join(a.dir, "bin", "bcd")
		copyExecutable(t, v1, a.bin)
		a.start("join", "--api", s.APIURL(), "--token", tok.Token, "--name", a.name, "--poll-interval", "100ms")
		if err := <-a.done; err != nil {
			t.Fatalf("bcd node join: %v\n%s", err, a.log)
		}
		a.start("run")
		agents[a.name] = a
	}
	agentVersions := func() map[string]string { // node id → agent version, for connected nodes
		rows, err := db.Query(ctx, `SELECT id, agent_version FROM nodes WHERE pool_id = $1 AND connectivity = 'connected'`, pool.ID)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for rows.Next() {
			var id, v string
			if err := rows.Scan(&id, &v); err != nil {
				t.Fatal(err)
			}
			out[id] = v
		}
		return out
	}
	testutil.Eventually(t, agentWait, "three connected agents at e2e-1", func() bool {
		v := agentVersions()
		n := 0
		for _, ver := range v {
			if ver == "bcd/e2e-1" {
				n++
			}
		}
		return n == 3
	})
	agentOf := func(nodeID string) *agent {
		n, err := nodes.Get.Call(ctx, admin, nodes.NodeInput{TenantID: root, NodeID: nodeID})
		if err != nil {
			t.Fatal(err)
		}
		return agents[n.Name]
	}

	// The dev stack's fleet, with these agents (one labelled), exports as a
	// document that plans as no change.
	for id := range agentVersions() {
		if _, err := nodes.Label.Call(ctx, admin, nodes.LabelInput{TenantID: root, NodeID: id, Set: map[string]string{"rack": "r1"}}); err != nil {
			t.Fatal(err)
		}
		break
	}
	exported, err := fleet.ExportMethod.Call(ctx, admin, fleet.ExportInput{TenantID: root})
	if err != nil || len(exported.Document.Pools) < 2 || len(exported.Document.Nodes) != 1 {
		t.Fatalf("fleet.export = %+v, %v", exported.Document, err)
	}
	document, err := json.Marshal(exported.Document)
	if err != nil {
		t.Fatal(err)
	}
	if plan, err := fleet.PlanMethod.Call(ctx, admin, fleet.PlanInput{TenantID: root, Document: string(document)}); err != nil ||
		len(plan.Changes) != 0 || plan.Digest != exported.Digest {
		t.Fatalf("the exported fleet planned: %+v, %v", plan, err)
	}
	t.Logf("the dev stack's fleet: %d sites, %d pools, %d labelled nodes, %d bytes; export → plan: no change",
		len(exported.Document.Sites), len(exported.Document.Pools), len(exported.Document.Nodes), len(document))

	// The release: e2e-2's build as a signed fleet binary image.
	b, err := os.ReadFile(v2)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	reg, err := apiimages.Register.Call(ctx, admin, apiimages.RegisterInput{TenantID: root, Scope: "fleet", Name: "bcd", Version: "e2e-2",
		Format: "binary", SHA256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(b)),
		Signature: signer.Sign(t, coreimages.SignatureNamespace, v2)})
	if err != nil {
		t.Fatal(err)
	}
	image := reg.Image
	if reg.Upload != nil {
		if image, err = apiimages.UploadBytes(ctx, nil, s.APIURL(), *reg.Upload, bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	if !image.Verified {
		t.Fatalf("the release's image is not verified: %+v", image)
	}
	release, err := rollouts.RegisterRelease.Call(ctx, admin, rollouts.RegisterInput{TenantID: root, Name: "bcd", Version: "e2e-2", Kind: "bcd",
		Artifacts: []rollouts.ArtifactInput{{Name: "bcd", ImageID: image.ID}}, AgentVersion: "bcd/e2e-2"})
	if err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	ro, err := rollouts.Create.Call(ctx, admin, rollouts.CreateInput{TenantID: root, ReleaseID: release.ID,
		Selection: rollouts.Selection{PoolID: pool.ID}, Canary: 1, Waves: []corerollouts.Wave{{Percent: 100}},
		NodeTimeoutSeconds: 20})
	if err != nil {
		t.Fatal(err)
	}
	get := func() rollouts.Rollout {
		r, err := rollouts.Get.Call(ctx, admin, rollouts.RolloutInput{TenantID: root, RolloutID: ro.ID})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	nodeState := func(r rollouts.Rollout, id string) string {
		for _, n := range r.Nodes {
			if n.NodeID == id {
				return n.State
			}
		}
		return ""
	}
	if ro = get(); ro.Waves != 2 || len(ro.Nodes) != 3 {
		t.Fatalf("rollout %+v", ro)
	}
	var canary string
	var rest []string
	for _, n := range ro.Nodes {
		if n.Wave == 0 {
			canary = n.NodeID
		} else {
			rest = append(rest, n.NodeID)
		}
	}
	if canary == "" || len(rest) != 2 {
		t.Fatalf("waves of %+v", ro.Nodes)
	}
	canaryAgent := agentOf(canary)
	testutil.Eventually(t, 2*time.Minute, "the canary updated", func() bool {
		return nodeState(get(), canary) == "succeeded"
	})
	t.Logf("the canary updated %v after the create", time.Since(began).Round(time.Millisecond))
	if v := agentVersions()[canary]; v != "bcd/e2e-2" {
		t.Fatalf("the canary runs %q", v)
	}
	// The same process, now the new build; the previous one kept.
	select {
	case err := <-canaryAgent.done:
		t.Fatalf("the canary's bcd exited: %v\n%s", err, canaryAgent.log)
	default:
	}
	if _, err := os.Stat(canaryAgent.bin + ".previous"); err != nil {
		t.Fatalf("the previous build: %v", err)
	}

	// The worker dies after the canary; one agent of the second wave dies
	// before its turn and never comes back.
	if err := worker.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = worker.Wait()
	doomed := rest[1]
	agentOf(doomed).kill()
	workerProcess(t, s)

	testutil.Eventually(t, 3*time.Minute, "the rollout paused on the failed node", func() bool {
		return get().State == "pausedOnFailure"
	})
	r := get()
	t.Logf("paused on failure %v after the create", time.Since(began).Round(time.Millisecond))
	if nodeState(r, doomed) != "failed" {
		t.Fatalf("the dead agent's node is %q: %+v", nodeState(r, doomed), r.Nodes)
	}
	if _, err := rollouts.Resume.Call(ctx, admin, rollouts.RolloutInput{TenantID: root, RolloutID: ro.ID}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Minute, "the rollout done", func() bool {
		return get().State == "succeeded"
	})
	t.Logf("succeeded %v after the create (the resume included)", time.Since(began).Round(time.Millisecond))
	r = get()
	if nodeState(r, canary) != "succeeded" || nodeState(r, rest[0]) != "succeeded" || nodeState(r, doomed) != "failed" {
		t.Fatalf("nodes %+v", r.Nodes)
	}
	versions := agentVersions()
	if versions[canary] != "bcd/e2e-2" || versions[rest[0]] != "bcd/e2e-2" {
		t.Fatalf("versions %v", versions)
	}
	// Each updated node ran exactly one agent.update.
	var updates int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM node_commands WHERE kind = 'agent.update' AND node_id = ANY($1)`,
		[]string{canary, rest[0]}).Scan(&updates); err != nil {
		t.Fatal(err)
	}
	if updates != 2 {
		t.Fatalf("%d agent.update commands for two nodes", updates)
	}

	// The updated agents run a command batch behind an approver.
	runApprovedBatch(ctx, t, s.APIURL(), adminToken, []string{canary, rest[0]})
}

package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	batchesact "github.com/better-compute/better-compute/activities/batches"
	"github.com/better-compute/better-compute/api/batches"
	"github.com/better-compute/better-compute/core"
	corebatches "github.com/better-compute/better-compute/core/batches"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/sshsigtest"
	"github.com/better-compute/better-compute/internal/testutil"
)

// batchEnv is the rollout env's API, gateway and four agent nodes of acme,
// with a worker running command batches and people who approve them, each
// with a registered approver key.
type batchEnv struct {
	*rolloutEnv
	keys   map[string]sshsigtest.Key // by person: creator, alice, bob, carol
	tokens map[string]string
	ids    map[string]string
	batchA *batchesact.Batches
}

func newBatchEnv(t *testing.T) *batchEnv {
	re := newRolloutEnv(t)
	be := &batchEnv{rolloutEnv: re, keys: map[string]sshsigtest.Key{}, tokens: map[string]string{}, ids: map[string]string{}}
	be.batchA = &batchesact.Batches{Store: re.store, Temporal: re.tc, TaskQueue: "rollouts-test"}
	be.tokens["creator"], be.ids["creator"] = re.boot.UserToken, re.boot.UserIdentityID
	for _, name := range []string{"alice", "bob", "carol"} {
		groups := []string{iam.BootstrapTenantGroup}
		if name == "carol" {
			groups = nil // a registered key, but no compute:batches:approve
		}
		be.tokens[name] = re.person("acme", name, groups)
		be.ids[name] = re.identityOf(be.tokens[name])
	}
	for _, name := range []string{"creator", "alice", "bob", "carol"} {
		k := sshsigtest.NewKey(t, name+"@acme")
		if _, err := re.admin.AddApproverKey(context.Background(), iam.AddApproverKeyInput{TenantID: "acme",
			IdentityID: be.ids[name], PublicKey: k.AuthorizedKey}); err != nil {
			t.Fatal(err)
		}
		be.keys[name] = k
	}
	return be
}

func (be *batchEnv) sign(who, namespace, digest string) string {
	return be.keys[who].SignBytes(be.t, namespace, []byte(digest))
}

func (be *batchEnv) approve(who string, b batches.Batch, digest, sig string) (batches.Batch, error) {
	return batches.Approve.Call(context.Background(), be.client(be.tokens[who]), batches.ApproveInput{TenantID: "acme",
		BatchID: b.ID, Digest: digest, Signature: sig})
}

func (be *batchEnv) get(id string) batches.Batch {
	be.t.Helper()
	b, err := batches.Get.Call(context.Background(), be.client(be.tokens["creator"]), batches.BatchInput{TenantID: "acme", BatchID: id})
	if err != nil {
		be.t.Fatal(err)
	}
	return b
}

func (be *batchEnv) waitState(id, state string) batches.Batch {
	be.t.Helper()
	var b batches.Batch
	testutil.EventuallyNil(be.t, 60*time.Second, func() error {
		if b = be.get(id); b.State != state {
			return fmt.Errorf("batch is %s (%v), want %s", b.State, b.Counts, state)
		}
		return nil
	})
	return b
}

// commands counts the node commands a batch queued.
func (be *batchEnv) commands(batchID string) int {
	var n int
	if err := be.store.Pool.QueryRow(context.Background(), `SELECT count(*) FROM node_commands WHERE idempotency_key LIKE $1`,
		batchID+"/%").Scan(&n); err != nil {
		be.t.Fatal(err)
	}
	return n
}

func refusedFor(err error) string {
	if ce := core.AsError(err); ce != nil && ce.Code == core.CodeInvalidState {
		r, _ := ce.Details["reason"].(string)
		return r
	}
	return fmt.Sprint(err)
}

// TestCommandBatchesRunOnlyBehindAQuorum: a destructive batch over three
// labelled nodes waits for two approvers; the creator's approval, a
// signature over another digest, another person's key, a cancellation
// signature and a caller without compute:batches:approve are refused; one
// approval of two runs nothing; the second runs it in two waves, one
// exec per node with its audit row. A batch whose selection gains a node
// after its first approval is refused at the second and never runs; a
// running batch is cancelled with its commands.
func TestCommandBatchesRunOnlyBehindAQuorum(t *testing.T) {
	be := newBatchEnv(t)
	ctx := context.Background()
	creator := be.client(be.tokens["creator"])
	for _, n := range be.nodes[:3] {
		be.exec(`UPDATE nodes SET labels = '{"group":"a"}' WHERE id = $1`, n.ID)
	}
	stop := be.runAgents(nil)
	defer stop()
	sel := batches.Selection{PoolID: be.pool.ID, Labels: map[string]string{"group": "a"}}

	// Bad input changes nothing.
	quorum0 := 0
	for name, in := range map[string]batches.CreateInput{
		"a per-node kind":         {Commands: []batches.CommandInput{{Kind: "cdi.expose"}}},
		"exec without argv":       {Commands: []batches.CommandInput{{Kind: "exec", Args: json.RawMessage(`{}`)}}},
		"destructive, no quorum":  {Commands: []batches.CommandInput{{Kind: "reboot"}}, Quorum: &quorum0},
		"a selection of no nodes": {Commands: []batches.CommandInput{{Kind: "reboot"}}, Selection: batches.Selection{}},
	} {
		in.TenantID = "acme"
		if in.Selection.PoolID == "" && name != "a selection of no nodes" {
			in.Selection = sel
		}
		if _, err := batches.Create.Call(ctx, creator, in); codeOf(err) != core.CodeInvalidInput {
			t.Errorf("%s: %v, want INVALID_INPUT", name, err)
		}
	}

	scope, err := batches.ScopeOf.Call(ctx, creator, batches.ScopeInput{TenantID: "acme", Selection: &sel})
	if err != nil || scope.Count != 3 {
		t.Fatalf("scope = %+v, %v", scope, err)
	}
	b, err := batches.Create.Call(ctx, creator, batches.CreateInput{TenantID: "acme", Description: "restart the trainer",
		Commands:  []batches.CommandInput{{Kind: "exec", Args: json.RawMessage(`{"argv":["systemctl","restart","trainer"]}`)}},
		Selection: sel, Concurrency: 2})
	if err != nil || b.State != "awaitingApproval" || b.Quorum != 2 || b.Waves != 2 || !slices.Equal(b.NodeIDs, scope.NodeIDs) {
		t.Fatalf("create = %+v, %v", b, err)
	}
	want, err := corebatches.Digest(corebatches.Batch{ID: b.ID, TenantID: "acme", Commands: b.Commands, Nodes: scope.NodeIDs, Quorum: 2})
	if err != nil || want != b.Digest {
		t.Fatalf("digest %s, recomputed %s (%v)", b.Digest, want, err)
	}

	sig := corebatches.SignatureNamespace
	for name, try := range map[string]struct {
		who, digest, sig, reason string
	}{
		"the creator":           {"creator", b.Digest, be.sign("creator", sig, b.Digest), "creator"},
		"another digest":        {"alice", "sha256:" + fmt.Sprintf("%064x", 1), be.sign("alice", sig, "sha256:"+fmt.Sprintf("%064x", 1)), "digest"},
		"bob's key for alice":   {"alice", b.Digest, be.sign("bob", sig, b.Digest), "signature"},
		"a cancel as approval":  {"alice", b.Digest, be.sign("alice", corebatches.CancelNamespace, b.Digest), "signature"},
		"no approve permission": {"carol", b.Digest, be.sign("carol", sig, b.Digest), ""},
	} {
		_, err := be.approve(try.who, b, try.digest, try.sig)
		if try.reason == "" {
			if codeOf(err) != core.CodeAccessDenied {
				t.Errorf("%s: %v, want ACCESS_DENIED", name, err)
			}
			continue
		}
		if got := refusedFor(err); got != try.reason {
			t.Errorf("%s: %v, want INVALID_STATE %s", name, err, try.reason)
		}
	}

	// One approval of two: nothing runs, and the reconciler owes nothing.
	got, err := be.approve("alice", b, b.Digest, be.sign("alice", sig, b.Digest))
	if err != nil || got.State != "awaitingApproval" || len(got.Approvals) != 1 {
		t.Fatalf("first approval = %+v, %v", got, err)
	}
	if _, err := be.approve("alice", b, b.Digest, be.sign("alice", sig, b.Digest)); refusedFor(err) != "duplicate" {
		t.Fatalf("the same approver twice = %v, want duplicate", err)
	}
	if n, err := be.batchA.ReconcileBatches(ctx); err != nil || n != 0 {
		t.Fatalf("reconcile = %d, %v: a batch short of its quorum is owed no workflow", n, err)
	}
	if n := be.commands(b.ID); n != 0 {
		t.Fatalf("%d commands queued with one approval of two", n)
	}

	// The second approval runs it: two waves, one exec on each node.
	if got, err = be.approve("bob", b, b.Digest, be.sign("bob", sig, b.Digest)); err != nil || got.State != "running" {
		t.Fatalf("second approval = %+v, %v", got, err)
	}
	// Its workflow is lost at once: the reconciler starts it again, and
	// it goes on from the rows.
	_ = be.tc.TerminateWorkflow(ctx, b.ID, "", "a lost workflow")
	if _, err := be.batchA.ReconcileBatches(ctx); err != nil {
		t.Fatal(err)
	}
	done := be.waitState(b.ID, "succeeded")
	waves := map[int]int{}
	for _, n := range done.Nodes {
		waves[n.Wave]++
		if n.State != "succeeded" || len(n.Results) != 1 || n.Results[0].State != "succeeded" || *n.Results[0].ExitCode != 0 {
			t.Errorf("node %+v", n)
		}
	}
	if waves[0] != 2 || waves[1] != 1 || be.commands(b.ID) != 3 {
		t.Fatalf("waves %v, %d commands; want 2+1 and 3", waves, be.commands(b.ID))
	}
	var runs, approvals int
	if err := be.store.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE method = 'commands.run' AND identity_id = $1 AND action = 'compute:nodes:exec'),
		count(*) FILTER (WHERE method = 'commandBatches.approve') FROM audit_events WHERE tenant_id = 'acme'`, be.ids["creator"]).
		Scan(&runs, &approvals); err != nil || runs != 3 || approvals != 2 {
		t.Fatalf("audit: %d commands.run rows (want 3), %d approvals (want 2), %v", runs, approvals, err)
	}

	// The scope changes after the first approval: refused, never run.
	b2, err := batches.Create.Call(ctx, creator, batches.CreateInput{TenantID: "acme",
		Commands: []batches.CommandInput{{Kind: "reboot"}}, Selection: sel})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := be.approve("alice", b2, b2.Digest, be.sign("alice", sig, b2.Digest)); err != nil {
		t.Fatal(err)
	}
	be.exec(`UPDATE nodes SET labels = '{"group":"a"}' WHERE id = $1`, be.nodes[3].ID)
	now, err := batches.ScopeOf.Call(ctx, creator, batches.ScopeInput{TenantID: "acme", BatchID: b2.ID})
	if err != nil || !now.Changed || !slices.Equal(now.Added, []string{be.nodes[3].ID}) {
		t.Fatalf("scope of the batch = %+v, %v", now, err)
	}
	if _, err := be.approve("bob", b2, b2.Digest, be.sign("bob", sig, b2.Digest)); refusedFor(err) != "scopeChanged" {
		t.Fatalf("approval after the scope changed = %v, want scopeChanged", err)
	}
	if got := be.get(b2.ID); got.State != "awaitingApproval" || len(got.Approvals) != 1 || be.commands(b2.ID) != 0 {
		t.Fatalf("after the refusal: %+v, %d commands", got, be.commands(b2.ID))
	}
	cancelled, err := batches.Cancel.Call(ctx, creator, batches.CancelInput{TenantID: "acme", BatchID: b2.ID,
		Signature: be.sign("creator", corebatches.CancelNamespace, b2.Digest)})
	if err != nil || cancelled.State != "cancelled" {
		t.Fatalf("cancel = %+v, %v", cancelled, err)
	}

	// Cancel while running: the agents are gone, so the commands wait.
	stop()
	one := 1
	b3, err := batches.Create.Call(ctx, creator, batches.CreateInput{TenantID: "acme",
		Commands: []batches.CommandInput{{Kind: "reboot"}}, Selection: batches.Selection{NodeIDs: []string{be.nodes[0].ID}}, Quorum: &one})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := be.approve("alice", b3, b3.Digest, be.sign("alice", sig, b3.Digest)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the reboot queued", func() bool { return be.commands(b3.ID) == 1 })
	if _, err := batches.Cancel.Call(ctx, creator, batches.CancelInput{TenantID: "acme", BatchID: b3.ID,
		Signature: be.sign("creator", sig, b3.Digest)}); refusedFor(err) != "signature" {
		t.Fatalf("cancel with an approval's signature = %v, want signature", err)
	}
	if _, err := batches.Cancel.Call(ctx, be.client(be.tokens["carol"]), batches.CancelInput{TenantID: "acme", BatchID: b3.ID,
		Signature: be.sign("carol", corebatches.CancelNamespace, b3.Digest)}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("cancel without compute:batches:approve = %v, want ACCESS_DENIED", err)
	}
	if cancelled, err = batches.Cancel.Call(ctx, be.client(be.tokens["bob"]), batches.CancelInput{TenantID: "acme", BatchID: b3.ID,
		Signature: be.sign("bob", corebatches.CancelNamespace, b3.Digest)}); err != nil || cancelled.State != "cancelled" {
		t.Fatalf("cancel while running = %+v, %v", cancelled, err)
	}
	var cmdState string
	if err := be.store.Pool.QueryRow(ctx, `SELECT state FROM node_commands WHERE idempotency_key LIKE $1`, b3.ID+"/%").Scan(&cmdState); err != nil || cmdState != "cancelled" {
		t.Fatalf("the reboot is %s (%v), want cancelled", cmdState, err)
	}

	// Another tenant sees nothing.
	if _, err := batches.Get.Call(ctx, be.client(be.globex), batches.BatchInput{TenantID: "globex", BatchID: b.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex get = %v, want NOT_FOUND", err)
	}
	if _, err := batches.Get.Call(ctx, be.client(be.globex), batches.BatchInput{TenantID: "acme", BatchID: b.ID}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex get in acme = %v, want ACCESS_DENIED", err)
	}
	list, err := batches.ListMethod.Call(ctx, creator, batches.ListInput{TenantID: "acme"})
	if err != nil || len(list.Items) != 3 || list.Items[0].ID != b.ID || list.Items[0].NodeIDs != nil {
		t.Fatalf("list = %+v, %v", list, err)
	}
}

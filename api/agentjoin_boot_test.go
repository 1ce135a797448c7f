package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/metal"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/store"
	metaldomain "github.com/better-compute/better-compute/store/metal"
)

// A deployed system's agent joins with its deploy boot's token: only the
// boot's node, only with that node's hardware key, only while the boot is
// open, and a refusal is recorded on the boot for the workflow to see.
func TestAgentJoinWithDeployBoot(t *testing.T) {
	m := newMetalEnv(t)
	ctx := context.Background()
	c := m.client(m.boot.UserToken)
	n := m.enroll("m1", "https://10.0.0.1")
	epoch := m.siteHolder(m.token, "agent-a")
	if _, err := metal.Manage.Call(ctx, c, metal.NodeInput{TenantID: "acme", NodeID: n.Node.ID}); err != nil {
		t.Fatal(err)
	}
	op := m.get(n.Node.ID).Lifecycle.OpSeq
	installed := machine(t, "00000000b001")
	if _, err := m.store.Pool.Exec(ctx, `UPDATE nodes SET hardware_key = $2 WHERE id = $1`, n.Node.ID,
		inventory.ComputeHardwareKey(installed).Key); err != nil {
		t.Fatal(err)
	}
	bootWith := func(purpose string) (metaldomain.Boot, string) {
		t.Helper()
		var b metaldomain.Boot
		if err := m.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			b, err = metaldomain.CreateBoot(ctx, tx, n.Node.ID, op, purpose)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		status, body, _ := postAgentH(t, m.url, protocol.SiteBootTokenPath, `{`+siteAuth(m.token, epoch)+`,"bootId":"`+b.ID+`"}`)
		var tok protocol.SiteBootTokenResult
		if err := json.Unmarshal([]byte(body), &tok); status != 200 || err != nil {
			t.Fatalf("mint: %d %s", status, body)
		}
		return b, tok.Token
	}
	deploy, token := bootWith(metaldomain.PurposeDeploy)
	_, inspectToken := bootWith(metaldomain.PurposeInspect)

	// The gateway serves joins once it has a node CA.
	ca, err := nodeca.LoadOrGenerate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m.withGateway(agentgateway.Deps{NodeCA: ca, AgentEndpoint: testAgentEndpoint, Secrets: m.vault})
	joinAs := func(tok string, inv *inventory.NodeInventory) (join.Identity, error) {
		return join.Join(ctx, join.Options{APIURL: m.url, Token: tok, StateDir: t.TempDir(), Name: "deployed", Inventory: inv})
	}
	nodesBefore := m.count(`SELECT count(*) FROM nodes`)

	// Another machine presenting the token is refused, and the boot says why.
	if _, err := joinAs(token, machine(t, "00000000b002")); core.AsError(err).Code != core.CodeConflict ||
		!strings.Contains(err.Error(), "hardware key") {
		t.Fatalf("a join with another hardware key: %v", err)
	}
	var joinErr string
	if err := m.store.Pool.QueryRow(ctx, `SELECT join_error FROM metal_boots WHERE id = $1`, deploy.ID).Scan(&joinErr); err != nil ||
		!strings.Contains(joinErr, "hardware key") {
		t.Fatalf("join_error %q %v", joinErr, err)
	}
	// An inspection's token joins nothing.
	if _, err := joinAs(inspectToken, installed); err == nil || !strings.Contains(err.Error(), string(core.CodeUnauthn)) {
		t.Fatalf("a join with an inspection's token: %v", err)
	}

	// The installed system joins its node, with no approval and no new node.
	id, err := joinAs(token, installed)
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	if id.NodeID != n.Node.ID || !m.identityValid(n.Node.ID, certOf(t, id)) {
		t.Fatalf("joined as %s, want %s", id.NodeID, n.Node.ID)
	}
	var b metaldomain.Boot
	if err := m.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		b, err = metaldomain.GetBoot(ctx, tx, deploy.ID)
		return err
	}); err != nil || b.JoinedAt == nil || b.JoinError != "" {
		t.Fatalf("boot after the join: %+v %v", b, err)
	}
	if got := m.count(`SELECT count(*) FROM nodes`); got != nodesBefore {
		t.Fatalf("nodes: %d, want %d", got, nodesBefore)
	}
	// A retried join (its answer lost) joins again while the boot is open,
	// revoking the identity it replaces; once the boot ends, the token is dead.
	again, err := joinAs(token, installed)
	if err != nil || m.identityValid(n.Node.ID, certOf(t, id)) || !m.identityValid(n.Node.ID, certOf(t, again)) {
		t.Fatalf("a second join: %v", err)
	}
	if err := m.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return metaldomain.FinishBoot(ctx, tx, deploy.ID) }); err != nil {
		t.Fatal(err)
	}
	if _, err := joinAs(token, installed); err == nil || !strings.Contains(err.Error(), string(core.CodeUnauthn)) {
		t.Fatalf("a join after the boot ended: %v", err)
	}
}

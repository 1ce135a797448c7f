package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/metal"
	"github.com/better-compute/better-compute/api/workflows"
	"github.com/better-compute/better-compute/store"
	metaldomain "github.com/better-compute/better-compute/store/metal"
)

// deployBoot deploys node with profile and opens its deploy boot, as the
// lifecycle's boot-ramdisk step does; it answers the boot, its token and
// the workflow id.
func (m *metalEnv) deployBoot(node, profile string) (metaldomain.Boot, string, string) {
	m.t.Helper()
	ctx := context.Background()
	d, err := metal.Deploy.Call(ctx, m.client(m.boot.UserToken), metal.DeployInput{TenantID: "acme", NodeID: node, ProfileID: profile})
	if err != nil {
		m.t.Fatal(err)
	}
	var b metaldomain.Boot
	var tok protocol.SiteBootTokenResult
	if err := m.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		if b, err = metaldomain.CreateBoot(ctx, tx, node, d.Lifecycle.OpSeq, metaldomain.PurposeDeploy); err != nil {
			return err
		}
		tok, err = metaldomain.MintBootToken(ctx, tx, m.site.ID, b.ID)
		return err
	}); err != nil {
		m.t.Fatal(err)
	}
	return b, tok.Token, d.WorkflowID
}

func (m *metalEnv) seed(token string) (int, string) {
	m.t.Helper()
	status, body, h := postAgentH(m.t, m.url, protocol.RamdiskSeedPath, `{"token":"`+token+`"}`)
	if h.Get("Cache-Control") != "no-store" {
		m.t.Fatalf("the seed may be cached: %q", h.Get("Cache-Control"))
	}
	return status, body
}

// TestRamdiskSeed: a deploy boot's ramdisk gets its workflow's NoCloud
// seed, inline user data or a secret's resolved just now; a secret that is
// gone is NOT_FOUND secretNotFound and nothing more; a closed boot is
// refused; a deploy boot's answers carry pollMs.
func TestRamdiskSeed(t *testing.T) {
	m := newMetalEnv(t)
	ctx := context.Background()
	c := m.client(m.boot.UserToken)

	// Inline user data; the host name is the node's, meta data the profile's.
	inline := m.profileWith("acme", "inline", `"userData": "#cloud-config\nruncmd: [true]\n",
		"hostConfig": {"metaData": {"rack": "r{{ .node.name | len }}", "instance-id": "mine"}}`)
	n1 := m.ready("seed-1", "https://10.0.2.1")
	b1, tok1, wf1 := m.deployBoot(n1, inline)
	status, body := m.seed(tok1)
	var s protocol.RamdiskSeed
	if err := json.Unmarshal([]byte(body), &s); status != 200 || err != nil {
		t.Fatalf("seed: %d %s", status, body)
	}
	if s.NodeID != n1 || s.WorkflowID != wf1 || s.UserData != "#cloud-config\nruncmd: [true]\n" ||
		s.MetaData != "instance-id: "+wf1+"\nlocal-hostname: seed-1\nrack: r6\n" {
		t.Fatalf("seed = %+v", s)
	}
	// A deploy boot's report is answered with pollMs.
	status, body, _ = postAgentH(t, m.url, protocol.RamdiskReportPath,
		`{"token":"`+tok1+`","inventory":`+jsonOf(t, machine(t, "00000000b001"))+`}`)
	if status != 200 || !strings.Contains(body, `"pollMs":1000`) {
		t.Fatalf("report of a deploy boot: %d %s", status, body)
	}
	// Once the boot is closed its token is refused.
	if err := m.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return metaldomain.FinishBoot(ctx, tx, b1.ID) }); err != nil {
		t.Fatal(err)
	}
	if status, _ := m.seed(tok1); status != 410 {
		t.Fatalf("seed of a closed boot: %d", status)
	}
	if status, _ := m.seed(protocol.BootTokenPrefix + "nope"); status != 401 {
		t.Fatalf("seed with an unknown token: %d", status)
	}

	// User data held as a secret: resolved for the seed, its use recorded
	// with the reference only.
	const value = "#cloud-config\npassword: Kq2-very-secret-user-data\n"
	m.putSecret("acme", "cloud-init", value)
	secret := m.profileWith("acme", "secret", `"userData": "secret://acme/cloud-init"`)
	n2 := m.ready("seed-2", "https://10.0.2.2")
	_, tok2, wf2 := m.deployBoot(n2, secret)
	status, body = m.seed(tok2)
	if err := json.Unmarshal([]byte(body), &s); status != 200 || err != nil || s.UserData != value || s.WorkflowID != wf2 {
		t.Fatalf("seed with a secret: %d %s", status, body)
	}
	if n := m.count(`SELECT count(*) FROM node_events WHERE node_id = $1 AND type = $2 AND details->>'secret' = 'secret://acme/cloud-init'`,
		n2, agentgateway.EventUserDataResolved); n != 1 {
		t.Fatalf("%d user-data resolutions recorded", n)
	}
	if n := m.count(`SELECT count(*) FROM node_events WHERE details::text LIKE '%Kq2-very-secret%'`); n != 0 {
		t.Fatal("the user data is in the node's history")
	}
	if g, err := workflows.Get.Call(ctx, c, workflows.GetInput{TenantID: "acme", NodeID: n2}); err != nil ||
		strings.Contains(jsonOf(t, g), "Kq2-very-secret") {
		t.Fatalf("workflows.get: %v", err)
	}
	// The secret is deleted: NOT_FOUND secretNotFound, naming nothing.
	if err := m.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := m.vault.Delete(ctx, tx, "acme", "tenant", "cloud-init")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	status, body = m.seed(tok2)
	if status != 404 || !strings.Contains(body, `"secretNotFound"`) || strings.Contains(body, "cloud-init") {
		t.Fatalf("seed with a deleted secret: %d %s", status, body)
	}

	// No live workflow (aborted): no seed.
	if _, err := workflows.Abort.Call(ctx, c, workflows.WorkflowInput{TenantID: "acme", NodeID: n2, WorkflowID: wf2}); err != nil {
		t.Fatal(err)
	}
	if status, _ := m.seed(tok2); status != 404 && status != 410 {
		t.Fatalf("seed without a live workflow: %d", status)
	}
}

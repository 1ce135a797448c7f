package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/session"
	"github.com/better-compute/better-compute/agent/sshtrust"
	"github.com/better-compute/better-compute/agent/sshtrust/sshdtest"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testutil"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
)

// sshNodes are two nodes of acme's custom site.
func (e *env) sshNodes() (a, b nodes.Node) {
	e.t.Helper()
	s := e.site(e.boot.UserToken, "acme", "ssh-site", "custom")
	p := e.pool(e.boot.UserToken, "acme", s.ID, "ssh-pool")
	return e.node(schedulableNode(p.ID, "ssh-a"), nil), e.node(schedulableNode(p.ID, "ssh-b"), nil)
}

func (e *env) generation(nodeID string) int64 {
	e.t.Helper()
	var g int64
	if err := e.store.Pool.QueryRow(context.Background(), `SELECT generation FROM nodes WHERE id = $1`, nodeID).Scan(&g); err != nil {
		e.t.Fatal(err)
	}
	return g
}

func TestSSHCertsIssueListRevoke(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	a, _ := e.sshNodes()
	_, pub := sshdtest.UserKey(t, t.TempDir(), "alice")
	g0 := e.generation(a.ID)

	cert, err := nodes.IssueSSHCert.Call(ctx, c, nodes.IssueSSHCertInput{TenantID: "acme", NodeID: a.ID, PublicKey: pub})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cert.ID, "sshc_") || !strings.HasPrefix(cert.Certificate, ssh.CertAlgoED25519v01+" ") || cert.Serial != 1 ||
		!slices.Equal(cert.Principals, []string{"root@" + a.ID}) || !slices.Equal(cert.Users, []string{"root"}) ||
		cert.ValidBefore-cert.ValidAfter != 3600_000+60_000 || cert.State != "active" || !strings.HasPrefix(cert.CAPublicKey, "ssh-ed25519 ") ||
		!strings.Contains(cert.KeyID, a.ID) || !strings.HasPrefix(cert.KeyID, "idn_") || cert.NodeID != a.ID || cert.TenantID != "acme" {
		t.Fatalf("issue = %+v", cert)
	}
	if got := e.decidedOn("nodes.issueSshCert", "acme"); got != "compute-node/"+a.ID {
		t.Fatalf("issueSshCert was decided on %s", got)
	}
	if g := e.generation(a.ID); g != g0+1 {
		t.Fatalf("generation %d after issue, was %d", g, g0)
	}
	ttl := 600
	second, err := nodes.IssueSSHCert.Call(ctx, c, nodes.IssueSSHCertInput{TenantID: "acme", NodeID: a.ID, PublicKey: pub,
		Principals: []string{"deploy", "root"}, TTLSeconds: ttl, Comment: "INC-7"})
	if err != nil || second.Serial != 2 || second.ValidBefore-second.ValidAfter != 660_000 || second.Comment != "INC-7" ||
		!slices.Equal(second.Principals, []string{"deploy@" + a.ID, "root@" + a.ID}) || second.CAPublicKey != cert.CAPublicKey {
		t.Fatalf("second issue = %+v, %v", second, err)
	}

	// The list, paged, and by state.
	list, err := nodes.ListSSHCerts.Call(ctx, c, nodes.ListSSHCertsInput{TenantID: "acme", NodeID: a.ID, ListInput: rpc.ListInput{Limit: 1}})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != cert.ID || list.NextCursor == "" {
		t.Fatalf("list page 1 = %+v, %v", list, err)
	}
	list, err = nodes.ListSSHCerts.Call(ctx, c, nodes.ListSSHCertsInput{TenantID: "acme", NodeID: a.ID, ListInput: rpc.ListInput{Limit: 1, Cursor: list.NextCursor}})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != second.ID || list.NextCursor != "" {
		t.Fatalf("list page 2 = %+v, %v", list, err)
	}

	// Revoke: the generation moves once; again answers the same.
	g1 := e.generation(a.ID)
	rev, err := nodes.RevokeSSHCert.Call(ctx, c, nodes.SSHCertInput{TenantID: "acme", NodeID: a.ID, CertificateID: cert.ID})
	if err != nil || rev.State != "revoked" || rev.RevokedAt == nil || rev.RevokedBy == "" {
		t.Fatalf("revoke = %+v, %v", rev, err)
	}
	again, err := nodes.RevokeSSHCert.Call(ctx, c, nodes.SSHCertInput{TenantID: "acme", NodeID: a.ID, CertificateID: cert.ID})
	if err != nil || *again.RevokedAt != *rev.RevokedAt {
		t.Fatalf("second revoke = %+v, %v", again, err)
	}
	if g := e.generation(a.ID); g != g1+1 {
		t.Fatalf("generation %d after two revokes, was %d", g, g1)
	}
	for state, want := range map[string][]string{"revoked": {cert.ID}, "active": {second.ID}, "expired": nil} {
		l, err := nodes.ListSSHCerts.Call(ctx, c, nodes.ListSSHCertsInput{TenantID: "acme", NodeID: a.ID, State: state})
		var ids []string
		for _, it := range l.Items {
			ids = append(ids, it.ID)
		}
		if err != nil || !slices.Equal(ids, want) {
			t.Fatalf("list %s = %v, %v", state, ids, err)
		}
	}
	// The NodeSpec the agent gets.
	_, spec, err := nodesdomain.Spec(ctx, e.store.Pool, a.ID)
	if err != nil || spec.SSH == nil || !slices.Equal(spec.SSH.TrustedUserCAKeys, []string{cert.CAPublicKey}) ||
		!slices.Equal(spec.SSH.RevokedKeys, []string{cert.Certificate}) || len(spec.SSH.AuthorizedPrincipals) != 2 {
		t.Fatalf("spec = %+v, %v", spec.SSH, err)
	}
}

// Bad input is INVALID_INPUT naming the field, and issues nothing.
func TestSSHCertsBadInput(t *testing.T) {
	e := newEnv(t)
	a, _ := e.sshNodes()
	_, pub := sshdtest.UserKey(t, t.TempDir(), "alice")
	key, _, _, _, _ := ssh.ParseAuthorizedKey([]byte(pub))
	bare := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
	issued, err := nodes.IssueSSHCert.Call(context.Background(), e.client(e.boot.UserToken), nodes.IssueSSHCertInput{TenantID: "acme", NodeID: a.ID, PublicKey: pub})
	if err != nil {
		t.Fatal(err)
	}
	g := e.generation(a.ID)
	for _, tc := range []struct {
		name, field string
		in          map[string]any
	}{
		{"no key", "publicKey", map[string]any{}},
		{"garbage", "publicKey", map[string]any{"publicKey": "hello"}},
		{"two lines", "publicKey", map[string]any{"publicKey": bare + "\n" + bare}},
		{"options", "publicKey", map[string]any{"publicKey": `no-pty ` + bare}},
		{"a certificate", "publicKey", map[string]any{"publicKey": issued.Certificate}},
		{"the CA's key", "publicKey", map[string]any{"publicKey": issued.CAPublicKey}},
		{"a capital user", "principals", map[string]any{"publicKey": pub, "principals": []string{"Root"}}},
		{"a user with @", "principals", map[string]any{"publicKey": pub, "principals": []string{"root@node_x"}}},
		{"a user twice", "principals", map[string]any{"publicKey": pub, "principals": []string{"root", "root"}}},
		{"too long", "ttlSeconds", map[string]any{"publicKey": pub, "ttlSeconds": 86401}},
		{"too short", "ttlSeconds", map[string]any{"publicKey": pub, "ttlSeconds": 59}},
		{"a comment on two lines", "comment", map[string]any{"publicKey": pub, "comment": "a\nb"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in["tenantId"], tc.in["nodeId"] = "acme", a.ID
			body, _ := json.Marshal(tc.in)
			status, out := e.call(e.boot.UserToken, "nodes.issueSshCert", string(body))
			var got struct {
				Error struct {
					Code    string         `json:"code"`
					Details map[string]any `json:"details"`
				} `json:"error"`
			}
			_ = json.Unmarshal([]byte(out), &got)
			if status != 400 || got.Error.Code != "INVALID_INPUT" || !strings.HasPrefix(fmt.Sprint(got.Error.Details["field"]), tc.field) {
				t.Fatalf("= %d %s", status, out)
			}
		})
	}
	var n int
	if err := e.store.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ssh_certificates`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d certificates after bad input, %v", n, err)
	}
	if e.generation(a.ID) != g {
		t.Fatal("bad input moved the node's generation")
	}
}

// Another tenant's node reads as a missing one, for every method; a caller
// without the action is denied.
func TestSSHCertsAcrossTenants(t *testing.T) {
	e := newEnv(t)
	a, b := e.sshNodes()
	_, pub := sshdtest.UserKey(t, t.TempDir(), "alice")
	cert, err := nodes.IssueSSHCert.Call(context.Background(), e.client(e.boot.UserToken), nodes.IssueSSHCertInput{TenantID: "acme", NodeID: a.ID, PublicKey: pub})
	if err != nil {
		t.Fatal(err)
	}
	missing := core.NewID("node")
	for _, tc := range []struct{ method, body string }{
		{"nodes.issueSshCert", `{"tenantId":"globex","nodeId":%q,"publicKey":` + fmt.Sprintf("%q", pub) + `}`},
		{"nodes.listSshCerts", `{"tenantId":"globex","nodeId":%q}`},
		{"nodes.revokeSshCert", `{"tenantId":"globex","nodeId":%q,"certificateId":"` + cert.ID + `"}`},
	} {
		var answers []string
		for _, node := range []string{a.ID, missing} {
			status, out := e.call(e.globex, tc.method, fmt.Sprintf(tc.body, node))
			if status != 404 || !strings.Contains(out, "NOT_FOUND") {
				t.Fatalf("%s on %s by globex = %d %s", tc.method, node, status, out)
			}
			answers = append(answers, strings.ReplaceAll(out, node, "NODE"))
		}
		if answers[0] != answers[1] {
			t.Fatalf("%s: acme's node and a missing one answer differently:\n%s\n%s", tc.method, answers[0], answers[1])
		}
	}
	// The certificate of node a is not node b's.
	if status, out := e.call(e.boot.UserToken, "nodes.revokeSshCert",
		fmt.Sprintf(`{"tenantId":"acme","nodeId":%q,"certificateId":%q}`, b.ID, cert.ID)); status != 404 {
		t.Fatalf("revoke through another node = %d %s", status, out)
	}
	if status, out := e.call(e.stranger, "nodes.issueSshCert",
		fmt.Sprintf(`{"tenantId":"acme","nodeId":%q,"publicKey":%q}`, a.ID, pub)); status != 403 {
		t.Fatalf("issue by a caller without policy = %d %s", status, out)
	}
}

// Issue and revoke reach a real sshd through the agent's real session:
// the NodeSpec's sshd trust goes to session.Run's OnSpec hook, sshtrust's
// keeper writes the files, and sshd (never restarted) lets node a's
// certificate in, not node b's, and no longer the revoked one.
func TestSSHCertsReachARealSSHD(t *testing.T) {
	ae := newAgentEnv(t, time.Minute, "")
	ctx := context.Background()
	c := ae.client(ae.boot.UserToken)
	a := ae.node
	b := ae.env.node(schedulableNode(ae.pool.ID, "ssh-b"), nil)
	dir := t.TempDir()
	w := &sshtrust.Writer{Dir: filepath.Join(dir, "node-a")}
	if err := w.Ensure(); err != nil {
		t.Fatal(err)
	}
	sshd := sshdtest.Start(t, w.SnippetPath())
	keeper := sshtrust.NewKeeper(w, nil)
	kctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { keeper.Run(kctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	stateDir := t.TempDir()
	spec, err := nodespec.Open(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	ae.run(session.Options{StateDir: stateDir, NodeSpec: spec, OnSpec: keeper.OnSpec})

	// converged waits until the keeper wrote node a's current generation.
	converged := func() {
		t.Helper()
		g := ae.env.generation(a.ID)
		testutil.Eventually(t, 30*time.Second, "the node's sshd trust is written", func() bool { return keeper.Applied() >= g })
	}
	issue := func(nodeID, name string) (key, certFile, id string) {
		t.Helper()
		key, pub := sshdtest.UserKey(t, dir, name)
		cert, err := nodes.IssueSSHCert.Call(ctx, c, nodes.IssueSSHCertInput{TenantID: "acme", NodeID: nodeID, PublicKey: pub})
		if err != nil {
			t.Fatal(err)
		}
		return key, sshdtest.WriteCert(t, key, cert.Certificate), cert.ID
	}
	keyA, certA, idA := issue(a.ID, "alice")
	keyA2, certA2, _ := issue(a.ID, "carol")
	keyB, certB, _ := issue(b.ID, "bob")
	converged()
	for _, l := range []struct {
		name, key, cert string
		ok              bool
	}{
		{"node a's certificate", keyA, certA, true},
		{"node a's other certificate", keyA2, certA2, true},
		{"node b's certificate", keyB, certB, false},
	} {
		if out, err := sshd.Login("root", l.key, l.cert); (err == nil) != l.ok {
			t.Fatalf("%s: logged in = %v (%v: %s)", l.name, err == nil, err, out)
		}
	}
	if _, err := nodes.RevokeSSHCert.Call(ctx, c, nodes.SSHCertInput{TenantID: "acme", NodeID: a.ID, CertificateID: idA}); err != nil {
		t.Fatal(err)
	}
	converged()
	if out, err := sshd.Login("root", keyA, certA); err == nil {
		t.Fatalf("the revoked certificate logged in: %s", out)
	}
	if out, err := sshd.Login("root", keyA2, certA2); err != nil {
		t.Fatalf("node a's other certificate after the revocation: %v: %s", err, out)
	}
	if !strings.Contains(sshd.Log(), "revoked by file") {
		t.Fatalf("sshd did not refuse by its revocation list:\n%s", sshd.Log())
	}
	// The agent reported the generation it converged on.
	testutil.EventuallyNil(t, 30*time.Second, func() error {
		got, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: a.ID})
		if err != nil || got.ObservedGeneration != got.Generation {
			return fmt.Errorf("node a observed %d of %d, %v", got.ObservedGeneration, got.Generation, err)
		}
		return nil
	})
}

package api_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/internal/testutil"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
)

const testAgentEndpoint = "https://agent.test:7443"

// withNodeCA serves the env's API again with a node CA, and answers it.
func (e *env) withNodeCA() *nodeca.CA {
	e.t.Helper()
	ca, err := nodeca.LoadOrGenerate(e.t.TempDir())
	if err != nil {
		e.t.Fatal(err)
	}
	e.withGateway(agentgateway.Deps{NodeCA: ca, AgentEndpoint: testAgentEndpoint})
	return ca
}

// withGateway serves the env's API again, with an agent gateway built from
// d (on the env's database and catalog) mounted beside it, and answers the
// gateway.
func (e *env) withGateway(d agentgateway.Deps) *agentgateway.Gateway {
	e.t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	d.Store, d.Catalog, d.Logger = e.store, e.catalog, quiet
	gw, err := agentgateway.New(d)
	if err != nil {
		e.t.Fatal(err)
	}
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, NodeCA: d.NodeCA, Routes: gw,
		Logger: quiet})
	if err != nil {
		e.t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	e.t.Cleanup(hs.Close)
	e.server, e.url = srv, hs.URL
	return gw
}

// machine is the h100 fixture's inventory, its identifiers made unique by seed.
func machine(t *testing.T, seed string) *inventory.NodeInventory {
	t.Helper()
	inv, err := inventory.Parse(fixture(t, "h100-8x-sxm.json"))
	if err != nil {
		t.Fatal(err)
	}
	if seed != "" {
		inv.System.ProductUUID = "7b0e6a4c-3d2f-11ee-9c1a-" + seed
		inv.System.SerialNumber = "S-" + seed
	}
	return inv
}

func (e *env) joinToken(poolID string, maxUses int64) string {
	e.t.Helper()
	jt, err := nodes.CreateJoinToken.Call(context.Background(), e.client(e.boot.UserToken), nodes.CreateJoinTokenInput{TenantID: "acme", PoolID: poolID, MaxUses: new(maxUses)})
	if err != nil {
		e.t.Fatal(err)
	}
	return jt.Token
}

func certOf(t *testing.T, id join.Identity) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(id.Certificate.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *env) identityValid(nodeID string, c *x509.Certificate) bool {
	e.t.Helper()
	ok, err := nodesdomain.NodeIdentityValid(context.Background(), e.store.Pool, nodeID, nodeca.Serial(c.SerialNumber))
	if err != nil {
		e.t.Fatal(err)
	}
	return ok
}

func TestAgentJoin(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ca := e.withNodeCA()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.pool(e.boot.UserToken, "acme", s.ID, "train")
	tok := e.joinToken(p.ID, 1)

	// A join without approval: the node is made and the identity kept.
	dir := t.TempDir()
	o := join.Options{APIURL: e.url, Token: tok, StateDir: dir, Name: "GPU-H100-a07", Inventory: machine(t, "")}
	id, err := join.Join(ctx, o)
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	if !core.ValidID("node", id.NodeID) || id.AgentEndpoint != testAgentEndpoint {
		t.Fatalf("identity %+v", id)
	}
	cert := certOf(t, id)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if named, err := nodeca.NodeID(cert); err != nil || named != id.NodeID {
		t.Fatalf("certificate names %q, %v", named, err)
	}
	if d := time.Until(cert.NotAfter); d < nodesdomain.CertificateTTL-time.Hour || d > nodesdomain.CertificateTTL {
		t.Fatalf("certificate valid for %v", d)
	}
	if !e.identityValid(id.NodeID, cert) {
		t.Fatal("the issued identity is not valid")
	}
	for _, f := range []string{join.KeyFile, join.CertFile, join.CAFile, join.IdentityFile} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, %v", f, fi, err)
		}
	}
	if again, err := join.LoadIdentity(dir); err != nil || again.NodeID != id.NodeID || again.CAPool == nil {
		t.Fatalf("load = %+v, %v", again, err)
	}
	n, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: id.NodeID})
	if err != nil || n.Name != "gpu-h100-a07" || n.ProvisionState != "adopted" || n.Role != "host" || n.Trust != "tenant-owned" ||
		n.OwnerTenantID != "acme" || n.Connectivity != "disconnected" || n.ObservedGeneration != 0 || n.PoolID != p.ID ||
		n.HardwareKey == "" || !n.HardwareKeyTrusted || n.GPUCount != 8 || n.Devices == 0 {
		t.Fatalf("node = %+v, %v", n, err)
	}
	if snap, err := nodes.GetInventory.Call(ctx, c, nodes.InventoryInput{TenantID: "acme", NodeID: id.NodeID}); err != nil || snap.Seq != 1 {
		t.Fatalf("inventory = %+v, %v", snap, err)
	}

	// Joining again with the identity kept sends nothing; the token is spent.
	if again, err := join.Join(ctx, o); err != nil || again.NodeID != id.NodeID {
		t.Fatalf("second join = %+v, %v", again, err)
	}
	o2 := o
	o2.StateDir, o2.Inventory = t.TempDir(), machine(t, "aaaaaaaaaaa1")
	if _, err := join.Join(ctx, o2); codeOf(err) != core.CodeInvalidState || core.AsError(err).Details["reason"] != "exhausted" {
		t.Fatalf("a spent token joins: %v", err)
	}
	if _, err := join.Join(ctx, join.Options{APIURL: e.url, Token: "bcjt_nope", StateDir: t.TempDir(), Inventory: machine(t, "")}); codeOf(err) != core.CodeUnauthn {
		t.Fatalf("unknown token: %v", err)
	}

	// Re-join of the same machine (a reinstall): the same node, a new
	// identity, the old one revoked.
	tok2 := e.joinToken(p.ID, 5)
	o3 := join.Options{APIURL: e.url, Token: tok2, StateDir: dir, Name: "other-name", Inventory: machine(t, ""), Force: true}
	id2, err := join.Join(ctx, o3)
	if err != nil || id2.NodeID != id.NodeID {
		t.Fatalf("re-join = %+v, %v", id2, err)
	}
	cert2 := certOf(t, id2)
	if e.identityValid(id.NodeID, cert) || !e.identityValid(id.NodeID, cert2) {
		t.Fatal("re-join: the old identity must be revoked and the new one valid")
	}

	// Another machine with the same name gets a new node, its name suffixed.
	o4 := join.Options{APIURL: e.url, Token: tok2, StateDir: t.TempDir(), Name: "gpu-h100-a07", Inventory: machine(t, "bbbbbbbbbbb2")}
	id4, err := join.Join(ctx, o4)
	if err != nil || id4.NodeID == id.NodeID {
		t.Fatalf("other machine = %+v, %v", id4, err)
	}
	if n4, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: id4.NodeID}); err != nil || len(n4.Name) != len("gpu-h100-a07")+6 || n4.Name[:13] != "gpu-h100-a07-" {
		t.Fatalf("clashing name = %q, %v", n4.Name, err)
	}

	// A bad CSR or name is INVALID_INPUT and spends nothing.
	before := e.joinTokenStates("acme", p.ID)
	uses := func() int {
		list, err := nodes.ListJoinTokens.Call(ctx, c, nodes.ListJoinTokensInput{TenantID: "acme", PoolID: p.ID})
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, t := range list.Items {
			total += t.Uses
		}
		return total
	}
	usedBefore := uses()
	invJSON, _ := json.Marshal(machine(t, "ccccccccccc3"))
	for name, body := range map[string]map[string]any{
		"csr":  {"token": tok2, "name": "x", "inventory": json.RawMessage(invJSON), "csr": "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"},
		"name": {"token": tok2, "name": "bad_name", "inventory": json.RawMessage(invJSON), "csr": "x"},
		"inv":  {"token": tok2, "name": "x", "inventory": json.RawMessage(`{"kind":"nope"}`), "csr": "x"},
	} {
		status, out := postJSON(t, e.url+protocol.JoinPath, body)
		if status != 400 || !bytes.Contains(out, []byte(`"INVALID_INPUT"`)) {
			t.Fatalf("%s: %d %s", name, status, out)
		}
	}
	if uses() != usedBefore || len(e.joinTokenStates("acme", p.ID)) != len(before) {
		t.Fatal("a refused join spent a token use")
	}
	if got := e.count(`SELECT count(*) FROM nodes WHERE pool_id = $1`, p.ID); got != 2 {
		t.Fatalf("%d nodes, want 2", got)
	}

	// nodes.revokeIdentity: the identity is no longer valid and the
	// channel hears the node's id.
	heard := make(chan string, 4)
	listening := make(chan struct{})
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = e.store.Listen(lctx, nodesdomain.NodeIdentityRevokedChannel, func() { close(listening) }, func(p string) { heard <- p })
	}()
	<-listening
	if _, err := nodes.RevokeIdentity.Call(ctx, e.client(e.globex), nodes.NodeInput{TenantID: "acme", NodeID: id4.NodeID}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("another tenant revokes: %v", err)
	}
	if _, err := nodes.RevokeIdentity.Call(ctx, e.client(e.globex), nodes.NodeInput{TenantID: "globex", NodeID: id4.NodeID}); codeOf(err) != core.CodeNotFound && codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("another tenant revokes in its own tenant: %v", err)
	}
	rn, err := nodes.RevokeIdentity.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: id4.NodeID})
	if err != nil || rn.ID != id4.NodeID {
		t.Fatalf("revokeIdentity = %+v, %v", rn, err)
	}
	select {
	case got := <-heard:
		if got != id4.NodeID {
			t.Fatalf("heard %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification of the revocation")
	}
	if e.identityValid(id4.NodeID, certOf(t, id4)) {
		t.Fatal("a revoked identity is valid")
	}
}

func postJSON(t *testing.T, url string, body any) (int, []byte) {
	t.Helper()
	raw, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func TestAgentJoinApproval(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.withNodeCA()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "gated", "H100", "", `{"acceptance":["approval"]}`)
	tok := e.joinToken(p.ID, 3)

	// The join waits; Join keeps polling until the request is approved.
	dir := t.TempDir()
	type result struct {
		id  join.Identity
		err error
	}
	done := make(chan result, 1)
	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	go func() {
		id, err := join.Join(jctx, join.Options{APIURL: e.url, Token: tok, StateDir: dir, Name: "gated-1",
			Inventory: machine(t, ""), PollInterval: 20 * time.Millisecond})
		done <- result{id, err}
	}()
	var req nodes.JoinRequest
	testutil.Eventually(t, 30*time.Second, "a pending join request", func() bool {
		list, err := nodes.ListJoinRequests.Call(ctx, c, nodes.ListJoinRequestsInput{TenantID: "acme", PoolID: p.ID, State: "pending"})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 1 {
			return false
		}
		req = list.Items[0]
		// The agent keeps the pending secret once it has the server's answer,
		// which may come a moment after the request is listed.
		_, err = os.Stat(filepath.Join(dir, "join-request.json"))
		return err == nil
	})
	if !core.ValidID("jreq", req.ID) || req.Name != "gated-1" || req.HardwareKey == "" || req.NodeID != "" {
		t.Fatalf("request = %+v", req)
	}
	if got := e.count(`SELECT count(*) FROM nodes WHERE pool_id = $1`, p.ID); got != 0 {
		t.Fatal("a node exists before approval")
	}
	// The pending secret is kept, 0600, for a restarted agent.
	if fi, err := os.Stat(filepath.Join(dir, "join-request.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("pending join: %v %v", fi, err)
	}
	// Other tenants neither list nor decide it.
	g := e.client(e.globex)
	if _, err := nodes.ListJoinRequests.Call(ctx, g, nodes.ListJoinRequestsInput{TenantID: "acme", PoolID: p.ID}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex lists: %v", err)
	}
	if _, err := nodes.ApproveJoinRequest.Call(ctx, g, nodes.JoinRequestInput{TenantID: "globex", PoolID: p.ID, JoinRequestID: req.ID}); codeOf(err) != core.CodeNotFound && codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex approves: %v", err)
	}
	if _, err := nodes.ApproveJoinRequest.Call(ctx, e.client(e.stranger), nodes.JoinRequestInput{TenantID: "acme", PoolID: p.ID, JoinRequestID: req.ID}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("a stranger approves: %v", err)
	}

	approved, err := nodes.ApproveJoinRequest.Call(ctx, c, nodes.JoinRequestInput{TenantID: "acme", PoolID: p.ID, JoinRequestID: req.ID})
	if err != nil || approved.State != "approved" || !core.ValidID("node", approved.NodeID) || approved.DecidedAt == nil {
		t.Fatalf("approve = %+v, %v", approved, err)
	}
	r := <-done
	if r.err != nil || r.id.NodeID != approved.NodeID {
		t.Fatalf("join after approval = %+v, %v", r.id, r.err)
	}
	if _, err := os.Stat(filepath.Join(dir, "join-request.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the pending join outlived the approval: %v", err)
	}
	if n, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: approved.NodeID}); err != nil || n.ProvisionState != "adopted" || n.HardwareKey == "" {
		t.Fatalf("node = %+v, %v", n, err)
	}
	if _, err := nodes.ApproveJoinRequest.Call(ctx, c, nodes.JoinRequestInput{TenantID: "acme", PoolID: p.ID, JoinRequestID: req.ID}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("approve twice: %v", err)
	}

	// A rejected request: the poll is ACCESS_DENIED, reason rejected.
	status, out := postJSON(t, e.url+protocol.JoinPath, map[string]any{"token": tok, "name": "gated-2",
		"inventory": json.RawMessage(mustJSON(t, machine(t, "ddddddddddd4"))), "csr": testCSR(t)})
	var pending protocol.JoinPending
	if status != http.StatusAccepted || json.Unmarshal(out, &pending) != nil || pending.State != "pending" || pending.RequestSecret == "" {
		t.Fatalf("join = %d %s", status, out)
	}
	poll := map[string]string{"joinRequestId": pending.JoinRequestID, "requestSecret": pending.RequestSecret}
	if status, out := postJSON(t, e.url+protocol.JoinStatusPath, poll); status != http.StatusAccepted || bytes.Contains(out, []byte("requestSecret")) {
		t.Fatalf("poll pending = %d %s", status, out)
	}
	if status, _ := postJSON(t, e.url+protocol.JoinStatusPath, map[string]string{"joinRequestId": pending.JoinRequestID,
		"requestSecret": "bcjr_wrong"}); status != http.StatusUnauthorized {
		t.Fatalf("poll with a wrong secret = %d", status)
	}
	if rj, err := nodes.RejectJoinRequest.Call(ctx, c, nodes.JoinRequestInput{TenantID: "acme", PoolID: p.ID, JoinRequestID: pending.JoinRequestID}); err != nil || rj.State != "rejected" {
		t.Fatalf("reject = %+v, %v", rj, err)
	}
	status, out = postJSON(t, e.url+protocol.JoinStatusPath, poll)
	var eb struct {
		Error core.Error `json:"error"`
	}
	if status != http.StatusForbidden || json.Unmarshal(out, &eb) != nil || eb.Error.Code != core.CodeAccessDenied || eb.Error.Details["reason"] != "rejected" {
		t.Fatalf("poll rejected = %d %s", status, out)
	}
	if got := e.count(`SELECT count(*) FROM nodes WHERE pool_id = $1`, p.ID); got != 1 {
		t.Fatalf("%d nodes, want 1", got)
	}
}

func TestAgentJoinWithoutCA(t *testing.T) {
	e := newEnv(t)
	e.withGateway(agentgateway.Deps{})
	status, out := postJSON(t, e.url+protocol.JoinPath, map[string]any{"token": "bcjt_x"})
	if status != http.StatusServiceUnavailable || !bytes.Contains(out, []byte("no node CA configured")) {
		t.Fatalf("join without a CA = %d %s", status, out)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// testCSR is a valid certificate request of a fresh key.
func testCSR(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

package e2e

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/sshtrust"
	"github.com/better-compute/better-compute/agent/sshtrust/sshdtest"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/testutil"
)

// SSH certificate issue and revoke reach the node: a real `bcd node run`
// keeps the sshd trust its NodeSpec carries, and a real sshd reading those
// files lets the node's certificate in, then refuses it once revoked.
func TestSSHCertificatesReachTheNode(t *testing.T) {
	dir := stackDir(t)
	bin, err := bcdBinary()
	if err != nil {
		t.Fatal(err)
	}
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	s, err := devstack.Start(context.Background(), devstack.Options{Dir: dir, APIAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0",
		PostgresPort: pgPort, TemporalAddr: "127.0.0.1:0", UIAddr: "-", Agents: -1, AgentHeartbeat: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("devstack: %v", err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	adminToken, err := s.AdminToken()
	if err != nil {
		t.Fatal(err)
	}
	admin := api.NewClient(s.APIURL(), adminToken)
	const root = "root"
	pool, err := pools.Create.Call(ctx, admin, pools.CreateInput{TenantID: root, SiteID: s.Demo().SiteID, Name: "ssh",
		Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := nodes.CreateJoinToken.Call(ctx, admin, nodes.CreateJoinTokenInput{TenantID: root, PoolID: pool.ID, Name: "ssh"})
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{t: t, bin: bin, dir: filepath.Join(dir, "agent-ssh"), name: "e2e-ssh"}
	a.start("join", "--api", s.APIURL(), "--token", tok.Token, "--name", a.name, "--poll-interval", "100ms")
	if err := <-a.done; err != nil {
		t.Fatalf("bcd node join: %v\n%s", err, a.log)
	}
	// Simulated, so the trust is kept under the state directory.
	trust := filepath.Join(a.dir, "sshd")
	a.start("run")
	var nodeID string
	testutil.Eventually(t, agentWait, "the connected node", func() bool {
		l, err := nodes.List.Call(ctx, admin, nodes.ListInput{TenantID: root, PoolID: pool.ID})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) == 1 && l.Items[0].Connectivity == "connected" {
			nodeID = l.Items[0].ID
		}
		return nodeID != ""
	})
	observed := func(what string) {
		t.Helper()
		testutil.Eventually(t, agentWait, what, func() bool {
			n, err := nodes.Get.Call(ctx, admin, nodes.NodeInput{TenantID: root, NodeID: nodeID})
			if err != nil {
				t.Fatal(err)
			}
			return n.ObservedGeneration == n.Generation
		})
	}

	keyFile, pub := sshdtest.UserKey(t, t.TempDir(), "alice")
	cert, err := nodes.IssueSSHCert.Call(ctx, admin, nodes.IssueSSHCertInput{TenantID: root, NodeID: nodeID, PublicKey: pub})
	if err != nil {
		t.Fatal(err)
	}
	certFile := sshdtest.WriteCert(t, keyFile, cert.Certificate)
	observed("the node to observe the issue")
	testutil.Eventually(t, agentWait, "bcd to write root's principals", func() bool {
		b, _ := os.ReadFile(filepath.Join(trust, sshtrust.PrincipalsDir, "root"))
		return string(b) == "root@"+nodeID+"\n"
	})
	sshd := sshdtest.Start(t, filepath.Join(trust, sshtrust.SnippetFile))
	if out, err := sshd.Login("root", keyFile, certFile); err != nil {
		t.Fatalf("the node's certificate: %v: %s\n%s", err, out, sshd.Log())
	}

	if _, err := nodes.RevokeSSHCert.Call(ctx, admin, nodes.SSHCertInput{TenantID: root, NodeID: nodeID, CertificateID: cert.ID}); err != nil {
		t.Fatal(err)
	}
	observed("the node to observe the revocation")
	testutil.Eventually(t, agentWait, "bcd to write the revocation list", func() bool {
		b, _ := os.ReadFile(filepath.Join(trust, sshtrust.RevokedFile))
		return len(b) > 0
	})
	if out, err := sshd.Login("root", keyFile, certFile); err == nil {
		t.Fatalf("the revoked certificate logged in: %s", out)
	}
}

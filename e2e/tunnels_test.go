package e2e

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/testutil"
)

// A node tunnel end to end with real processes: the dev stack's API and
// agent listener, a real `bcd node run` (the dev stack's simulated agent),
// and `better-compute tunnel --node` splicing its stdin and stdout, as an
// ssh ProxyCommand does, to a TCP echo server on the node's 127.0.0.1.
func TestTunnelThroughARealAgent(t *testing.T) {
	dir := stackDir(t)
	bcd, err := bcdBinary()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := betterComputeBinary()
	if err != nil {
		t.Fatal(err)
	}
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	s, err := devstack.Start(context.Background(), devstack.Options{Dir: dir, APIAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0",
		PostgresPort: pgPort, TemporalAddr: "127.0.0.1:0", UIAddr: "-", Agents: 1, BCD: bcd,
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
	var nodeID string
	testutil.Eventually(t, agentWait, "a connected demo node", func() bool {
		l, err := nodes.List.Call(ctx, admin, nodes.ListInput{TenantID: root, PoolID: s.Demo().PoolID, Connectivity: "connected"})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) > 0 {
			nodeID = l.Items[0].ID
		}
		return nodeID != ""
	})

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()

	cmd := exec.CommandContext(ctx, cli, "tunnel", "--node", nodeID, "--port", strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	cmd.Env = []string{"BC_API_URL=" + s.APIURL(), "BC_TOKEN=" + adminToken, "BC_TENANT=" + root, "HOME=" + dir}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	msg := []byte("SSH-2.0-through-the-agent\r\n")
	if _, err := stdin.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(stdout, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo %q, %v; stderr: %s", got, err, stderr.String())
	}
	// Closing stdin ends the tunnel and the command.
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("better-compute tunnel: %v; stderr: %s", err, stderr.String())
	}
}

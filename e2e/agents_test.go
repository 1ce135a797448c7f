package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/testutil"
)

// bcdBinary builds cmd/bcd once per test binary.
var bcdBinary = sync.OnceValues(func() (string, error) { return buildBinary("bcd") })

// agent is one `bcd node` of the test, a real process.
type agent struct {
	t        *testing.T
	bin, dir string
	name     string
	cmd      *exec.Cmd
	log      *bytes.Buffer
	done     chan error
}

func (a *agent) args(sub string, more ...string) []string {
	return append([]string{"node", sub, "--state-dir", a.dir, "--simulate-gpus", "8xH100-SXM5-80GB", "--seed", a.name}, more...)
}

// start runs `bcd node <sub>` in the background.
func (a *agent) start(sub string, more ...string) {
	a.t.Helper()
	a.log = &bytes.Buffer{}
	a.cmd = exec.Command(a.bin, a.args(sub, more...)...)
	a.cmd.Stdout, a.cmd.Stderr = a.log, a.log
	if err := a.cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	a.done = make(chan error, 1)
	cmd, done := a.cmd, a.done
	go func() { done <- cmd.Wait() }()
	a.t.Cleanup(func() { _ = cmd.Process.Kill() })
}

func (a *agent) kill() {
	a.t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		a.t.Fatal(err)
	}
	<-a.done
}

// End to end with real bcd processes against the real API: a join that
// waits for approval, the session and the NodeSpec making the node
// schedulable, a command run once, kill -9 taking the node through
// disconnected, unreachable and lost on a test-sized schedule, a restart
// that re-runs nothing and never runs a command past its notAfter, and a
// revocation that is refused at once.
func TestBcdAgentsEndToEnd(t *testing.T) {
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
		PostgresPort: pgPort, TemporalAddr: "127.0.0.1:0", UIAddr: "-", Agents: -1,
		AgentLease: 2 * time.Second, AgentHeartbeat: time.Second, LivenessSweep: 200 * time.Millisecond,
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

	// A pool whose joins need approval, and lose nodes 2 s after their lease.
	pool, err := pools.Create.Call(ctx, admin, pools.CreateInput{TenantID: root, SiteID: s.Demo().SiteID, Name: "approved",
		Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80, Policy: &pools.Policy{Acceptance: []string{"approval"}, LostAfter: "2s"}})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := nodes.CreateJoinToken.Call(ctx, admin, nodes.CreateJoinTokenInput{TenantID: root, PoolID: pool.ID, Name: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{t: t, bin: bin, dir: filepath.Join(dir, "agent-1"), name: "e2e-agent-1"}
	a.start("join", "--api", s.APIURL(), "--token", tok.Token, "--name", a.name, "--poll-interval", "100ms")

	// The join waits for an operator.
	var req nodes.JoinRequest
	testutil.Eventually(t, agentWait, "a pending join request", func() bool {
		l, err := nodes.ListJoinRequests.Call(ctx, admin, nodes.ListJoinRequestsInput{TenantID: root, PoolID: pool.ID, State: "pending"})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) == 1 {
			req = l.Items[0]
		}
		return len(l.Items) == 1
	})
	if req.Name != a.name || req.HardwareKey == "" {
		t.Fatalf("join request %+v", req)
	}
	approved, err := nodes.ApproveJoinRequest.Call(ctx, admin, nodes.JoinRequestInput{TenantID: root, PoolID: pool.ID, JoinRequestID: req.ID})
	if err != nil || approved.NodeID == "" {
		t.Fatalf("approve = %+v, %v", approved, err)
	}
	if err := <-a.done; err != nil {
		t.Fatalf("bcd node join: %v\n%s", err, a.log)
	}
	nodeID := approved.NodeID
	node := func() nodes.NodeDetail {
		n, err := nodes.Get.Call(ctx, admin, nodes.NodeInput{TenantID: root, NodeID: nodeID})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The session: connected, the NodeSpec observed, schedulable.
	a.start("run")
	testutil.Eventually(t, agentWait, "a connected, schedulable node", func() bool {
		n := node()
		return n.Connectivity == "connected" && n.ObservedGeneration >= 1 && n.Schedulable
	})

	// A command runs once.
	marker := filepath.Join(dir, "runs")
	appendLine := func(word string) json.RawMessage {
		args, _ := json.Marshal(map[string]any{"argv": []string{"/bin/sh", "-c", "echo " + word + " >> " + marker}})
		return args
	}
	first, err := nodes.RunCommand.Call(ctx, admin, nodes.RunCommandInput{TenantID: root, NodeID: nodeID, Kind: "exec", Args: appendLine("first")})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, agentWait, "the first command's result", func() bool {
		c, err := nodes.GetCommand.Call(ctx, admin, nodes.CommandInput{TenantID: root, NodeID: nodeID, CommandID: first.ID})
		if err != nil {
			t.Fatal(err)
		}
		return c.State == "succeeded"
	})

	// kill -9: disconnected, then unreachable when the 2 s lease lapses, then
	// lost 2 s later.
	a.kill()
	var seen []string
	testutil.Eventually(t, agentWait, "a lost node", func() bool {
		c := node().Connectivity
		if len(seen) == 0 || seen[len(seen)-1] != c {
			seen = append(seen, c)
		}
		return c == "lost"
	})
	if strings.Join(seen, ",") != "disconnected,unreachable,lost" && strings.Join(seen, ",") != "connected,disconnected,unreachable,lost" {
		t.Fatalf("connectivity went %v", seen)
	}
	// A command queued while the agent is down that expires before it is
	// back is never run.
	notAfter := time.Now().Add(1500 * time.Millisecond)
	late, err := nodes.RunCommand.Call(ctx, admin, nodes.RunCommandInput{TenantID: root, NodeID: nodeID, Kind: "exec", Args: appendLine("late"),
		NotAfter: new(int64(notAfter.UnixMilli()))})
	if err != nil {
		t.Fatal(err)
	}
	// Past notAfter before the agent is back: the point of this step.
	testutil.Eventually(t, agentWait, "the late command's notAfter to pass", func() bool {
		return time.Now().After(notAfter.Add(100 * time.Millisecond))
	})

	// Restart: connected again, nothing re-run, the late command expired.
	a.start("run")
	testutil.Eventually(t, agentWait, "the node back", func() bool { return node().Connectivity == "connected" })
	after, err := nodes.RunCommand.Call(ctx, admin, nodes.RunCommandInput{TenantID: root, NodeID: nodeID, Kind: "exec", Args: appendLine("after")})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, agentWait, "the command after the restart", func() bool {
		c, err := nodes.GetCommand.Call(ctx, admin, nodes.CommandInput{TenantID: root, NodeID: nodeID, CommandID: after.ID})
		if err != nil {
			t.Fatal(err)
		}
		return c.State == "succeeded"
	})
	if c, err := nodes.GetCommand.Call(ctx, admin, nodes.CommandInput{TenantID: root, NodeID: nodeID, CommandID: late.ID}); err != nil || c.State != "expired" {
		t.Fatalf("the late command = %+v, %v; want expired", c, err)
	}
	runs, err := os.ReadFile(marker)
	if err != nil || string(runs) != "first\nafter\n" {
		t.Fatalf("commands ran %q (%v); want first, then after, once each", runs, err)
	}

	// Revocation: the session ends at once and the agent is refused.
	if _, err := nodes.RevokeIdentity.Call(ctx, admin, nodes.NodeInput{TenantID: root, NodeID: nodeID}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, agentWait, "the revoked node disconnected", func() bool { return node().Connectivity != "connected" })
	testutil.Eventually(t, agentWait, "the agent refused", func() bool { return strings.Contains(a.log.String(), "403") })
}

// agentWait bounds each wait for the agent or the server to get somewhere;
// the slowest, a node lost 2 s after its lease, takes seconds.
const agentWait = time.Minute

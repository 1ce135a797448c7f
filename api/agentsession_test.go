package api_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/commands"
	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/session"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/core/inventory"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
)

// agentEnv is an agent gateway with short liveness settings behind a real
// agent listener (mutual TLS, HTTP/2), and one node with an identity.
type agentEnv struct {
	*env
	gateway  *agentgateway.Gateway
	ca       *nodeca.CA
	url      string
	pool     pools.Pool
	node     nodes.Node
	identity join.Identity
}

// newAgentEnv's lease is the liveness lease (the heartbeat is 1 s); the
// pool's policy.lostAfter is lostAfter unless "". tune, when given, adjusts
// the gateway's Deps.
func newAgentEnv(t *testing.T, lease time.Duration, lostAfter string, tune ...func(*agentgateway.Deps)) *agentEnv {
	t.Helper()
	e := newEnv(t)
	deps := agentgateway.Deps{Store: e.store, Catalog: e.catalog,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AgentLease: lease, AgentHeartbeat: time.Second}
	for _, fn := range tune {
		fn(&deps)
	}
	gw, err := agentgateway.New(deps)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := nodeca.LoadOrGenerate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := agentgateway.TLSConfig(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewUnstartedServer(gw.SessionHandler())
	hs.TLS = cfg
	hs.EnableHTTP2 = true
	hs.StartTLS()
	t.Cleanup(hs.Close)

	ae := &agentEnv{env: e, gateway: gw, ca: ca, url: hs.URL}
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	policy := `{}`
	if lostAfter != "" {
		policy = `{"lostAfter":"` + lostAfter + `"}`
	}
	ae.pool = e.poolWith("acme", s.ID, "h100", "H100", "", policy)
	ae.node = e.node(nodesdomain.NewNode{PoolID: ae.pool.ID, Name: "gpu-1", ProvisionState: nodestate.Adopted, Role: nodestate.RoleHost,
		Power: nodestate.PowerOn, ObservedGeneration: 1}, nil)
	ae.identity = ae.issue(ae.node.ID, true)
	return ae
}

// issue signs a node certificate and, with record, records it, as a join
// does.
func (ae *agentEnv) issue(nodeID string, record bool) join.Identity {
	t := ae.t
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, serial, err := ae.ca.SignNode(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}), nodeID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	err = ae.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		if !record {
			return nil
		}
		_, err := nodesdomain.RecordNodeIdentity(context.Background(), tx, nodesdomain.NodeIdentity{NodeID: nodeID, Serial: serial,
			Certificate: string(certPEM), ExpiresAt: time.Now().Add(time.Hour)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return join.Identity{NodeID: nodeID, AgentEndpoint: ae.url, Certificate: cert, CAPool: ae.ca.Pool()}
}

type agentNodeState struct {
	connectivity string
	epoch        int64
	conditions   []nodes.NodeCondition
	agentVersion string
}

func (s agentNodeState) has(typ string) bool {
	for _, c := range s.conditions {
		if c.Type == typ {
			return true
		}
	}
	return false
}

func (ae *agentEnv) state() agentNodeState {
	ae.t.Helper()
	var s agentNodeState
	var conds []byte
	if err := ae.store.Pool.QueryRow(context.Background(), `SELECT connectivity, session_epoch, conditions, agent_version
		FROM nodes WHERE id = $1`, ae.node.ID).Scan(&s.connectivity, &s.epoch, &conds, &s.agentVersion); err != nil {
		ae.t.Fatal(err)
	}
	if err := json.Unmarshal(conds, &s.conditions); err != nil {
		ae.t.Fatal(err)
	}
	return s
}

// eventually waits up to 20 s for the node's state to satisfy cond.
func (ae *agentEnv) eventually(what string, cond func(agentNodeState) bool) agentNodeState {
	ae.t.Helper()
	var s agentNodeState
	testutil.EventuallyNil(ae.t, 20*time.Second, func() error {
		if s = ae.state(); !cond(s) {
			return fmt.Errorf("%s: not reached; node is %+v", what, s)
		}
		return nil
	})
	return s
}

// run starts the agent's session loop; the returned stop ends it and waits.
func (ae *agentEnv) run(o session.Options) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	o.Identity = ae.identity
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	o.MinBackoff, o.MaxBackoff = 50*time.Millisecond, 200*time.Millisecond
	done := make(chan error, 1)
	go func() { done <- session.Run(ctx, o) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				ae.t.Errorf("session.Run: %v", err)
			}
		})
	}
	ae.t.Cleanup(stop)
	return stop
}

func TestAgentSessionLiveness(t *testing.T) {
	ae := newAgentEnv(t, 2*time.Second, "1s")
	doc, err := inventory.Parse(fixture(t, "h100-8x-sxm.json"))
	if err != nil {
		t.Fatal(err)
	}
	stop := ae.run(session.Options{AgentVersion: "bcd/test",
		Inventory: func(context.Context) (*inventory.NodeInventory, error) { return doc, nil }})
	s := ae.eventually("connected", func(s agentNodeState) bool { return s.connectivity == "connected" && s.epoch == 1 })
	if s.agentVersion != "bcd/test" || s.has(nodesdomain.CondClockSkew) {
		t.Fatalf("after hello: %+v", s)
	}
	// The inventory the server lacked is sent and ingested.
	testutil.Eventually(t, 20*time.Second, "the inventory to be ingested", func() bool {
		return ae.count(`SELECT count(*) FROM node_inventories WHERE node_id = $1`, ae.node.ID) == 1
	})
	// Heartbeats renew the lease.
	leaseOf := func() time.Time {
		var at time.Time
		if err := ae.store.Pool.QueryRow(context.Background(), `SELECT expires_at FROM node_liveness WHERE node_id = $1`,
			ae.node.ID).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	first := leaseOf()
	testutil.Eventually(t, 20*time.Second, "a heartbeat to renew the lease", func() bool { return leaseOf().After(first) })
	// A sweep leaves a node with a live lease alone.
	if n, err := ae.gateway.SweepLiveness(context.Background()); err != nil || n != 0 {
		t.Fatalf("sweep of a live node: %d, %v", n, err)
	}

	stop()
	ae.eventually("disconnected", func(s agentNodeState) bool { return s.connectivity == "disconnected" })
	sweep := func(s agentNodeState) bool {
		if _, err := ae.gateway.SweepLiveness(context.Background()); err != nil {
			t.Fatal(err)
		}
		return true
	}
	s = ae.eventually("unreachable", func(s agentNodeState) bool {
		sweep(s)
		return s.connectivity == "unreachable" || s.connectivity == "lost"
	})
	s = ae.eventually("lost", func(s agentNodeState) bool { sweep(s); return s.connectivity == "lost" })
	if !s.has(nodesdomain.CondNodeUnreachable) {
		t.Fatalf("lost node without NodeUnreachable: %+v", s)
	}
	if n := ae.count(`SELECT count(*) FROM node_events WHERE node_id = $1 AND type = $2 AND details->>'to' IN ('unreachable', 'lost')`,
		ae.node.ID, nodesdomain.EventConnectivity); n != 2 {
		t.Fatalf("%d unreachable/lost events, want 2", n)
	}
	// Sweeping again changes nothing.
	if n, err := ae.gateway.SweepLiveness(context.Background()); err != nil || n != 0 {
		t.Fatalf("second sweep: %d, %v", n, err)
	}

	// The agent comes back: connected, a new epoch, NodeUnreachable cleared;
	// the inventory it already sent is not sent again.
	ae.run(session.Options{AgentVersion: "bcd/test",
		Inventory: func(context.Context) (*inventory.NodeInventory, error) { return doc, nil }})
	s = ae.eventually("reconnected", func(s agentNodeState) bool { return s.connectivity == "connected" && s.epoch == 2 })
	if s.has(nodesdomain.CondNodeUnreachable) {
		t.Fatalf("NodeUnreachable kept after reconnecting: %+v", s)
	}
	if n := ae.count(`SELECT count(*) FROM node_inventories WHERE node_id = $1`, ae.node.ID); n != 1 {
		t.Fatalf("%d snapshots after reconnecting with the same inventory, want 1", n)
	}
}

// rawSession is a hand-driven session stream.
type rawSession struct {
	t      testing.TB
	resp   *http.Response
	pw     *io.PipeWriter
	enc    *json.Encoder
	frames chan map[string]any
	ended  chan error
}

func (ae *agentEnv) open(id join.Identity) (*rawSession, int) {
	ae.t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, ae.url+protocol.SessionPath, pr)
	if err != nil {
		ae.t.Fatal(err)
	}
	resp, err := session.NewHTTPClient(id).Do(req)
	if err != nil {
		ae.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		pw.Close()
		return nil, resp.StatusCode
	}
	if resp.ProtoMajor != 2 {
		ae.t.Fatalf("the agent listener spoke %s", resp.Proto)
	}
	rs := &rawSession{t: ae.t, resp: resp, pw: pw, enc: json.NewEncoder(pw), frames: make(chan map[string]any, 100),
		ended: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var f map[string]any
			if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
				rs.ended <- err
				return
			}
			rs.frames <- f
		}
		rs.ended <- errors.Join(io.EOF, sc.Err())
	}()
	ae.t.Cleanup(rs.close)
	return rs, resp.StatusCode
}

func (rs *rawSession) close() { rs.pw.Close(); rs.resp.Body.Close() }

func (rs *rawSession) send(f map[string]any) {
	rs.t.Helper()
	if err := rs.enc.Encode(f); err != nil {
		rs.t.Fatal(err)
	}
}

// next answers the next frame, which must be of type typ; spec frames,
// which interleave with the others, are passed over unless asked for.
func (rs *rawSession) next(typ string) map[string]any {
	rs.t.Helper()
	for {
		select {
		case f := <-rs.frames:
			if f["type"] == "spec" && typ != "spec" {
				continue
			}
			if f["type"] != typ {
				rs.t.Fatalf("frame %v, want %s", f, typ)
			}
			return f
		case err := <-rs.ended:
			rs.t.Fatalf("the stream ended (%v) before a %s frame", err, typ)
		case <-time.After(20 * time.Second):
			rs.t.Fatalf("no %s frame", typ)
		}
		return nil
	}
}

func (rs *rawSession) wantEnd() {
	rs.t.Helper()
	for {
		select {
		case <-rs.frames:
		case <-rs.ended:
			return
		case <-time.After(20 * time.Second):
			rs.t.Fatal("the stream did not end")
		}
	}
}

func hello(clock time.Time) map[string]any {
	return map[string]any{"type": "hello", "agentVersion": "raw", "lastExecutedSeq": 0, "clock": clock.UnixMilli()}
}

func TestAgentSessionSupersedeAndClockSkew(t *testing.T) {
	ae := newAgentEnv(t, time.Minute, "")
	first, _ := ae.open(ae.identity)
	first.send(hello(time.Now()))
	w := first.next("welcome")
	if w["nodeId"] != ae.node.ID || w["epoch"] != float64(1) || w["heartbeatSeconds"] != float64(1) || w["leaseSeconds"] != float64(60) {
		t.Fatalf("welcome %v", w)
	}
	ae.eventually("connected", func(s agentNodeState) bool { return s.connectivity == "connected" })

	// A second session, its clock a minute ahead, takes the node: the first
	// stream ends, and its end does not disconnect the node.
	second, _ := ae.open(ae.identity)
	second.send(hello(time.Now().Add(time.Minute)))
	if w := second.next("welcome"); w["epoch"] != float64(2) {
		t.Fatalf("second welcome %v", w)
	}
	first.wantEnd()
	s := ae.state()
	if s.connectivity != "connected" || s.epoch != 2 || !s.has(nodesdomain.CondClockSkew) {
		t.Fatalf("after the second hello: %+v", s)
	}
	// A heartbeat with a good clock clears ClockSkew.
	second.send(map[string]any{"type": "heartbeat", "clock": time.Now().UnixMilli()})
	ae.eventually("ClockSkew cleared", func(s agentNodeState) bool { return !s.has(nodesdomain.CondClockSkew) })

	// A lapsed lease (forced) makes the node unreachable; the next heartbeat
	// brings it back and clears NodeUnreachable.
	if _, err := ae.store.Pool.Exec(context.Background(), `UPDATE node_liveness SET expires_at = now() - interval '1 minute'
		WHERE node_id = $1`, ae.node.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := ae.gateway.SweepLiveness(context.Background()); err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v", n, err)
	}
	if s := ae.state(); s.connectivity != "unreachable" || !s.has(nodesdomain.CondNodeUnreachable) {
		t.Fatalf("after the sweep: %+v", s)
	}
	second.send(map[string]any{"type": "heartbeat", "clock": time.Now().UnixMilli()})
	ae.eventually("back to connected", func(s agentNodeState) bool {
		return s.connectivity == "connected" && !s.has(nodesdomain.CondNodeUnreachable)
	})

	// The ending of the live session disconnects the node.
	second.close()
	ae.eventually("disconnected", func(s agentNodeState) bool { return s.connectivity == "disconnected" })
}

func TestAgentSessionRevocation(t *testing.T) {
	ae := newAgentEnv(t, time.Minute, "")
	rs, _ := ae.open(ae.identity)
	rs.send(hello(time.Now()))
	rs.next("welcome")
	err := ae.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		_, err := nodesdomain.RevokeNodeIdentities(context.Background(), tx, ae.node.ID, "test")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	rs.wantEnd()
	ae.eventually("disconnected", func(s agentNodeState) bool { return s.connectivity == "disconnected" })
	if _, code := ae.open(ae.identity); code != http.StatusForbidden {
		t.Fatalf("a revoked identity's session: HTTP %d, want 403", code)
	}
	// A certificate the CA issued but nobody recorded is refused too.
	if _, code := ae.open(ae.issue(ae.node.ID, false)); code != http.StatusForbidden {
		t.Fatalf("HTTP %d", code)
	}
	// A fresh identity for the node is accepted.
	if rs, code := ae.open(ae.issue(ae.node.ID, true)); code != http.StatusOK {
		t.Fatalf("a fresh identity: HTTP %d", code)
	} else {
		rs.send(hello(time.Now()))
		if w := rs.next("welcome"); w["epoch"] != float64(2) {
			t.Fatalf("welcome %v", w)
		}
	}
}

// An identity that expires sends no notice: the session finds it on its
// periodic check, which rides on a heartbeat's batch (here on every one).
func TestAgentSessionEndsWhenThePeriodicCheckFindsItsIdentityExpired(t *testing.T) {
	ae := newAgentEnv(t, time.Minute, "", func(d *agentgateway.Deps) { d.IdentityRecheck = time.Nanosecond })
	rs, _ := ae.open(ae.identity)
	rs.send(hello(time.Now()))
	rs.next("welcome")
	rs.send(map[string]any{"type": "heartbeat", "clock": time.Now().UnixMilli()})
	if _, err := ae.store.Pool.Exec(context.Background(), `UPDATE node_identities SET expires_at = now() - interval '1 second'
		WHERE node_id = $1`, ae.node.ID); err != nil {
		t.Fatal(err)
	}
	rs.send(map[string]any{"type": "heartbeat", "clock": time.Now().UnixMilli()})
	rs.wantEnd()
	ae.eventually("disconnected", func(s agentNodeState) bool { return s.connectivity == "disconnected" })
}

func TestAgentSessionCommands(t *testing.T) {
	ae := newAgentEnv(t, time.Minute, "")
	queue := func(kind, args string) store.NodeCommand {
		var c store.NodeCommand
		err := ae.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
			c, err = store.QueueNodeCommand(context.Background(), tx, store.NodeCommand{NodeID: ae.node.ID,
				TenantID: ae.node.TenantID, Kind: kind, Args: json.RawMessage(args), CreatedBy: "test"}, "")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	commandState := func(seq int64) string {
		var state string
		if err := ae.store.Pool.QueryRow(context.Background(), `SELECT state FROM node_commands WHERE node_id = $1 AND seq = $2`,
			ae.node.ID, seq).Scan(&state); err != nil {
			t.Fatal(err)
		}
		return state
	}
	c1 := queue(store.CommandInventoryRefresh, `{}`)
	rs, _ := ae.open(ae.identity)
	rs.send(hello(time.Now()))
	rs.next("welcome")
	if f := rs.next("command"); f["seq"] != float64(c1.Seq) || f["id"] != c1.ID || f["kind"] != c1.Kind {
		t.Fatalf("command frame %v", f)
	}
	if st := commandState(c1.Seq); st != store.CommandDelivered {
		t.Fatalf("command 1 is %s", st)
	}
	// A command queued during the session is pushed.
	c2 := queue(store.CommandExec, `{"argv":["true"]}`)
	if f := rs.next("command"); f["seq"] != float64(c2.Seq) {
		t.Fatalf("command frame %v", f)
	}
	zero := 0
	rs.send(map[string]any{"type": "result", "seq": c1.Seq, "state": "succeeded", "exitCode": zero})
	testutil.Eventually(t, 20*time.Second, "command 1 to succeed", func() bool {
		return commandState(c1.Seq) == store.CommandSucceeded
	})
	// A reconnect after seq 1 gets seq 2 again, not 1.
	rs.close()
	rs, _ = ae.open(ae.identity)
	rs.send(map[string]any{"type": "hello", "lastExecutedSeq": c1.Seq, "clock": time.Now().UnixMilli()})
	rs.next("welcome")
	if f := rs.next("command"); f["seq"] != float64(c2.Seq) {
		t.Fatalf("redelivery %v", f)
	}
	// Cancelling the delivered command sends a cancel frame.
	err := ae.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		_, err := store.CancelNodeCommand(context.Background(), tx, ae.node.TenantID, ae.node.ID, c2.ID)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if f := rs.next("cancel"); f["seq"] != float64(c2.Seq) {
		t.Fatalf("cancel frame %v", f)
	}
}

// TestAgentSessionRunsCommands drives the real agent: session.Run with the
// command executor, end to end.
func TestAgentSessionRunsCommands(t *testing.T) {
	ae := newAgentEnv(t, time.Minute, "")
	doc, err := inventory.Parse(fixture(t, "h100-8x-sxm.json"))
	if err != nil {
		t.Fatal(err)
	}
	stateDir := t.TempDir()
	queue := func(kind, args string) store.NodeCommand {
		var c store.NodeCommand
		err := ae.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
			c, err = store.QueueNodeCommand(context.Background(), tx, store.NodeCommand{NodeID: ae.node.ID,
				TenantID: ae.node.TenantID, Kind: kind, Args: json.RawMessage(args), CreatedBy: "test"}, "")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	type outcome struct{ state, stdout string }
	result := func(seq int64) outcome {
		var o outcome
		if err := ae.store.Pool.QueryRow(context.Background(), `SELECT state, stdout FROM node_commands WHERE node_id = $1 AND seq = $2`,
			ae.node.ID, seq).Scan(&o.state, &o.stdout); err != nil {
			t.Fatal(err)
		}
		return o
	}
	waitFor := func(seq int64, state string) outcome {
		var o outcome
		testutil.EventuallyNil(t, 20*time.Second, func() error {
			if o = result(seq); o.state != state {
				return fmt.Errorf("command %d is %+v, want %s", seq, o, state)
			}
			return nil
		})
		return o
	}
	run := func() func() {
		return ae.run(session.Options{StateDir: stateDir, AgentVersion: "bcd/test",
			Executor:  &commands.Executor{StateDir: stateDir, CDIDir: t.TempDir(), Simulate: true},
			Inventory: func(context.Context) (*inventory.NodeInventory, error) { return doc, nil }})
	}
	c1 := queue(store.CommandExec, `{"argv":["echo","hello"]}`) // queued before the session
	stop := run()
	if o := waitFor(c1.Seq, store.CommandSucceeded); o.stdout != "hello\n" {
		t.Fatalf("exec: %+v", o)
	}
	c2 := queue(store.CommandInventoryRefresh, `{}`) // pushed to the live session
	waitFor(c2.Seq, store.CommandSucceeded)
	stop()

	// A new session of the same agent runs nothing again; a new command runs.
	c3 := queue(store.CommandExec, `{"argv":["echo","again"]}`)
	run()
	if o := waitFor(c3.Seq, store.CommandSucceeded); o.stdout != "again\n" {
		t.Fatalf("exec after reconnect: %+v", o)
	}
	if last, err := (&commands.Executor{StateDir: stateDir}).LastExecuted(); err != nil || last != c3.Seq {
		t.Fatalf("last executed %d, %v; want %d", last, err, c3.Seq)
	}
}

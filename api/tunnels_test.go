package api_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/agent/session"
	"github.com/better-compute/better-compute/agent/tunnel"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/api/tunnels"
	"github.com/better-compute/better-compute/core"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/internal/cli"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
)

// tunnelEnv is a real API with the agent gateway mounted (the callers'
// tunnel endpoint) beside a real agent listener, a node whose agent runs
// the real session loop with bcd's tunnel opener, and a TCP echo server on
// 127.0.0.1 standing in for the node's port.
type tunnelEnv struct {
	*agentEnv
	echo     *echoServer
	targets  tunnels.InstanceTargets
	instance string // an instance the test's targets resolve to the node
}

func newTunnelEnv(t *testing.T, tune ...func(*agentgateway.Deps)) *tunnelEnv {
	t.Helper()
	ae := newAgentEnv(t, 20*time.Second, "", tune...)
	te := &tunnelEnv{agentEnv: ae, echo: newEchoServer(t), instance: core.NewID("inst")}
	te.targets = func(ctx context.Context, tx store.Tx, tenantID, instanceID string, port int) (string, string, error) {
		if tenantID == "acme" && instanceID == te.instance {
			return ae.node.ID, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
		}
		return "", "", core.Errorf(core.CodeNotFound, "instance %s not found", instanceID)
	}
	// The API again, with the gateway's routes and tunnels.open over the
	// test's instance targets in place of the default (none).
	domains := []rpc.Domain{func(d rpc.Deps) []rpc.Descriptor {
		var out []rpc.Descriptor
		for _, dom := range api.Domains {
			for _, desc := range dom(d) {
				if name := desc.Info().Name; name != string(tunnels.Open) && name != string(sandboxExec) {
					out = append(out, desc)
				}
			}
		}
		return out
	}, tunnels.Domain(func(ctx context.Context, tx store.Tx, tenantID, instanceID string, port int) (string, string, error) {
		return te.targets(ctx, tx, tenantID, instanceID, port)
	}), sandboxExecDomain(func() string { return ae.node.ID })}
	srv, err := api.New(api.Deps{Store: ae.store, IAM: ae.outer, Catalog: ae.catalog, Routes: ae.gateway, Domains: domains,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	ae.server, ae.env.url = srv, hs.URL
	ae.run(session.Options{OnTunnel: (&tunnel.Opener{Endpoint: ae.url, Execer: localExecer{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).Serve})
	ae.eventually("connected", func(s agentNodeState) bool { return s.connectivity == string(nodestate.Connected) })
	return te
}

// open calls tunnels.open as the acme admin (root's bootstrap user).
func (te *tunnelEnv) open(in tunnels.OpenInput) (tunnels.Opened, error) {
	if in.TenantID == "" {
		in.TenantID = "acme"
	}
	return tunnels.Open.Call(context.Background(), te.client(te.boot.UserToken), in)
}

func (te *tunnelEnv) nodeTunnel() tunnels.Opened {
	te.t.Helper()
	o, err := te.open(tunnels.OpenInput{NodeID: te.node.ID, Port: te.echo.port()})
	if err != nil {
		te.t.Fatal(err)
	}
	return o
}

// connect dials the tunnel's WebSocket with token; on a refusal it answers
// the HTTP status and the error body's code and reason.
func (te *tunnelEnv) connect(o tunnels.Opened, token string) (*websocket.Conn, refusal) {
	te.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(te.env.url, "http") + o.URL
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h, Subprotocols: []string{tunnels.Subprotocol}})
	if err == nil {
		te.t.Cleanup(func() { ws.CloseNow() })
		return ws, refusal{}
	}
	if resp == nil {
		te.t.Fatalf("connect: %v", err)
	}
	var body struct {
		Error struct {
			Code    string         `json:"code"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &body)
	reason, _ := body.Error.Details["reason"].(string)
	return nil, refusal{status: resp.StatusCode, code: body.Error.Code, reason: reason}
}

type refusal struct {
	status       int
	code, reason string
}

// echoServer echoes every connection's bytes back and counts the
// connections it saw end.
type echoServer struct {
	ln    net.Listener
	mu    sync.Mutex
	ended int
}

func newEchoServer(t *testing.T) *echoServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &echoServer{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(c, c)
				c.Close()
				s.mu.Lock()
				s.ended++
				s.mu.Unlock()
			}()
		}
	}()
	return s
}

func (s *echoServer) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

func (s *echoServer) endedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// roundTrip writes payload as binary messages and reads it back whole.
func roundTrip(t *testing.T, ws *websocket.Conn, payload []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	errc := make(chan error, 1)
	go func() {
		for rest := payload; len(rest) > 0; {
			n := min(len(rest), 16<<10)
			if _, err := conn.Write(rest[:n]); err != nil {
				errc <- err
				return
			}
			rest = rest[n:]
		}
		errc <- nil
	}()
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(conn, got); err != nil {
		t.Fatalf("reading the echo: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("writing: %v", err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("the echo differs from what was sent")
	}
}

func TestTunnelToANodePortEchoesBothWaysOnce(t *testing.T) {
	te := newTunnelEnv(t)
	o := te.nodeTunnel()
	if !strings.HasPrefix(o.TunnelID, "tun_") || !strings.HasPrefix(o.Token, "bctun_") || o.URL != tunnels.ConnectPath+o.TunnelID {
		t.Fatalf("answer: %+v", o)
	}
	if left := time.Until(time.UnixMilli(o.ExpiresAt)); left < 30*time.Second || left > 61*time.Second {
		t.Fatalf("expiresAt is %v away, want the 60 s default", left)
	}
	// Only the token's hash is stored, and who opened it is recorded.
	var stored int
	var openedBy, address string
	if err := te.store.Pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE position($2::bytea IN token_hash) > 0),
		max(opened_by), max(address) FROM tunnels WHERE id = $1`, o.TunnelID, []byte(o.Token)).Scan(&stored, &openedBy, &address); err != nil {
		t.Fatal(err)
	}
	if stored != 0 || openedBy != te.identityOf(te.boot.UserToken) || address != net.JoinHostPort("127.0.0.1", strconv.Itoa(te.echo.port())) {
		t.Fatalf("row: token stored %d, openedBy %q, address %q", stored, openedBy, address)
	}

	ws, ref := te.connect(o, o.Token)
	if ws == nil {
		t.Fatalf("connect refused: %+v", ref)
	}
	if ws.Subprotocol() != tunnels.Subprotocol {
		t.Fatalf("subprotocol %q", ws.Subprotocol())
	}
	big := make([]byte, 512<<10) // past every flow-control window on the way
	_, _ = rand.Read(big)
	for _, payload := range [][]byte{[]byte("hello, node\n"), big} {
		roundTrip(t, ws, payload)
	}

	// Single use: a second connect with the same token is refused.
	if _, ref := te.connect(o, o.Token); ref != (refusal{http.StatusConflict, "INVALID_STATE", "spent"}) {
		t.Fatalf("second connect: %+v", ref)
	}

	// Closing the caller's side closes the node's connection and the row.
	_ = ws.Close(websocket.StatusNormalClosure, "done")
	testutil.Eventually(t, 20*time.Second, "the target's connection ends", func() bool { return te.echo.endedCount() == 1 })
	testutil.EventuallyNil(t, 20*time.Second, func() error {
		var reason string
		if err := te.store.Pool.QueryRow(context.Background(), `SELECT close_reason FROM tunnels WHERE id = $1 AND closed_at IS NOT NULL`,
			o.TunnelID).Scan(&reason); err != nil {
			return err
		}
		if reason != "callerClosed" {
			return errors.New("close reason " + reason)
		}
		return nil
	})
}

func TestTunnelConnectRefusals(t *testing.T) {
	te := newTunnelEnv(t)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	cases := []struct {
		name    string
		open    func() tunnels.Opened
		token   func(o tunnels.Opened) string
		prepare func(o tunnels.Opened)
		check   func(o tunnels.Opened)
		want    refusal
	}{
		{name: "no token", token: func(tunnels.Opened) string { return "" },
			want: refusal{http.StatusUnauthorized, "UNAUTHENTICATED", ""}},
		{name: "wrong token", token: func(tunnels.Opened) string { return "bctun_" + strings.Repeat("a", 52) },
			want: refusal{http.StatusUnauthorized, "UNAUTHENTICATED", ""}},
		{name: "another tunnel's token", token: func(tunnels.Opened) string { return te.nodeTunnel().Token },
			want: refusal{http.StatusUnauthorized, "UNAUTHENTICATED", ""}},
		{name: "expired", prepare: func(o tunnels.Opened) {
			if _, err := te.store.Pool.Exec(context.Background(), `UPDATE tunnels SET created_at = now() - interval '2 minutes',
				expires_at = now() - interval '1 minute' WHERE id = $1`, o.TunnelID); err != nil {
				t.Fatal(err)
			}
		}, want: refusal{http.StatusConflict, "INVALID_STATE", "expired"}},
		{name: "the node cannot dial the port", open: func() tunnels.Opened {
			o, err := te.open(tunnels.OpenInput{NodeID: te.node.ID, Port: closedPort})
			if err != nil {
				t.Fatal(err)
			}
			return o
		}, want: refusal{http.StatusServiceUnavailable, "UNAVAILABLE", "dialFailed"}},
		// The database says connected, but no session is held here (another
		// replica's): the token stays unspent for a retry there.
		{name: "a session held elsewhere", open: func() tunnels.Opened {
			n := te.env.node(nodesdomain.NewNode{PoolID: te.pool.ID, Name: "gpu-elsewhere", ProvisionState: nodestate.Adopted,
				Role: nodestate.RoleHost, Power: nodestate.PowerOn, ObservedGeneration: 1, Connectivity: nodestate.Connected}, nil)
			o, err := te.open(tunnels.OpenInput{NodeID: n.ID})
			if err != nil {
				t.Fatal(err)
			}
			return o
		}, check: func(o tunnels.Opened) {
			var spent bool
			if err := te.store.Pool.QueryRow(context.Background(), `SELECT connected_at IS NOT NULL FROM tunnels WHERE id = $1`,
				o.TunnelID).Scan(&spent); err != nil || spent {
				t.Fatalf("spent %v (%v): the token must stay unspent", spent, err)
			}
		}, want: refusal{http.StatusServiceUnavailable, "UNAVAILABLE", "sessionElsewhere"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := te.nodeTunnel
			if tc.open != nil {
				o = tc.open
			}
			opened := o()
			token := opened.Token
			if tc.token != nil {
				token = tc.token(opened)
			}
			if tc.prepare != nil {
				tc.prepare(opened)
			}
			if ws, ref := te.connect(opened, token); ws != nil || ref != tc.want {
				t.Fatalf("connect: %+v, want %+v", ref, tc.want)
			}
			if tc.check != nil {
				tc.check(opened)
			}
		})
	}
}

func TestTunnelOpenRefusals(t *testing.T) {
	te := newTunnelEnv(t)
	offline := te.env.node(nodesdomain.NewNode{PoolID: te.pool.ID, Name: "gpu-offline", ProvisionState: nodestate.Adopted,
		Role: nodestate.RoleHost, Power: nodestate.PowerOn, ObservedGeneration: 1}, nil)
	cases := []struct {
		name   string
		token  string
		in     tunnels.OpenInput
		code   core.Code
		detail string // details.reason or details.field
	}{
		{"neither id", "", tunnels.OpenInput{Port: 22}, core.CodeInvalidInput, "required"},
		{"both ids", "", tunnels.OpenInput{NodeID: te.node.ID, InstanceID: te.instance, Port: 22}, core.CodeInvalidInput, "exclusive"},
		{"port out of range", "", tunnels.OpenInput{NodeID: te.node.ID, Port: 65536}, core.CodeInvalidInput, "port"},
		{"ttl over the maximum", "", tunnels.OpenInput{NodeID: te.node.ID, TTLSeconds: 601}, core.CodeInvalidInput, "ttlSeconds"},
		{"instance without a port", "", tunnels.OpenInput{InstanceID: te.instance}, core.CodeInvalidInput, "required"},
		{"a disconnected node", "", tunnels.OpenInput{NodeID: offline.ID}, core.CodeInvalidState, tunnels.ReasonDisconnected},
		{"a node of another tenant", te.globex, tunnels.OpenInput{TenantID: "globex", NodeID: te.node.ID}, core.CodeNotFound, ""},
		{"a node that does not exist", "", tunnels.OpenInput{NodeID: core.NewID("node")}, core.CodeNotFound, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.in.TenantID == "" {
				tc.in.TenantID = "acme"
			}
			token := tc.token
			if token == "" {
				token = te.boot.UserToken
			}
			_, err := tunnels.Open.Call(context.Background(), te.client(token), tc.in)
			ce := core.AsError(err)
			if err == nil || ce.Code != tc.code {
				t.Fatalf("error %v, want %s", err, tc.code)
			}
			if tc.detail != "" && ce.Details["reason"] != tc.detail && ce.Details["field"] != tc.detail {
				t.Fatalf("details %v, want %q", ce.Details, tc.detail)
			}
		})
	}
	var n int
	if err := te.store.Pool.QueryRow(context.Background(), `SELECT count(*) FROM tunnels`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused opens left %d tunnels (%v)", n, err)
	}
}

func TestTunnelToAnInstancePort(t *testing.T) {
	te := newTunnelEnv(t)
	// The instances domain is another's: its authorization row stands in
	// for the instance, so the decision on compute-instance can be made.
	if err := te.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		return store.PutAuthzResource(context.Background(), tx, store.AuthzResource{Type: te.catalog.FullName("instance"),
			ID: te.instance, TenantID: "acme", ParentType: te.catalog.FullName("pool"), ParentID: te.pool.ID})
	}); err != nil {
		t.Fatal(err)
	}
	var o tunnels.Opened
	testutil.EventuallyNil(t, 20*time.Second, func() (err error) {
		o, err = te.open(tunnels.OpenInput{InstanceID: te.instance, Port: te.echo.port(), TTLSeconds: 600})
		return err
	})
	if left := time.Until(time.UnixMilli(o.ExpiresAt)); left < 500*time.Second {
		t.Fatalf("expiresAt is %v away, want 600 s", left)
	}
	ws, ref := te.connect(o, o.Token)
	if ws == nil {
		t.Fatalf("connect refused: %+v", ref)
	}
	roundTrip(t, ws, []byte("instance says hi"))
}

func TestTunnelEndsAtItsMaxLifetime(t *testing.T) {
	te := newTunnelEnv(t, func(d *agentgateway.Deps) { d.TunnelMaxLifetime = 300 * time.Millisecond })
	o := te.nodeTunnel()
	ws, ref := te.connect(o, o.Token)
	if ws == nil {
		t.Fatalf("connect refused: %+v", ref)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _, err := ws.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("read: %v, want the close for the tunnel's lifetime", err)
	}
	testutil.Eventually(t, 20*time.Second, "the target's connection ends", func() bool { return te.echo.endedCount() == 1 })
}

func TestTunnelCommandListens(t *testing.T) {
	te := newTunnelEnv(t)
	vars := map[string]string{cli.EnvAPIURL: te.env.url, cli.EnvToken: te.boot.UserToken, cli.EnvTenant: "acme"}
	stderr := &lockedBuffer{}
	root := &cobra.Command{Use: "better-compute", SilenceUsage: true, SilenceErrors: true}
	if err := cli.Attach(root, cli.Options{Registry: te.server.Registry(), Stdout: io.Discard, Stderr: stderr,
		Getenv: func(k string) string { return vars[k] }, ConfigPath: t.TempDir() + "/config.yaml"}); err != nil {
		t.Fatal(err)
	}
	root.SetArgs([]string{"tunnel", "--node", te.node.ID, "--port", strconv.Itoa(te.echo.port()), "--listen", "127.0.0.1:0"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	var addr string
	testutil.EventuallyNil(t, 20*time.Second, func() error {
		line, ok := strings.CutPrefix(stderr.String(), "listening on ")
		if !ok {
			return errors.New("not listening yet: " + stderr.String())
		}
		addr = strings.TrimSpace(line)
		return nil
	})
	// Two local connections, two tunnels, each echoing its own bytes.
	for i, msg := range []string{"first connection\n", "second connection\n"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
			t.Fatalf("connection %d: %q, %v", i, got, err)
		}
		c.Close()
		testutil.Eventually(t, 20*time.Second, "the target's connection ends", func() bool { return te.echo.endedCount() == i+1 })
	}
	var spent int
	if err := te.store.Pool.QueryRow(context.Background(), `SELECT count(*) FROM tunnels WHERE connected_at IS NOT NULL`).Scan(&spent); err != nil || spent != 2 {
		t.Fatalf("%d tunnels connected (%v), want 2", spent, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("tunnel --listen: %v (stderr %s)", err, stderr.String())
	}
}

package tunnels

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/tunnels"
)

// Subprotocol is the WebSocket subprotocol a tunnel speaks: binary
// messages carry the TCP stream's bytes, either way. A browser, which
// cannot set Authorization on a WebSocket, offers its token as a second
// subprotocol (["bc-tunnel", "bctun_…"]); the answer selects Subprotocol.
const Subprotocol = "bc-tunnel"

// Defaults of ConnectDeps.
const (
	// DefaultMaxLifetime bounds a connected tunnel: it is closed then,
	// whatever flows.
	DefaultMaxLifetime = time.Hour
	// maxMessage bounds one WebSocket message from the caller.
	maxMessage = 1 << 20
)

// Relay reaches nodes' agents (the agent gateway of this process).
type Relay interface {
	// HoldsSession says whether this process holds the node's live
	// session.
	HoldsSession(nodeID string) bool
	// DialTunnel sends t on the node's live session and waits, bounded,
	// for the agent's dial-back: the stream answered carries the target's
	// bytes (Read) and takes the caller's (Write); Close ends it. An agent
	// that could not dial is UNAVAILABLE with details.reason "dialFailed".
	DialTunnel(ctx context.Context, nodeID string, t protocol.Tunnel) (io.ReadWriteCloser, error)
}

// ConnectDeps are what the caller's endpoint needs.
type ConnectDeps struct {
	Store  *store.Store
	Relay  Relay
	Logger *slog.Logger
	// MaxLifetime bounds a connected tunnel (DefaultMaxLifetime).
	MaxLifetime time.Duration
}

// Connect serves GET ConnectPath:tunnelId: the token (Authorization:
// Bearer, or the second subprotocol) is spent in one transaction, the node
// is asked for the tunnel, and once its agent has dialed the target the
// request is upgraded to a WebSocket spliced with the agent's stream.
// Every refusal before the upgrade is an HTTP answer in the API's error
// shape; the token is never logged. ?token= is not read: URLs end up in
// access logs, proxies and browser histories.
func Connect(d ConnectDeps) gin.HandlerFunc {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.MaxLifetime <= 0 {
		d.MaxLifetime = DefaultMaxLifetime
	}
	return func(c *gin.Context) {
		c.Header("Cache-Control", "no-store")
		id := c.Param("tunnelId")
		token := tokenOf(c.Request)
		if token == "" {
			httpx.WriteError(c, core.Errorf(core.CodeUnauthn,
				"a tunnel token is required (Authorization: Bearer bctun_…, or the WebSocket subprotocols %q and the token)", Subprotocol))
			return
		}
		if d.Store == nil || d.Relay == nil {
			httpx.WriteError(c, core.Errorf(core.CodeUnavailable, "tunnels are not served by this process"))
			return
		}
		ctx := c.Request.Context()
		var t domain.Tunnel
		err := d.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			if t, err = domain.Spend(ctx, tx, id, token); err != nil {
				return err
			}
			// Checked before the commit: a session held elsewhere leaves
			// the token unspent, for a retry that reaches its holder.
			if !d.Relay.HoldsSession(t.NodeID) {
				return core.Errorf(core.CodeUnavailable, "this API process does not hold node %s's session; connect again", t.NodeID).
					WithDetails(map[string]any{"reason": "sessionElsewhere"})
			}
			return nil
		})
		if err != nil {
			httpx.WriteError(c, err)
			return
		}
		log := httpx.Logger(c).With("tunnel", t.ID, "node", t.NodeID)
		stream, err := d.Relay.DialTunnel(ctx, t.NodeID, protocol.Tunnel{Type: protocol.FrameTunnel, ID: t.ID,
			Target: t.Target, Address: t.Address, Exec: t.Exec, ExecOutputLimit: t.ExecOutputLimit})
		if err != nil {
			closeRow(d, log, t.ID, "dialFailed")
			httpx.WriteError(c, err)
			return
		}
		defer stream.Close()
		// The upgraded connection outlives the listener's read timeout.
		rc := http.NewResponseController(c.Writer)
		_ = rc.SetReadDeadline(time.Time{})
		_ = rc.SetWriteDeadline(time.Time{})
		ws, err := websocket.Accept(c.Writer, c.Request, &websocket.AcceptOptions{Subprotocols: []string{Subprotocol}})
		if err != nil {
			// Accept has answered the client.
			closeRow(d, log, t.ID, "handshake")
			return
		}
		ws.SetReadLimit(maxMessage)
		log.Info("tunnel connected", "address", t.Address)
		reason := splice(context.WithoutCancel(ctx), ws, stream, d.MaxLifetime)
		closeRow(d, log, t.ID, reason)
		log.Info("tunnel closed", "reason", reason)
	}
}

// tokenOf reads the tunnel token: the bearer token, else a subprotocol
// offered beside Subprotocol that is a tunnel token.
func tokenOf(r *http.Request) string {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return strings.TrimSpace(tok)
	}
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if p = strings.TrimSpace(p); strings.HasPrefix(p, domain.TokenPrefix) {
				return p
			}
		}
	}
	return ""
}

// splice copies binary messages to the stream and the stream's bytes to
// binary messages until either side ends or lifetime passes, then closes
// both, and answers why it ended.
func splice(ctx context.Context, ws *websocket.Conn, stream io.ReadWriteCloser, lifetime time.Duration) string {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	var once sync.Once
	ended := make(chan struct{})
	reason := ""
	end := func(why string) {
		once.Do(func() {
			reason = why
			_ = stream.Close()
			close(ended)
		})
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(stream, conn)
		end("callerClosed")
	}()
	go func() {
		defer wg.Done()
		_, _ = io.Copy(conn, stream)
		end("targetClosed")
	}()
	life := time.NewTimer(lifetime)
	defer life.Stop()
	select {
	case <-ended:
	case <-life.C:
		end("maxLifetime")
	}
	code, text := websocket.StatusNormalClosure, "the tunnel ended"
	if reason == "maxLifetime" {
		code, text = websocket.StatusGoingAway, "the tunnel's lifetime ended"
	}
	// The close handshake (bounded by the library), then the connection.
	_ = ws.Close(code, text)
	cancel()
	_ = conn.Close()
	wg.Wait()
	return reason
}

// closeRow records the tunnel's end; a failure only leaves closed_at
// unset, which the row's record tolerates.
func closeRow(d ConnectDeps, log *slog.Logger, id, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := domain.Close(ctx, d.Store.Pool, id, reason); err != nil {
		log.Warn("tunnel: recording its end", "error", err)
	}
}

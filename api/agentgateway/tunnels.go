package agentgateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/tunnels"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/nodeca"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// Tunnels (docs/tunnels.md): the caller's endpoint (api/tunnels.Connect,
// mounted on the API listener) asks DialTunnel for a node's stream; the
// gateway sends the tunnel frame on the node's live session and waits for
// the agent's dial-back, POST protocol.TunnelPath<id> on the agent
// listener, whose request and response bodies are the stream.

// DefaultTunnelDialBack bounds the wait for an agent's dial-back.
const DefaultTunnelDialBack = 15 * time.Second

// TunnelErrorHeader carries why an agent could not open a tunnel.
const TunnelErrorHeader = "X-Tunnel-Error"

// tunnelWaiters are the tunnels waiting for their dial-back, by id.
type tunnelWaiters struct {
	mu      sync.Mutex
	waiting map[string]*tunnelWaiter
}

type tunnelWaiter struct {
	nodeID string
	// ready takes the one dial-back: its stream, or the agent's error.
	ready chan dialBack
}

type dialBack struct {
	stream *tunnelStream
	err    error
}

func (w *tunnelWaiters) add(id, nodeID string) *tunnelWaiter {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiting == nil {
		w.waiting = map[string]*tunnelWaiter{}
	}
	tw := &tunnelWaiter{nodeID: nodeID, ready: make(chan dialBack, 1)}
	w.waiting[id] = tw
	return tw
}

// claim takes the waiter of id for the node's dial-back; nil when none
// waits (unknown, another node's, already served or given up).
func (w *tunnelWaiters) claim(id, nodeID string) *tunnelWaiter {
	w.mu.Lock()
	defer w.mu.Unlock()
	tw := w.waiting[id]
	if tw == nil || tw.nodeID != nodeID {
		return nil
	}
	delete(w.waiting, id)
	return tw
}

// drop removes tw unless a dial-back claimed it; claimed says it did.
func (w *tunnelWaiters) drop(id string, tw *tunnelWaiter) (claimed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiting[id] == tw {
		delete(w.waiting, id)
		return false
	}
	return true
}

// HoldsSession says whether this process holds a welcomed session of the
// node.
func (g *Gateway) HoldsSession(nodeID string) bool {
	return g.liveSession(nodeID) != nil
}

// liveSession is the node's newest welcomed session here, or nil.
func (g *Gateway) liveSession(nodeID string) *agentSession {
	var best *agentSession
	for _, a := range g.agentsOf(nodeID) {
		if e := a.getEpoch(); e > 0 && a.conn.Load() != nil && (best == nil || e > best.getEpoch()) {
			best = a
		}
	}
	return best
}

// sendFrame sends a server frame on the session's stream.
func (a *agentSession) sendFrame(v any) error {
	c := a.conn.Load()
	if c == nil {
		return errors.New("the session's stream is not up")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("the session ended")
	}
	if err := c.send(v); err != nil {
		a.cancel(err)
		return err
	}
	return nil
}

// DialTunnel sends t on the node's live session here and waits, at most
// Deps.TunnelDialBack, for the agent's dial-back (api/tunnels.Relay).
func (g *Gateway) DialTunnel(ctx context.Context, nodeID string, t protocol.Tunnel) (io.ReadWriteCloser, error) {
	a := g.liveSession(nodeID)
	if a == nil {
		return nil, core.Errorf(core.CodeInvalidState, "node %s has no live session", nodeID).
			WithDetails(map[string]any{"reason": tunnels.ReasonDisconnected})
	}
	wait := g.deps.TunnelDialBack
	t.Type = protocol.FrameTunnel
	t.ExpiresAt = time.Now().Add(wait).UnixMilli()
	tw := g.tunnels.add(t.ID, nodeID)
	if err := a.sendFrame(t); err != nil {
		g.tunnels.drop(t.ID, tw)
		return nil, core.Errorf(core.CodeInvalidState, "node %s's session ended: %v", nodeID, err).
			WithDetails(map[string]any{"reason": tunnels.ReasonDisconnected})
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case db := <-tw.ready:
		return db.result()
	case <-ctx.Done():
	case <-timer.C:
	}
	if g.tunnels.drop(t.ID, tw) {
		// A dial-back claimed it meanwhile: take it, and end it if the
		// caller is gone.
		db := <-tw.ready
		if ctx.Err() != nil && db.stream != nil {
			db.stream.Close()
		}
		if ctx.Err() == nil {
			return db.result()
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, core.Errorf(core.CodeUnavailable, "node %s's agent did not dial back within %s", nodeID, wait).
		WithDetails(map[string]any{"reason": "noDialBack"})
}

func (db dialBack) result() (io.ReadWriteCloser, error) {
	if db.err != nil {
		return nil, db.err
	}
	return db.stream, nil
}

// tunnelStream is a dial-back's stream: the agent's request body and the
// response, until Close ends the handler.
type tunnelStream struct {
	body io.Reader
	mu   sync.Mutex
	w    http.ResponseWriter
	rc   *http.ResponseController
	once sync.Once
	done chan struct{}
}

func (s *tunnelStream) Read(p []byte) (int, error) { return s.body.Read(p) }

func (s *tunnelStream) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.done:
		return 0, io.ErrClosedPipe
	default:
	}
	n, err := s.w.Write(p)
	if err != nil {
		return n, err
	}
	return n, s.rc.Flush()
}

func (s *tunnelStream) Close() error {
	s.once.Do(func() { close(s.done) })
	return nil
}

// handleTunnel is POST protocol.TunnelPath<id>: a node's agent dialing back
// with the tunnel's stream, or (X-Tunnel-Error, no body) why it could not.
func (g *Gateway) handleTunnel(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		agentError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "a node certificate is required")
		return
	}
	cert := r.TLS.VerifiedChains[0][0]
	nodeID, err := nodeca.NodeID(cert)
	if err != nil {
		agentError(w, http.StatusUnauthorized, "UNAUTHENTICATED", err.Error())
		return
	}
	ok, err := domain.NodeIdentityValid(r.Context(), g.deps.Store.Pool, nodeID, nodeca.Serial(cert.SerialNumber))
	if err != nil {
		agentError(w, http.StatusServiceUnavailable, "UNAVAILABLE", "the identity check failed; retry")
		return
	}
	if !ok {
		agentError(w, http.StatusForbidden, "ACCESS_DENIED", "the node certificate is revoked, expired or unknown")
		return
	}
	id := r.PathValue("tunnelId")
	tw := g.tunnels.claim(id, nodeID)
	if tw == nil {
		agentError(w, http.StatusNotFound, "NOT_FOUND", fmt.Sprintf("no tunnel %s waits for this node", id))
		return
	}
	if reason := r.Header.Get(TunnelErrorHeader); reason != "" {
		reason = strings.ToValidUTF8(reason, "?")
		if len(reason) > 512 {
			reason = reason[:512]
		}
		tw.ready <- dialBack{err: core.Errorf(core.CodeUnavailable, "the node could not open the tunnel: %s", reason).
			WithDetails(map[string]any{"reason": "dialFailed"})}
		w.Header().Set(TunnelErrorHeader, reason)
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil && r.ProtoMajor < 2 {
		tw.ready <- dialBack{err: core.Errorf(core.CodeUnavailable, "the node's dial-back was not HTTP/2")}
		agentError(w, http.StatusHTTPVersionNotSupported, "INVALID_INPUT", "a tunnel needs HTTP/2")
		return
	}
	// The stream lives as long as the tunnel: no server-wide timeout
	// applies to it.
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	s := &tunnelStream{body: r.Body, w: w, rc: rc, done: make(chan struct{})}
	if err := rc.Flush(); err != nil {
		tw.ready <- dialBack{err: core.Errorf(core.CodeUnavailable, "the node's dial-back failed: %v", err)}
		return
	}
	tw.ready <- dialBack{stream: s}
	select {
	case <-s.done:
	case <-r.Context().Done():
		s.Close()
	}
	// Writes end before the handler returns (the response must not be
	// used after): one the agent no longer reads fails by its deadline.
	_ = rc.SetWriteDeadline(time.Now().Add(time.Second))
	s.mu.Lock()
	defer s.mu.Unlock()
}

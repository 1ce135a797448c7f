package api

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/store"
)

// The node session (docs/agent-protocol.md, "The session"): one full-duplex
// HTTP/2 request per node on the agent listener, authenticated by the node's
// client certificate. Each session takes the node with a new fencing epoch
// (nodes.session_epoch); every later write of the session is conditional on
// it, so of two sessions for one node only the newer writes, and the older
// ends at its next write.

// Defaults of Deps.AgentLease and Deps.AgentHeartbeat.
const (
	DefaultAgentLease     = 40 * time.Second
	DefaultAgentHeartbeat = 10 * time.Second
	// DefaultLostAfter is how long an unreachable node stays before it is
	// lost when its pool's policy.lostAfter is unset.
	DefaultLostAfter = 5 * time.Minute
	// MaxClockSkew is how far the agent's clock may be from the server's
	// before the node gets the ClockSkew condition.
	MaxClockSkew = 5 * time.Second
)

// Liveness conditions and events.
const (
	CondNodeUnreachable = "NodeUnreachable"
	CondClockSkew       = "ClockSkew"
	// EventConnectivity records a change of the connectivity axis
	// (details: from, to, epoch when a session made it).
	EventConnectivity = "ConnectivityChanged"
)

// Limits of a session.
const (
	agentCommandBatch = 100 // commands read per delivery pass
	// agentRedeliverEvery is how often a heartbeat also looks for pending
	// commands no notice announced (a notBefore reached).
	agentRedeliverEvery = 30 * time.Second
)

// AgentTLSConfig is the agent listener's TLS configuration: TLS 1.3, HTTP/2,
// a client certificate of the node CA required, and a server certificate
// the CA issues for hosts (names or IP addresses), valid for a year.
func AgentTLSConfig(ca *nodeca.CA, hosts []string) (*tls.Config, error) {
	cert, err := ca.ServerCertificate(hosts, 365*24*time.Hour)
	if err != nil {
		return nil, fmt.Errorf("agent listener certificate: %w", err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool(),
		MinVersion:   tls.VersionTLS13,
		NextProtos:   []string{"h2"},
	}, nil
}

// AgentHandler serves the agent listener: POST /agent/v1/session.
func (s *Server) AgentHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.SessionPath, s.handleAgentSession)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		agentError(w, http.StatusNotFound, "NOT_FOUND", "no such route")
	})
	return mux
}

func (s *Server) agentLease() time.Duration {
	if s.deps.AgentLease > 0 {
		return s.deps.AgentLease
	}
	return DefaultAgentLease
}

func (s *Server) agentHeartbeat() time.Duration {
	if s.deps.AgentHeartbeat > 0 {
		return s.deps.AgentHeartbeat
	}
	return DefaultAgentHeartbeat
}

// agentError answers a refused session in the envelope's error shape.
func agentError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": message}})
}

// agentSession is one live session of this process.
type agentSession struct {
	nodeID string
	serial string
	cancel context.CancelCauseFunc
	// recheck asks the session to check its identity again (a revocation
	// notice); commands to read the node's pending commands.
	recheck  chan struct{}
	commands chan struct{}
	mu       sync.Mutex
	epoch    int64
}

func (a *agentSession) poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (a *agentSession) getEpoch() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epoch
}

// agentHub is the process's registry of live sessions by node id, and the
// one LISTEN connection (revocations and commands) that fans out to them.
// The listener runs while at least one session is live.
type agentHub struct {
	mu       sync.Mutex
	sessions map[string]map[*agentSession]struct{}
	live     int
	stop     context.CancelFunc
}

// Session endings, as the cause of a session's context.
var (
	errSuperseded = errors.New("a newer session holds the node")
	errRevoked    = errors.New("the node's identity was revoked")
	errLeaseLost  = errors.New("no frame within the liveness lease")
	errShutdown   = errors.New("the server is shutting down")
)

func (s *Server) registerAgent(a *agentSession) {
	h := &s.agents
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sessions == nil {
		h.sessions = map[string]map[*agentSession]struct{}{}
	}
	if h.sessions[a.nodeID] == nil {
		h.sessions[a.nodeID] = map[*agentSession]struct{}{}
	}
	h.sessions[a.nodeID][a] = struct{}{}
	h.live++
	if h.live == 1 {
		ctx, cancel := context.WithCancel(context.Background())
		h.stop = cancel
		go s.listenAgents(ctx)
	}
}

func (s *Server) unregisterAgent(a *agentSession) {
	h := &s.agents
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.sessions[a.nodeID][a]; !ok {
		return
	}
	delete(h.sessions[a.nodeID], a)
	if len(h.sessions[a.nodeID]) == 0 {
		delete(h.sessions, a.nodeID)
	}
	h.live--
	if h.live == 0 && h.stop != nil {
		h.stop()
		h.stop = nil
	}
}

// CloseAgentSessions ends every live session of this process (each marks
// its node disconnected), e.g. from http.Server.RegisterOnShutdown: a
// session stream is never idle, so a graceful shutdown would otherwise wait
// for it until its deadline.
func (s *Server) CloseAgentSessions() {
	for _, a := range s.agentsOf("") {
		a.cancel(errShutdown)
	}
}

// agentsOf answers the node's live sessions here (all nodes' for "").
func (s *Server) agentsOf(nodeID string) []*agentSession {
	h := &s.agents
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*agentSession
	for id, set := range h.sessions {
		if nodeID != "" && id != nodeID {
			continue
		}
		for a := range set {
			out = append(out, a)
		}
	}
	return out
}

// listenAgents holds the hub's LISTEN connection until ctx ends,
// reconnecting with backoff. Once a LISTEN is in place every session checks
// its identity and commands again: notices sent before it may be lost.
func (s *Server) listenAgents(ctx context.Context) {
	// 100 ms doubling up to 10 s, no jitter: one listener per process.
	retry := &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, Multiplier: 2,
		MaxInterval: 10 * time.Second}
	retry.Reset()
	for ctx.Err() == nil {
		err := s.listenAgentsOnce(ctx, retry.Reset)
		if ctx.Err() != nil {
			return
		}
		wait := retry.NextBackOff()
		s.deps.Logger.Warn("agent sessions: listen failed", "error", err, "retryIn", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

func (s *Server) listenAgentsOnce(ctx context.Context, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, s.store.Pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	for _, ch := range []string{store.NodeIdentityRevokedChannel, store.NodeCommandsChannel} {
		if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{ch}.Sanitize()); err != nil {
			return err
		}
	}
	connected()
	for _, a := range s.agentsOf("") {
		a.poke(a.recheck)
		a.poke(a.commands)
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		for _, a := range s.agentsOf(n.Payload) {
			switch n.Channel {
			case store.NodeIdentityRevokedChannel:
				a.poke(a.recheck)
			case store.NodeCommandsChannel:
				a.poke(a.commands)
			}
		}
	}
}

// handleAgentSession is POST /agent/v1/session.
func (s *Server) handleAgentSession(w http.ResponseWriter, r *http.Request) {
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
	a := &agentSession{nodeID: nodeID, serial: nodeca.Serial(cert.SerialNumber),
		recheck: make(chan struct{}, 1), commands: make(chan struct{}, 1)}
	log := s.deps.Logger.With("node", nodeID, "serial", a.serial)
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	a.cancel = cancel
	// Registered before the identity check: a revocation committed after
	// the check reaches the session through the hub.
	s.registerAgent(a)
	defer s.unregisterAgent(a)
	ok, err := store.NodeIdentityValid(ctx, s.store.Pool, nodeID, a.serial)
	if err != nil {
		log.Error("agent session: identity check", "error", err)
		agentError(w, http.StatusServiceUnavailable, "UNAVAILABLE", "the identity check failed; retry")
		return
	}
	if !ok {
		agentError(w, http.StatusForbidden, "ACCESS_DENIED", "the node certificate is revoked, expired or unknown")
		return
	}

	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil && r.ProtoMajor < 2 {
		agentError(w, http.StatusHTTPVersionNotSupported, "INVALID_INPUT", "the session needs HTTP/2")
		return
	}
	// The stream lives as long as the session: no server-wide timeout
	// applies to it (the liveness lease does).
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	sess := &sessionConn{s: s, a: a, w: w, rc: rc, log: log}
	cause := sess.run(ctx, r.Body)
	log.Info("agent session ended", "epoch", a.getEpoch(), "cause", cause)
}

// sessionConn is the state of one session's stream.
type sessionConn struct {
	s   *Server
	a   *agentSession
	w   http.ResponseWriter
	rc  *http.ResponseController
	log *slog.Logger
	enc *json.Encoder
	// lastSent is the highest command seq sent on this stream; lastSpec
	// the highest NodeSpec generation.
	lastSent, lastSpec int64
	// cancelled are seqs a cancel frame was sent for.
	cancelled map[int64]bool
	// lastPass is when deliver last read the pending commands.
	lastPass time.Time
}

func (c *sessionConn) send(v any) error {
	if c.enc == nil {
		c.enc = json.NewEncoder(c.w)
	}
	// An agent that stops reading must not hold the session forever; the
	// deadline is cleared once the frame is out, because HTTP/2 resets the
	// stream when a write deadline passes even with no write pending.
	_ = c.rc.SetWriteDeadline(time.Now().Add(c.s.agentLease()))
	if err := c.enc.Encode(v); err != nil {
		return err
	}
	if err := c.rc.Flush(); err != nil {
		return err
	}
	return c.rc.SetWriteDeadline(time.Time{})
}

// run serves the stream until it ends and answers why.
func (c *sessionConn) run(ctx context.Context, body io.Reader) (cause error) {
	frames := make(chan any)
	readErr := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(body)
		sc.Buffer(make([]byte, 4<<10), protocol.MaxFrame) // grows for an inventory frame
		for sc.Scan() {
			f, err := protocol.DecodeAgentFrame(sc.Bytes())
			if err != nil {
				readErr <- fmt.Errorf("bad frame: %w", err)
				return
			}
			select {
			case frames <- f:
			case <-ctx.Done():
				return
			}
		}
		err := sc.Err()
		if err == nil {
			err = io.EOF
		}
		readErr <- err
	}()
	defer func() {
		if epoch := c.a.getEpoch(); epoch > 0 {
			endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := c.s.endAgentSession(endCtx, c.a.nodeID, epoch); err != nil {
				c.log.Error("agent session: disconnect", "error", err)
			}
		}
	}()

	lease := c.s.agentLease()
	timer := time.NewTimer(lease)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case err := <-readErr:
			return err
		case <-timer.C:
			return errLeaseLost
		case <-c.a.recheck:
			ok, err := store.NodeIdentityValid(ctx, c.s.store.Pool, c.a.nodeID, c.a.serial)
			if err != nil {
				return err
			}
			if !ok {
				return errRevoked
			}
		case <-c.a.commands:
			if c.a.getEpoch() > 0 {
				if err := c.deliver(ctx); err != nil {
					return err
				}
			}
		case f := <-frames:
			timer.Reset(lease)
			if err := c.frame(ctx, f); err != nil {
				return err
			}
		}
	}
}

func (c *sessionConn) frame(ctx context.Context, frame any) error {
	epoch := c.a.getEpoch()
	hello, isHello := frame.(protocol.Hello)
	if epoch == 0 && !isHello {
		return fmt.Errorf("the first frame is %q, not hello", frameType(frame))
	}
	switch f := frame.(type) {
	case protocol.Hello:
		if epoch != 0 {
			return errors.New("a second hello")
		}
		return c.hello(ctx, hello)
	case protocol.Heartbeat:
		hbStart := time.Now()
		generation, err := c.s.agentHeartbeatFrame(ctx, c.a, epoch, f.Clock)
		c.s.observeHeartbeat(hbStart)
		if err != nil {
			return err
		}
		if generation > c.lastSpec {
			if err := c.sendSpec(ctx); err != nil {
				return err
			}
		}
		// Commands whose notBefore came since send no notice: look for
		// them now and then.
		if time.Since(c.lastPass) >= agentRedeliverEvery {
			return c.deliver(ctx)
		}
		return nil
	case protocol.Observed:
		return c.observed(ctx, f.Generation)
	case protocol.Inventory:
		err := c.s.inFencedTx(ctx, c.a.nodeID, epoch, func(tx store.Tx) error {
			_, err := c.s.IngestInventory(ctx, tx, c.a.nodeID, f.Document)
			return err
		})
		if err != nil && !errors.Is(err, errSuperseded) && ctx.Err() == nil {
			// A document the server refuses would be refused again after
			// a reconnect: log it and go on.
			c.log.Warn("agent session: inventory refused", "error", err)
			return nil
		}
		return err
	case protocol.Result:
		err := c.s.inFencedTx(ctx, c.a.nodeID, epoch, func(tx store.Tx) error {
			return store.RecordNodeCommandResult(ctx, tx, c.a.nodeID, f.Seq, store.NodeCommandResult{State: string(f.State),
				ExitCode: f.ExitCode, Stdout: f.Stdout, Stderr: f.Stderr, Error: f.Error, Truncated: f.Truncated})
		})
		if err != nil && !errors.Is(err, errSuperseded) {
			// A bad result (an unknown seq) is the agent's fault, not the
			// session's: log it and go on.
			c.log.Warn("agent session: result refused", "seq", f.Seq, "error", err)
			return nil
		}
		return err
	default:
		c.log.Warn("agent session: unknown frame", "type", frameType(frame))
		return nil
	}
}

// frameType names a decoded frame for errors and logs.
func frameType(frame any) string {
	if h, ok := frame.(protocol.Header); ok {
		return string(h.Type)
	}
	return fmt.Sprintf("%T", frame)
}

// hello takes the node with a new epoch and answers welcome, then the
// pending commands.
func (c *sessionConn) hello(ctx context.Context, f protocol.Hello) error {
	skew := time.Duration(f.Clock-time.Now().UnixMilli()) * time.Millisecond
	var epoch int64
	var digest string
	err := c.s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		var prev string
		var conds []byte
		err := tx.QueryRow(ctx, `WITH old AS (SELECT id, connectivity FROM nodes WHERE id = $1 AND deleted_at IS NULL FOR UPDATE)
			UPDATE nodes n SET session_epoch = n.session_epoch + 1, connectivity = 'connected', agent_version = $2,
				liveness_expires_at = now() + make_interval(secs => $3), last_heartbeat_at = now(), clock_skew_ms = $4,
				updated_at = now()
			FROM old WHERE n.id = old.id RETURNING n.session_epoch, old.connectivity, n.conditions`,
			c.a.nodeID, f.AgentVersion, c.s.agentLease().Seconds(), skew.Milliseconds()).Scan(&epoch, &prev, &conds)
		if errors.Is(err, pgx.ErrNoRows) {
			return nodeNotFound(c.a.nodeID)
		}
		if err != nil {
			return err
		}
		if err := connectivityChanged(ctx, tx, c.a.nodeID, prev, "connected", epoch); err != nil {
			return err
		}
		if err := setLivenessConditions(ctx, tx, c.a.nodeID, conds, skew); err != nil {
			return err
		}
		err = tx.QueryRow(ctx, `SELECT digest FROM node_inventories WHERE node_id = $1 ORDER BY seq DESC LIMIT 1`,
			c.a.nodeID).Scan(&digest)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		return err
	})
	if err != nil {
		return err
	}
	c.a.mu.Lock()
	c.a.epoch = epoch
	c.a.mu.Unlock()
	// Older sessions of the node here end now; those of other processes
	// at their next write.
	for _, o := range c.s.agentsOf(c.a.nodeID) {
		if o != c.a && o.getEpoch() < epoch {
			o.cancel(errSuperseded)
		}
	}
	c.lastSent = max(f.LastExecutedSeq, 0)
	if err := c.send(protocol.Welcome{Type: protocol.FrameWelcome, NodeID: c.a.nodeID, Epoch: epoch,
		HeartbeatSeconds: int(math.Ceil(c.s.agentHeartbeat().Seconds())),
		LeaseSeconds:     int(math.Ceil(c.s.agentLease().Seconds())), InventoryDigest: digest}); err != nil {
		return err
	}
	c.log.Info("agent session started", "epoch", epoch, "agentVersion", f.AgentVersion, "clockSkewMs", skew.Milliseconds())
	if err := c.sendSpec(ctx); err != nil {
		return err
	}
	return c.deliver(ctx)
}

// deliver sends the node's pending commands after the last one sent (and
// cancel frames for delivered ones cancelled since), marking them
// delivered, in the session's epoch.
func (c *sessionConn) deliver(ctx context.Context) error {
	c.lastPass = time.Now()
	for {
		var cmds []store.NodeCommand
		var cancels []int64
		err := c.s.inFencedTx(ctx, c.a.nodeID, c.a.getEpoch(), func(tx store.Tx) (err error) {
			if cmds, err = store.PendingNodeCommands(ctx, tx, c.a.nodeID, c.lastSent, agentCommandBatch); err != nil {
				return err
			}
			seqs := make([]int64, len(cmds))
			for i, cmd := range cmds {
				seqs[i] = cmd.Seq
			}
			if err := store.MarkNodeCommandsDelivered(ctx, tx, c.a.nodeID, seqs); err != nil {
				return err
			}
			cancels, err = store.CancelRequestedNodeCommands(ctx, tx, c.a.nodeID)
			return err
		})
		if err != nil {
			return err
		}
		for _, cmd := range cmds {
			f := protocol.Command{Type: protocol.FrameCommand, Seq: cmd.Seq, ID: cmd.ID, Kind: protocol.CommandKind(cmd.Kind),
				Args: cmd.Args}
			if len(f.Args) == 0 {
				f.Args = json.RawMessage(`{}`)
			}
			if cmd.NotBefore != nil {
				f.NotBefore = cmd.NotBefore.UnixMilli()
			}
			if cmd.NotAfter != nil {
				f.NotAfter = cmd.NotAfter.UnixMilli()
			}
			if cmd.MinGeneration != nil {
				f.MinGeneration = *cmd.MinGeneration
			}
			if err := c.send(f); err != nil {
				return err
			}
			c.lastSent = max(c.lastSent, cmd.Seq)
		}
		for _, seq := range cancels {
			if c.cancelled[seq] {
				continue
			}
			if err := c.send(protocol.Cancel{Type: protocol.FrameCancel, Seq: seq}); err != nil {
				return err
			}
			if c.cancelled == nil {
				c.cancelled = map[int64]bool{}
			}
			c.cancelled[seq] = true
		}
		if len(cmds) < agentCommandBatch {
			return nil
		}
	}
}

// inFencedTx runs fn in a transaction that holds the node in the session's
// epoch; errSuperseded when a newer session took it (or the node is gone).
func (s *Server) inFencedTx(ctx context.Context, nodeID string, epoch int64, fn func(store.Tx) error) error {
	return s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM nodes WHERE id = $1 AND session_epoch = $2 AND deleted_at IS NULL FOR UPDATE`,
			nodeID, epoch).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return errSuperseded
		}
		if err != nil {
			return err
		}
		return fn(tx)
	})
}

// agentHeartbeatFrame renews the liveness lease in the session's epoch,
// brings the node back to connected and checks the identity again. It
// answers the node's NodeSpec generation.
func (s *Server) agentHeartbeatFrame(ctx context.Context, a *agentSession, epoch, clock int64) (generation int64, err error) {
	skew := time.Duration(clock-time.Now().UnixMilli()) * time.Millisecond
	err = s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		// A heartbeat is soft state: one lost to a crash only makes the
		// lease look older until the next. Not waiting for its WAL flush
		// halves what thousands of them cost PostgreSQL.
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		var prev string
		var conds []byte
		err := tx.QueryRow(ctx, `WITH old AS (SELECT id, connectivity FROM nodes
				WHERE id = $1 AND session_epoch = $2 AND deleted_at IS NULL FOR UPDATE)
			UPDATE nodes n SET liveness_expires_at = now() + make_interval(secs => $3), last_heartbeat_at = now(),
				clock_skew_ms = $4, connectivity = 'connected',
				updated_at = CASE WHEN old.connectivity <> 'connected' THEN now() ELSE n.updated_at END
			FROM old WHERE n.id = old.id RETURNING old.connectivity, n.conditions, n.generation`,
			a.nodeID, epoch, s.agentLease().Seconds(), skew.Milliseconds()).Scan(&prev, &conds, &generation)
		if errors.Is(err, pgx.ErrNoRows) {
			return errSuperseded
		}
		if err != nil {
			return err
		}
		ok, err := store.NodeIdentityValid(ctx, tx, a.nodeID, a.serial)
		if err != nil {
			return err
		}
		if !ok {
			return errRevoked
		}
		if err := connectivityChanged(ctx, tx, a.nodeID, prev, "connected", epoch); err != nil {
			return err
		}
		return setLivenessConditions(ctx, tx, a.nodeID, conds, skew)
	})
	return generation, err
}

// endAgentSession marks the node disconnected when the ended session still
// holds it.
func (s *Server) endAgentSession(ctx context.Context, nodeID string, epoch int64) error {
	return s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		var prev string
		err := tx.QueryRow(ctx, `WITH old AS (SELECT id, connectivity FROM nodes
				WHERE id = $1 AND session_epoch = $2 AND connectivity = 'connected' FOR UPDATE)
			UPDATE nodes n SET connectivity = 'disconnected', updated_at = now()
			FROM old WHERE n.id = old.id RETURNING old.connectivity`, nodeID, epoch).Scan(&prev)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		return connectivityChanged(ctx, tx, nodeID, prev, "disconnected", epoch)
	})
}

// connectivityChanged writes a ConnectivityChanged event when from ≠ to.
func connectivityChanged(ctx context.Context, tx store.Tx, nodeID, from, to string, epoch int64) error {
	if from == to {
		return nil
	}
	details := map[string]any{"from": from, "to": to}
	if epoch > 0 {
		details["epoch"] = epoch
	}
	return addNodeEvent(ctx, tx, nodeID, EventConnectivity, "connectivity "+from+" → "+to, details)
}

// setLivenessConditions clears NodeUnreachable (the node is heard from) and
// raises or clears ClockSkew for skew, writing the node's conditions and
// an event per change only when something changed.
func setLivenessConditions(ctx context.Context, tx store.Tx, nodeID string, raw []byte, skew time.Duration) error {
	var conds []NodeCondition
	if err := json.Unmarshal(raw, &conds); err != nil {
		return fmt.Errorf("node %s conditions: %w", nodeID, err)
	}
	changed := false
	has := func(typ string) bool {
		return slices.ContainsFunc(conds, func(c NodeCondition) bool { return c.Type == typ && c.Device == "" })
	}
	drop := func(typ string) error {
		if !has(typ) {
			return nil
		}
		conds = slices.DeleteFunc(conds, func(c NodeCondition) bool { return c.Type == typ && c.Device == "" })
		changed = true
		return addNodeEvent(ctx, tx, nodeID, EventConditionClear, typ+" cleared", map[string]any{"type": typ})
	}
	if err := drop(CondNodeUnreachable); err != nil {
		return err
	}
	if skew > MaxClockSkew || skew < -MaxClockSkew {
		if !has(CondClockSkew) {
			reason, dir := "AgentClockAhead", "ahead of"
			if skew < 0 {
				reason, dir = "AgentClockBehind", "behind"
			}
			msg := fmt.Sprintf("the agent's clock is %s %s the server's", skew.Abs().Round(time.Millisecond), dir)
			conds = append(conds, NodeCondition{Type: CondClockSkew, Status: "True", Reason: reason, Message: msg,
				Since: time.Now().UnixMilli()})
			changed = true
			if err := addNodeEvent(ctx, tx, nodeID, EventConditionRaised, CondClockSkew+": "+msg,
				map[string]any{"type": CondClockSkew, "reason": reason, "skewMs": skew.Milliseconds()}); err != nil {
				return err
			}
		}
	} else if err := drop(CondClockSkew); err != nil {
		return err
	}
	if !changed {
		return nil
	}
	if conds == nil {
		conds = []NodeCondition{}
	}
	out, err := json.Marshal(conds)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE nodes SET conditions = $2, updated_at = now() WHERE id = $1`, nodeID, string(out))
	return err
}

package agentgateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// The node session (docs/agent-protocol.md, "The session"): one full-duplex
// HTTP/2 request per node on the agent listener, authenticated by the node's
// client certificate. Each session takes the node with a new fencing epoch
// (store/nodes.StartSession); every later write of the session is
// conditional on it, so of two sessions for one node only the newer writes,
// and the older ends at its next write.

// Limits of a session.
const (
	agentCommandBatch = 100 // commands read per delivery pass
	// agentRedeliverEvery is how often a heartbeat also looks for pending
	// commands no notice announced (a notBefore reached).
	agentRedeliverEvery = 30 * time.Second
)

// SessionHandler serves the agent listener: POST /agent/v1/session and
// the tunnels' dial-back, POST /agent/v1/tunnels/<id>.
func (g *Gateway) SessionHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.SessionPath, g.handleSession)
	mux.HandleFunc("POST "+protocol.TunnelPath+"{tunnelId}", g.handleTunnel)
	mux.HandleFunc("GET "+protocol.InstanceImagePath, g.handleInstanceImage)
	mux.HandleFunc("GET "+protocol.ReleaseArtifactPath, g.handleReleaseArtifact)
	mux.HandleFunc("GET "+protocol.InstanceUserDataPath, g.handleInstanceUserData)
	mux.HandleFunc("GET "+protocol.InstanceEnvPath, g.handleInstanceEnv)
	mux.HandleFunc("GET "+protocol.SandboxSnapshotPath, g.handleSnapshotGet)
	mux.HandleFunc("PUT "+protocol.SandboxSnapshotPath, g.handleSnapshotPut)
	mux.HandleFunc("POST "+protocol.SandboxSnapshotFailurePath, g.handleSnapshotFailure)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		agentError(w, http.StatusNotFound, "NOT_FOUND", "no such route")
	})
	return mux
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
	mu     sync.Mutex
	epoch  int64
	// notices are the notice kinds not yet served (noticeIdentity,
	// noticeCommands, noticeSpec); conn is the session's stream once it is served.
	notices atomic.Uint32
	conn    atomic.Pointer[sessionConn]
}

// Notice kinds: check the identity again (a revocation), read the node's
// pending commands, send its NodeSpec when its generation moved.
const (
	noticeIdentity uint32 = 1 << iota
	noticeCommands
	noticeSpec
)

// notify asks the session to serve a notice. A session has no goroutine
// waiting for notices: the first notice of a quiet session starts one,
// which serves every notice that comes until none is left.
func (a *agentSession) notify(kind uint32) {
	if a.notices.Or(kind) == 0 {
		go a.serveNotices()
	}
}

func (a *agentSession) serveNotices() {
	c := a.conn.Load()
	if c == nil {
		return // the stream serves what is pending once it is up
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for !c.closed {
		kinds := a.notices.Swap(0)
		if kinds == 0 {
			return
		}
		if err := c.notice(kinds); err != nil {
			a.cancel(err)
			return
		}
	}
}

func (a *agentSession) getEpoch() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.epoch
}

// hub is the process's registry of live sessions by node id, and the
// one LISTEN connection (revocations and commands) that fans out to them.
// The listener runs while at least one session is live.
type hub struct {
	mu       sync.Mutex
	sessions map[string]map[*agentSession]struct{}
	live     int
	stop     context.CancelFunc
}

// Session endings, as the cause of a session's context.
var (
	errSuperseded = domain.ErrSuperseded
	errRevoked    = domain.ErrRevoked
	errLeaseLost  = errors.New("no frame within the liveness lease")
	errShutdown   = errors.New("the server is shutting down")
)

func (g *Gateway) registerAgent(a *agentSession) {
	h := &g.hub
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
		go g.listenAgents(ctx)
	}
}

func (g *Gateway) unregisterAgent(a *agentSession) {
	h := &g.hub
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
		if g.beatConn != nil {
			go g.beatConn.close()
		}
	}
}

// CloseSessions ends every live session of this process (each marks
// its node disconnected), e.g. from http.Server.RegisterOnShutdown: a
// session stream is never idle, so a graceful shutdown would otherwise wait
// for it until its deadline.
func (g *Gateway) CloseSessions() {
	for _, a := range g.agentsOf("") {
		a.cancel(errShutdown)
	}
}

// agentsOf answers the node's live sessions here (all nodes' for "").
func (g *Gateway) agentsOf(nodeID string) []*agentSession {
	h := &g.hub
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
func (g *Gateway) listenAgents(ctx context.Context) {
	// 100 ms doubling up to 10 s, no jitter: one listener per process.
	retry := &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, Multiplier: 2,
		MaxInterval: 10 * time.Second}
	retry.Reset()
	for ctx.Err() == nil {
		err := g.listenAgentsOnce(ctx, retry.Reset)
		if ctx.Err() != nil {
			return
		}
		wait := retry.NextBackOff()
		g.deps.Logger.Warn("agent sessions: listen failed", "error", err, "retryIn", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

func (g *Gateway) listenAgentsOnce(ctx context.Context, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, g.deps.Store.Pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	for _, ch := range []string{domain.NodeIdentityRevokedChannel, store.NodeCommandsChannel, domain.NodeSpecChannel} {
		if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{ch}.Sanitize()); err != nil {
			return err
		}
	}
	connected()
	for _, a := range g.agentsOf("") {
		a.notify(noticeIdentity | noticeCommands | noticeSpec)
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		for _, a := range g.agentsOf(n.Payload) {
			switch n.Channel {
			case domain.NodeIdentityRevokedChannel:
				a.notify(noticeIdentity)
			case store.NodeCommandsChannel:
				a.notify(noticeCommands)
			case domain.NodeSpecChannel:
				a.notify(noticeSpec)
			}
		}
	}
}

// handleSession is POST /agent/v1/session.
func (g *Gateway) handleSession(w http.ResponseWriter, r *http.Request) {
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
	a := &agentSession{nodeID: nodeID, serial: nodeca.Serial(cert.SerialNumber)}
	log := g.deps.Logger.With("node", nodeID, "serial", a.serial)
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	a.cancel = cancel
	// Registered before the identity check: a revocation committed after
	// the check reaches the session through the hub.
	g.registerAgent(a)
	defer g.unregisterAgent(a)
	checked := time.Now()
	ok, err := domain.NodeIdentityValid(ctx, g.deps.Store.Pool, nodeID, a.serial)
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
	sess := &sessionConn{g: g, a: a, w: w, rc: rc, log: log, ctx: ctx, identityAt: checked}
	cause := sess.run(ctx, r.Body)
	log.Info("agent session ended", "epoch", a.getEpoch(), "cause", cause)
}

// sessionConn is the state of one session's stream. The handler's
// goroutine reads the frames and serves each under mu; a notice is served
// under mu by a goroutine of its own (agentSession.notify), so a session
// holds no goroutine of its own while it waits.
type sessionConn struct {
	g   *Gateway
	a   *agentSession
	w   http.ResponseWriter
	rc  *http.ResponseController
	log *slog.Logger
	// ctx is the session's: notices are served in it.
	ctx context.Context
	mu  sync.Mutex
	// closed: the stream ended; no notice is served any more.
	closed bool
	enc    *json.Encoder
	// lastSent is the highest command seq sent on this stream; lastSpec
	// the highest NodeSpec generation.
	lastSent, lastSpec int64
	// cancelled are seqs a cancel frame was sent for.
	cancelled map[int64]bool
	// lastPass is when deliver last read the pending commands.
	lastPass time.Time
	// identityAt is when the identity was last found valid.
	identityAt time.Time
}

func (c *sessionConn) send(v any) error {
	if c.enc == nil {
		c.enc = json.NewEncoder(c.w)
	}
	// An agent that stops reading must not hold the session forever; the
	// deadline is cleared once the frame is out, because HTTP/2 resets the
	// stream when a write deadline passes even with no write pending.
	_ = c.rc.SetWriteDeadline(time.Now().Add(c.g.deps.AgentLease))
	if err := c.enc.Encode(v); err != nil {
		return err
	}
	if err := c.rc.Flush(); err != nil {
		return err
	}
	return c.rc.SetWriteDeadline(time.Time{})
}

// run serves the stream until it ends and answers why: the session's
// cause when its context ended, errLeaseLost when no frame came within the
// lease, else the read's or a frame's error.
func (c *sessionConn) run(ctx context.Context, body io.Reader) (cause error) {
	// A session ended from elsewhere (superseded, revoked, shut down)
	// unblocks its read by a read deadline in the past. The response
	// controller must not be used once the handler returned, so run does
	// not return while that is under way.
	var unblock sync.Mutex
	returned := false
	stop := context.AfterFunc(ctx, func() {
		unblock.Lock()
		defer unblock.Unlock()
		if !returned {
			_ = c.rc.SetReadDeadline(time.Unix(1, 0))
		}
	})
	defer func() {
		stop()
		unblock.Lock()
		returned = true
		unblock.Unlock()
	}()
	defer func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		if epoch := c.a.getEpoch(); epoch > 0 {
			endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := c.g.endSession(endCtx, c.a.nodeID, epoch); err != nil {
				c.log.Error("agent session: disconnect", "error", err)
			}
		}
	}()
	c.a.conn.Store(c)
	if c.a.notices.Load() != 0 {
		go c.a.serveNotices() // notices that came before the stream was up
	}

	lease := c.g.deps.AgentLease
	rd := frameReader{r: bufio.NewReaderSize(body, 512)}
	for {
		// The liveness lease is the read's deadline.
		_ = c.rc.SetReadDeadline(time.Now().Add(lease))
		line, err := rd.next()
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return errLeaseLost
		}
		if err != nil {
			return err
		}
		f, err := protocol.DecodeAgentFrame(line)
		if err != nil {
			return fmt.Errorf("bad frame: %w", err)
		}
		c.mu.Lock()
		err = c.frame(ctx, f)
		c.mu.Unlock()
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if err != nil {
			return err
		}
	}
}

// notice serves the notice kinds; the caller holds c.mu.
func (c *sessionConn) notice(kinds uint32) error {
	if kinds&noticeIdentity != 0 {
		if err := c.checkIdentity(c.ctx); err != nil {
			return err
		}
	}
	if kinds&noticeSpec != 0 && c.a.getEpoch() > 0 {
		if err := c.sendSpec(c.ctx); err != nil {
			return err
		}
	}
	if kinds&noticeCommands != 0 && c.a.getEpoch() > 0 {
		return c.deliver(c.ctx)
	}
	return nil
}

// frameReader splits the agent's stream into lines of at most
// protocol.MaxFrame bytes. Its buffer is small (a heartbeat is a few dozen
// bytes); a longer line (an inventory) is gathered in a slice that is
// dropped once the frame is decoded, so no session keeps a large buffer.
type frameReader struct {
	r    *bufio.Reader
	long []byte
}

// next answers the next line without its line ending, valid until the
// next call.
func (fr *frameReader) next() ([]byte, error) {
	fr.long = nil
	for {
		part, err := fr.r.ReadSlice('\n')
		if err == nil || (errors.Is(err, io.EOF) && len(part)+len(fr.long) > 0) {
			line := part
			if fr.long != nil {
				line = append(fr.long, part...)
			}
			line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
			if len(line) > protocol.MaxFrame {
				return nil, bufio.ErrTooLong
			}
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
		if len(fr.long)+len(part) > protocol.MaxFrame {
			return nil, bufio.ErrTooLong
		}
		fr.long = append(fr.long, part...)
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
		generation, err := c.heartbeatFrame(ctx, epoch, f.Clock)
		if errors.Is(err, errHeartbeatNotRecorded) {
			// The database refused the batch: this heartbeat renewed
			// nothing and is not counted as handled. The session stays;
			// the next heartbeat tries again, and a lease that lapses
			// meanwhile is the sweep's to judge.
			c.log.Warn("agent session: heartbeat not recorded", "error", err)
			return nil
		}
		if err != nil {
			return err
		}
		c.g.heartbeat.Observe(time.Since(hbStart).Seconds())
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
		err := c.g.inFencedTx(ctx, c.a.nodeID, epoch, func(tx store.Tx) error {
			_, err := domain.Ingest(ctx, tx, c.g.types, c.a.nodeID, f.Document)
			return err
		})
		if err != nil && !errors.Is(err, errSuperseded) && ctx.Err() == nil {
			// A document the server refuses would be refused again after
			// a reconnect: log it and go on.
			c.log.Warn("agent session: inventory refused", "error", err)
			return nil
		}
		return err
	case protocol.Instances:
		return c.instancesFrame(ctx, epoch, f)
	case protocol.Result:
		err := c.g.inFencedTx(ctx, c.a.nodeID, epoch, func(tx store.Tx) error {
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

// hello takes the node with a new epoch and answers welcome, the spec and
// the pending commands. Taking the node, reading its spec and the first
// pass of its commands are one transaction: a ramp of thousands of
// sessions costs the database one transaction per hello.
func (c *sessionConn) hello(ctx context.Context, f protocol.Hello) error {
	skew := time.Duration(f.Clock-time.Now().UnixMilli()) * time.Millisecond
	c.lastSent = max(f.LastExecutedSeq, 0)
	var w domain.Welcome
	var generation int64
	var spec nodespec.Spec
	var pass commandPass
	err := c.g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		if w, err = domain.StartSession(ctx, tx, c.a.nodeID, f.AgentVersion, c.g.deps.AgentLease, skew); err != nil {
			return err
		}
		if generation, spec, err = domain.Spec(ctx, tx, c.a.nodeID); err != nil {
			return err
		}
		pass, err = c.readPass(ctx, tx)
		return err
	})
	if err != nil {
		return err
	}
	epoch := w.Epoch
	c.a.mu.Lock()
	c.a.epoch = epoch
	c.a.mu.Unlock()
	// Older sessions of the node here end now; those of other processes
	// at their next write.
	for _, o := range c.g.agentsOf(c.a.nodeID) {
		if o != c.a && o.getEpoch() < epoch {
			o.cancel(errSuperseded)
		}
	}
	if err := c.send(protocol.Welcome{Type: protocol.FrameWelcome, NodeID: c.a.nodeID, Epoch: epoch,
		HeartbeatSeconds: int(math.Ceil(c.g.deps.AgentHeartbeat.Seconds())),
		LeaseSeconds:     int(math.Ceil(c.g.deps.AgentLease.Seconds())), InventoryDigest: w.InventoryDigest}); err != nil {
		return err
	}
	c.log.Info("agent session started", "epoch", epoch, "agentVersion", f.AgentVersion, "clockSkewMs", skew.Milliseconds())
	if generation > c.lastSpec {
		if err := c.send(protocol.Spec{Type: protocol.FrameSpec, Generation: generation, Spec: spec}); err != nil {
			return err
		}
		c.lastSpec = generation
	}
	c.lastPass = time.Now()
	if err := c.sendPass(pass); err != nil || len(pass.cmds) < agentCommandBatch {
		return err
	}
	return c.deliver(ctx)
}

// commandPass is what one delivery pass read: pending commands after the
// last one sent (marked delivered) and delivered ones cancelled since.
type commandPass struct {
	cmds    []store.NodeCommand
	cancels []int64
}

// readPass reads one delivery pass in tx, which holds the node in the
// session's epoch.
func (c *sessionConn) readPass(ctx context.Context, tx store.Tx) (p commandPass, err error) {
	if p.cmds, err = store.PendingNodeCommands(ctx, tx, c.a.nodeID, c.lastSent, agentCommandBatch); err != nil {
		return p, err
	}
	seqs := make([]int64, len(p.cmds))
	for i, cmd := range p.cmds {
		seqs[i] = cmd.Seq
	}
	if err := store.MarkNodeCommandsDelivered(ctx, tx, c.a.nodeID, seqs); err != nil {
		return p, err
	}
	p.cancels, err = store.CancelRequestedNodeCommands(ctx, tx, c.a.nodeID)
	return p, err
}

// sendPass sends a pass's commands and the cancel frames not sent before.
func (c *sessionConn) sendPass(p commandPass) error {
	for _, cmd := range p.cmds {
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
	for _, seq := range p.cancels {
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
	return nil
}

// deliver sends the node's pending commands after the last one sent (and
// cancel frames for delivered ones cancelled since), marking them
// delivered, in the session's epoch.
func (c *sessionConn) deliver(ctx context.Context) error {
	c.lastPass = time.Now()
	for {
		var pass commandPass
		err := c.g.inFencedTx(ctx, c.a.nodeID, c.a.getEpoch(), func(tx store.Tx) (err error) {
			pass, err = c.readPass(ctx, tx)
			return err
		})
		if err != nil {
			return err
		}
		if err := c.sendPass(pass); err != nil {
			return err
		}
		if len(pass.cmds) < agentCommandBatch {
			return nil
		}
	}
}

// inFencedTx runs fn in a transaction that holds the node in the session's
// epoch; errSuperseded when a newer session took it (or the node is gone).
func (g *Gateway) inFencedTx(ctx context.Context, nodeID string, epoch int64, fn func(store.Tx) error) error {
	return g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if err := domain.HoldSession(ctx, tx, nodeID, epoch); err != nil {
			return err
		}
		return fn(tx)
	})
}

// heartbeatFrame renews the liveness lease in the session's epoch through
// the process's batcher, brings the node's row back in step when the
// batch says it is not (connectivity, liveness conditions), and has the
// batch check the identity again when the last check is older than
// Deps.IdentityRecheck (a revocation ends the session at once through its
// notice). It answers the node's NodeSpec generation.
func (c *sessionConn) heartbeatFrame(ctx context.Context, epoch, clock int64) (generation int64, err error) {
	skew := time.Duration(clock-time.Now().UnixMilli()) * time.Millisecond
	beat := domain.Beat{NodeID: c.a.nodeID, Epoch: epoch, Skew: skew}
	recheck := time.Since(c.identityAt) >= c.g.deps.IdentityRecheck
	if recheck {
		beat.Serial = c.a.serial
	}
	res, err := c.g.beats.submit(ctx, beat)
	if err != nil {
		return 0, err
	}
	if !res.Recorded {
		return 0, errSuperseded
	}
	if !res.IdentityValid {
		return 0, errRevoked
	}
	if recheck {
		c.identityAt = time.Now()
	}
	if res.NeedsRepair {
		if err := c.g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			return domain.RepairLiveness(ctx, tx, c.a.nodeID, epoch, skew)
		}); err != nil {
			return 0, err
		}
	}
	return res.Generation, nil
}

// checkIdentity ends the session (errRevoked) when its certificate is no
// longer a valid identity of the node.
func (c *sessionConn) checkIdentity(ctx context.Context) error {
	ok, err := domain.NodeIdentityValid(ctx, c.g.deps.Store.Pool, c.a.nodeID, c.a.serial)
	if err != nil {
		return err
	}
	if !ok {
		return errRevoked
	}
	c.identityAt = time.Now()
	return nil
}

// endSession marks the node disconnected when the ended session still
// holds it.
func (g *Gateway) endSession(ctx context.Context, nodeID string, epoch int64) error {
	return g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return domain.EndSession(ctx, tx, nodeID, epoch)
	})
}

// count is the number of live sessions.
func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.live
}

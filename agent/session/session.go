// Package session is the agent's side of the node session
// (docs/agent-protocol.md, "The session"): one full-duplex HTTP/2 request to
// the agent listener over mutual TLS, carrying hello, heartbeats, inventory
// and command results up and welcome, commands and cancels down, each a
// JSON object on its own line. Run keeps a session open, reconnecting with
// capped exponential backoff and jitter, until its context ends.
package session

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/better-compute/better-compute/agent/commands"
	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core/inventory"
)

// Path is the session endpoint, under the identity's agent endpoint.
const Path = protocol.SessionPath

// Defaults of Options.
const (
	DefaultMinBackoff = time.Second
	// DefaultInventoryEvery is how often a session collects the inventory
	// again to send what changed.
	DefaultInventoryEvery = 5 * time.Minute
	DefaultMaxBackoff     = time.Minute
	// defaultHeartbeat applies when welcome names no period.
	defaultHeartbeat = 10 * time.Second
)

// Options configures Run.
type Options struct {
	// Identity is the node's certificate, the node CA and the endpoint.
	Identity join.Identity
	// StateDir is the agent's state directory (the executor keeps its
	// last executed seq there).
	StateDir string
	// Executor runs commands one at a time; nil answers every command
	// failed. When its RefreshInventory is nil, Run sets it to send a
	// fresh inventory frame on the live session.
	Executor *commands.Executor
	// Inventory collects the node's inventory; nil sends none. It is
	// collected at each session's start and every InventoryEvery
	// (DefaultInventoryEvery), and sent when its digest changed.
	InventoryEvery time.Duration
	// Inventory collects the node's inventory; nil sends none.
	Inventory func(ctx context.Context) (*inventory.NodeInventory, error)
	// AgentVersion goes in hello, e.g. "bcd/0.1.0".
	AgentVersion string
	// HTTPClient dials the agent listener; nil builds an HTTP/2 client
	// from the identity (TLS 1.3, the node certificate, the node CA).
	HTTPClient *http.Client
	Logger     *slog.Logger
	// MinBackoff and MaxBackoff bound the wait between attempts
	// (DefaultMinBackoff, DefaultMaxBackoff); tests shrink them.
	MinBackoff, MaxBackoff time.Duration
	// Now is the agent's clock (time.Now); tests skew it.
	Now func() time.Time
	// NodeSpec keeps the NodeSpec the agent converged on; spec frames are
	// applied to it and answered with an observed frame. Nil ignores them.
	NodeSpec *nodespec.Store
	// OnSpec, when set, is called with each spec applied (its sections
	// kept by other parts of the agent: the instance runtime, sshd's
	// trust); it must not block the session: converge in the background.
	OnSpec func(generation int64, spec nodespec.Spec)
	// OnSession, when set, runs for each welcomed session with a send of
	// agent frames on it (an instances report) until ctx ends.
	OnSession func(ctx context.Context, send func(frame any) error)
	// OnTunnel, when set, handles a tunnel frame (agent/tunnel): dial the
	// target, then open protocol.TunnelPath with the session's client.
	OnTunnel func(ctx context.Context, client *http.Client, t protocol.Tunnel)
}

// StatusError is a session the listener refused: 401 and 403 mean the
// certificate is unknown, expired or revoked.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("session refused: HTTP %d: %s", e.Code, strings.TrimSpace(e.Body))
}

// inventoryFrame is an inventory frame carrying inv.
func inventoryFrame(inv *inventory.NodeInventory) (protocol.Inventory, error) {
	doc, err := json.Marshal(inv)
	if err != nil {
		return protocol.Inventory{}, fmt.Errorf("inventory frame: %w", err)
	}
	return protocol.Inventory{Type: protocol.FrameInventory, Document: doc}, nil
}

// sendInventory sends inv in an inventory frame.
func (c *conn) sendInventory(inv *inventory.NodeInventory) error {
	f, err := inventoryFrame(inv)
	if err != nil {
		return err
	}
	return c.send(f)
}

// Run holds the node's session until ctx ends (it then answers nil),
// reconnecting after every failure with capped exponential backoff plus
// jitter. A refused session (401, 403: the identity is revoked) is logged
// and retried the same way.
func Run(ctx context.Context, o Options) error {
	if o.Identity.AgentEndpoint == "" {
		return errors.New("session: the identity names no agent endpoint")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.InventoryEvery <= 0 {
		o.InventoryEvery = DefaultInventoryEvery
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(DefaultMaxBackoff, o.MinBackoff)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.HTTPClient == nil {
		o.HTTPClient = NewHTTPClient(o.Identity)
	}
	r := &runner{o: o, log: o.Logger.With("node", o.Identity.NodeID), q: newQueue(0)}
	if o.Executor != nil {
		if o.Executor.RefreshInventory == nil {
			o.Executor.RefreshInventory = r.refreshInventory
		}
		last, err := o.Executor.LastExecuted()
		if err != nil {
			return fmt.Errorf("session: last executed seq: %w", err)
		}
		r.q.raise(last)
	}
	// One executor across sessions: a dropped connection neither stops a
	// running command nor holds up the reconnect.
	execDone := make(chan struct{})
	go func() {
		defer close(execDone)
		r.execute(ctx)
	}()
	defer func() { <-execDone }()
	// Waits double from MinBackoff up to MaxBackoff, each drawn from
	// [cap/2, cap]: the library's ±1/3 around three quarters of the cap.
	retry := &backoff.ExponentialBackOff{InitialInterval: o.MinBackoff * 3 / 4, RandomizationFactor: 1.0 / 3,
		Multiplier: 2, MaxInterval: o.MaxBackoff * 3 / 4}
	retry.Reset()
	for {
		welcomed, err := r.once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if welcomed {
			retry.Reset()
		}
		wait := retry.NextBackOff()
		var se *StatusError
		switch {
		case errors.As(err, &se) && (se.Code == http.StatusUnauthorized || se.Code == http.StatusForbidden):
			r.log.Error("session refused: the node identity is revoked, expired or unknown; retrying", "error", err)
		default:
			r.log.Warn("session ended; reconnecting", "error", err, "in", wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// NewHTTPClient is an HTTP/2 client presenting the identity's certificate
// and trusting only the node CA.
func NewHTTPClient(id join.Identity) *http.Client {
	tlsConf := id.TLSConfig()
	tlsConf.NextProtos = []string{"h2"}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     tlsConf,
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 15 * time.Second,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// runner is Run's state across sessions.
type runner struct {
	o   Options
	log *slog.Logger
	q   *queue
	mu  sync.Mutex
	cur *conn // the live session
	// unsent are results no session took yet: sent after the next welcome.
	unsent []protocol.Result
	// sent are the latest results a session took (at most resentResults):
	// a written frame is not a recorded one (the server may die before it
	// reads it, and never redelivers a command at or below the hello's
	// lastExecutedSeq), so each new session gets them again. Recording a
	// result is idempotent on the server.
	sent []protocol.Result
}

// resentResults bounds the results sent again after every welcome.
const resentResults = 64

// result sends a command's result on the live session, or keeps it for
// the next.
func (r *runner) result(f protocol.Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil && len(r.unsent) == 0 {
		if err := r.cur.send(f); err == nil {
			r.keepSent(f)
			return
		}
	}
	r.unsent = append(r.unsent, f)
}

// keepSent remembers f as sent, dropping the oldest beyond resentResults.
func (r *runner) keepSent(f protocol.Result) {
	r.sent = append(r.sent, f)
	if over := len(r.sent) - resentResults; over > 0 {
		r.sent = append(r.sent[:0], r.sent[over:]...)
	}
}

// attach makes c the live session and sends it the latest results sent
// before, then the results kept.
func (r *runner) attach(c *conn) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cur = c
	for _, f := range r.sent {
		if err := c.send(f); err != nil {
			return err
		}
	}
	for len(r.unsent) > 0 {
		if err := c.send(r.unsent[0]); err != nil {
			return err
		}
		r.keepSent(r.unsent[0])
		r.unsent = r.unsent[1:]
	}
	return nil
}

// refreshInventory is the executor's inventory.refresh: a fresh inventory
// frame on the live session.
func (r *runner) refreshInventory(ctx context.Context) error {
	r.mu.Lock()
	c := r.cur
	r.mu.Unlock()
	if c == nil {
		return errors.New("no live session")
	}
	if r.o.Inventory == nil {
		return errors.New("no inventory source")
	}
	inv, err := r.o.Inventory(ctx)
	if err != nil {
		return err
	}
	return c.sendInventory(inv)
}

// conn is one session's stream.
type conn struct {
	mu  sync.Mutex
	enc *json.Encoder
	pw  *io.PipeWriter
}

func (c *conn) send(v any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.enc.Encode(v)
}

// once runs one session; welcomed says whether the server welcomed it.
func (r *runner) once(ctx context.Context) (welcomed bool, err error) {
	o := r.o
	var lastExecuted, observed int64
	if o.Executor != nil {
		if lastExecuted, err = o.Executor.LastExecuted(); err != nil {
			return false, fmt.Errorf("last executed seq: %w", err)
		}
		if o.Executor.ObservedGeneration != nil {
			observed = o.Executor.ObservedGeneration()
		}
	}
	var inv *inventory.NodeInventory
	var digest string
	if o.Inventory != nil {
		if inv, err = o.Inventory(ctx); err != nil {
			r.log.Warn("inventory: collect failed; the session goes on without it", "error", err)
			inv = nil
		} else if h, err := inventory.Hash(inv); err == nil {
			digest = h.Digest
		}
	}

	// The request outlives ctx by a moment: on ctx's end the agent closes
	// its side and lets the server end the stream.
	reqCtx, cancelReq := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReq()
	pr, pw := io.Pipe()
	c := &conn{enc: json.NewEncoder(pw), pw: pw}
	defer pw.Close()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, strings.TrimSuffix(o.Identity.AgentEndpoint, "/")+Path, pr)
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	stop := context.AfterFunc(ctx, cancelReq)
	resp, err := o.HTTPClient.Do(req)
	stop()
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return false, &StatusError{Code: resp.StatusCode, Body: string(body)}
	}
	if resp.ProtoMajor != 2 {
		return false, fmt.Errorf("the agent listener answered %s, not HTTP/2", resp.Proto)
	}

	// Hello goes out while the response is read: the pipe blocks until the
	// transport takes it.
	sessCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel(nil)
	go func() {
		<-sessCtx.Done()
		// Our side ends; the server ends its side, or the request is
		// reset after a moment.
		_ = pw.Close()
		t := time.AfterFunc(2*time.Second, cancelReq)
		<-reqCtx.Done()
		t.Stop()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.send(protocol.Hello{Type: protocol.FrameHello, AgentVersion: o.AgentVersion, LastExecutedSeq: lastExecuted,
			ObservedGeneration: observed, InventoryDigest: digest, Clock: o.Now().UnixMilli()}); err != nil {
			cancel(fmt.Errorf("send hello: %w", err))
		}
	}()

	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 4<<10), protocol.MaxFrame) // grows for a large frame
	var welcome protocol.Welcome
	if !sc.Scan() {
		return false, fmt.Errorf("no welcome: %w", scanErr(sc))
	}
	if err := json.Unmarshal(sc.Bytes(), &welcome); err != nil || welcome.Type != protocol.FrameWelcome {
		return false, fmt.Errorf("the first frame is not welcome: %q", sc.Text())
	}
	r.log.Info("session started", "epoch", welcome.Epoch)
	r.q.raise(lastExecuted)
	if err := r.attach(c); err != nil {
		cancel(fmt.Errorf("send results: %w", err))
	}
	defer func() {
		r.mu.Lock()
		if r.cur == c {
			r.cur = nil
		}
		r.mu.Unlock()
	}()

	if o.OnSession != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o.OnSession(sessCtx, c.send)
		}()
	}

	// Heartbeats.
	period := time.Duration(welcome.HeartbeatSeconds) * time.Second
	if period <= 0 {
		period = defaultHeartbeat
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		// A random phase keeps agents that connected together (after an
		// API restart, say) from beating together.
		select {
		case <-sessCtx.Done():
			return
		case <-time.After(rand.N(period)):
		}
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-sessCtx.Done():
				return
			case <-t.C:
				if err := c.send(protocol.Heartbeat{Type: protocol.FrameHeartbeat, Clock: o.Now().UnixMilli()}); err != nil {
					cancel(fmt.Errorf("send heartbeat: %w", err))
					return
				}
			}
		}
	}()

	// The inventory, when the server's differs, then again whenever a
	// section's hash changed since (collected every InventoryEvery).
	if o.Inventory != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := welcome.InventoryDigest
			if inv != nil && digest != sent {
				if err := c.sendInventory(inv); err != nil {
					cancel(fmt.Errorf("send inventory: %w", err))
					return
				}
				sent = digest
			}
			t := time.NewTicker(o.InventoryEvery)
			defer t.Stop()
			for {
				select {
				case <-sessCtx.Done():
					return
				case <-t.C:
				}
				now, err := o.Inventory(sessCtx)
				if err != nil {
					r.log.Warn("inventory: collect failed", "error", err)
					continue
				}
				h, err := inventory.Hash(now)
				if err != nil || h.Digest == sent {
					continue
				}
				if err := c.sendInventory(now); err != nil {
					cancel(fmt.Errorf("send inventory: %w", err))
					return
				}
				sent = h.Digest
			}
		}()
	}

	for sc.Scan() {
		frame, err := protocol.DecodeServerFrame(sc.Bytes())
		if err != nil {
			cancel(fmt.Errorf("bad frame: %w", err))
			break
		}
		switch f := frame.(type) {
		case protocol.Command:
			r.q.push(commands.Command{Seq: f.Seq, ID: f.ID, Kind: string(f.Kind), Args: f.Args, NotBefore: f.NotBefore,
				NotAfter: f.NotAfter, MinGeneration: f.MinGeneration})
		case protocol.Cancel:
			r.q.cancel(f.Seq)
		case protocol.Spec:
			if o.NodeSpec == nil {
				continue
			}
			g, err := o.NodeSpec.Apply(f.Generation, f.Spec)
			if err != nil {
				r.log.Error("session: applying the node spec", "generation", f.Generation, "error", err)
				continue
			}
			if o.OnSpec != nil && g == f.Generation {
				o.OnSpec(g, f.Spec)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := c.send(protocol.Observed{Type: protocol.FrameObserved, Generation: g}); err != nil {
					cancel(fmt.Errorf("send observed: %w", err))
				}
			}()
		case protocol.Tunnel:
			if o.OnTunnel == nil {
				r.log.Warn("session: a tunnel frame, but no tunnels are served", "tunnel", f.ID)
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				o.OnTunnel(sessCtx, o.HTTPClient, f)
			}()
		case protocol.Header:
			r.log.Warn("session: unknown frame", "type", f.Type)
		default:
			r.log.Warn("session: unexpected frame", "frame", fmt.Sprintf("%T", f))
		}
	}
	err = scanErr(sc)
	cancel(err)
	if cause := context.Cause(sessCtx); cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	return true, err
}

func scanErr(sc *bufio.Scanner) error {
	if err := sc.Err(); err != nil {
		return err
	}
	return io.EOF
}

// execute runs queued commands in order, across sessions, until ctx
// ends, and hands their results to the live session.
func (r *runner) execute(ctx context.Context) {
	for {
		cmd, cancelled, ok := r.q.next(ctx)
		if !ok {
			return
		}
		var res commands.Result
		switch {
		case cancelled:
			res = commands.Result{Seq: cmd.Seq, State: commands.Skipped, Error: "cancelled before it ran"}
		case r.o.Executor == nil:
			res = commands.Result{Seq: cmd.Seq, State: commands.Failed, Error: "this agent runs no commands"}
		default:
			// A cancel frame for the running command stops it (exec's
			// process group is killed).
			cmdCtx, stop := context.WithCancel(ctx)
			r.q.running(cmd.Seq, stop)
			res = r.o.Executor.Run(cmdCtx, cmd)
			r.q.running(0, nil)
			if cmdCtx.Err() != nil && ctx.Err() == nil {
				res.State, res.Error = commands.Failed, "cancelled while it ran"
			}
			stop()
		}
		r.result(protocol.Result{Type: protocol.FrameResult, Seq: cmd.Seq, State: protocol.CommandState(res.State), ExitCode: res.ExitCode,
			Stdout: res.Stdout, Stderr: res.Stderr, Error: res.Error, Truncated: res.Truncated})
	}
}

// queue holds a session's delivered commands in seq order; a seq at or
// below the last queued one (a redelivery) is dropped.
type queue struct {
	mu        sync.Mutex
	items     []commands.Command
	last      int64
	cancelled map[int64]bool
	wake      chan struct{}
	// current is the running command's seq, stop what stops it.
	current int64
	stop    context.CancelFunc
}

func newQueue(last int64) *queue {
	return &queue{last: last, cancelled: map[int64]bool{}, wake: make(chan struct{}, 1)}
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue) push(c commands.Command) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.Seq <= q.last {
		return
	}
	q.last = c.Seq
	q.items = append(q.items, c)
	q.signal()
}

// cancel marks seq cancelled: skipped if it has not started, stopped if
// it is running.
func (q *queue) cancel(seq int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.cancelled[seq] = true
	if seq == q.current && q.stop != nil {
		q.stop()
	}
}

// running records the command now running (0, nil: none).
func (q *queue) running(seq int64, stop context.CancelFunc) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.current, q.stop = seq, stop
}

// raise drops redeliveries at or below seq (the executor's last).
func (q *queue) raise(seq int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.last = max(q.last, seq)
}

func (q *queue) next(ctx context.Context) (commands.Command, bool, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			c := q.items[0]
			q.items = q.items[1:]
			cancelled := q.cancelled[c.Seq]
			q.mu.Unlock()
			return c, cancelled, true
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return commands.Command{}, false, false
		case <-q.wake:
		}
	}
}

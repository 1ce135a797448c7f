// Package tunnel is bcd's side of tunnels (docs/tunnels.md): on a tunnel
// frame it dials the target from the node, then opens the dial-back
// (POST protocol.TunnelPath<id>) on the agent listener with the session's
// mutual-TLS client, a new stream of the session's HTTP/2 connection, and
// splices the two full duplex until either ends. It is session.Options'
// OnTunnel.
package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
)

// DefaultDialTimeout bounds dialing a tunnel's target.
const DefaultDialTimeout = 10 * time.Second

// ErrorHeader carries why the agent could not open a tunnel.
const ErrorHeader = "X-Tunnel-Error"

// idPattern is a tunnel id (tun_ and a ULID), the one path segment the
// dial-back adds.
var idPattern = regexp.MustCompile(`^tun_[0-9a-z]{26}$`)

// Opener serves tunnel frames.
type Opener struct {
	// Endpoint is the agent listener ("https://host:port").
	Endpoint string
	// DialTimeout bounds the target's dial (DefaultDialTimeout).
	DialTimeout time.Duration
	// Dial dials the target (a net.Dialer's by default).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Execer runs exec tunnels' commands (nil: they are refused).
	Execer Execer
	Logger *slog.Logger
}

// Serve opens tunnel t and splices it until either end closes or ctx (the
// session's) ends. It is session.Options.OnTunnel.
func (o *Opener) Serve(ctx context.Context, client *http.Client, t protocol.Tunnel) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("tunnel", t.ID)
	if !idPattern.MatchString(t.ID) {
		log.Warn("tunnel: refused a frame with a malformed id")
		return
	}
	if t.Target == protocol.TunnelExec {
		o.serveExec(ctx, client, t, log)
		return
	}
	target, err := o.dial(ctx, t)
	if err != nil {
		log.Warn("tunnel: dial failed", "address", t.Address, "error", err)
		o.report(ctx, client, t.ID, err.Error())
		return
	}
	defer target.Close()
	if err := o.splice(ctx, client, t.ID, target, nil); err != nil {
		log.Warn("tunnel: ended", "error", err)
		return
	}
	log.Info("tunnel: closed", "address", t.Address)
}

func (o *Opener) dial(ctx context.Context, t protocol.Tunnel) (net.Conn, error) {
	if t.Target != protocol.TunnelTCP {
		return nil, fmt.Errorf("target %q is not served (only %q)", t.Target, protocol.TunnelTCP)
	}
	if _, _, err := net.SplitHostPort(t.Address); err != nil {
		return nil, fmt.Errorf("address %q is not host:port", t.Address)
	}
	timeout := o.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dial := o.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return dial(dctx, "tcp", t.Address)
}

func (o *Opener) url(id string) string {
	return strings.TrimSuffix(o.Endpoint, "/") + protocol.TunnelPath + url.PathEscape(id)
}

// report tells the gateway the tunnel could not be opened: the dial-back
// with ErrorHeader and no body.
func (o *Opener) report(ctx context.Context, client *http.Client, id, reason string) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, o.url(id), http.NoBody)
	if err != nil {
		return
	}
	req.Header.Set(ErrorHeader, strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, reason))
	if resp, err := client.Do(req); err == nil {
		_ = resp.Body.Close()
	}
}

// drainTimeout bounds the wait, once the target's bytes are all in the
// request body, for the gateway to end the response (its sign that it
// read them).
const drainTimeout = 30 * time.Second

// splice opens the dial-back with the target's bytes as its request body
// and copies its response body to the target; up, when set, runs once the
// gateway has taken the stream.
//
// Neither direction's end cancels the request: cancelling resets the
// HTTP/2 stream, which drops the request body's bytes the transport has
// not sent yet (a target that writes and closes at once lost its last
// bytes so). The target's end closes the request body (END_STREAM after
// its last bytes) and the splice returns once the gateway ends the
// response; the response's end (the caller is gone) closes the target.
func (o *Opener) splice(ctx context.Context, client *http.Client, id string, target net.Conn, up func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url(id), pr)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	// Up: the target's bytes into the request body, from now on (the pipe
	// blocks until the transport takes them).
	upDone := make(chan struct{})
	go func() {
		defer close(upDone)
		_, err := io.Copy(pw, target)
		_ = pw.CloseWithError(err) // nil: EOF, the body ends after its last bytes
	}()
	// abort ends the up copy when the stream is gone: nothing more can
	// be delivered.
	abort := func(err error) {
		_ = target.Close()
		_ = pr.CloseWithError(err)
		<-upDone
	}
	resp, err := client.Do(req)
	if err != nil {
		abort(err)
		return fmt.Errorf("dial-back: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		abort(io.ErrClosedPipe)
		return fmt.Errorf("dial-back refused: HTTP %d", resp.StatusCode)
	}
	if up != nil {
		up()
	}
	// Down: the caller's bytes to the target.
	body := &endReader{r: resp.Body}
	_, err = io.Copy(target, body)
	if body.ended {
		// The gateway ended the stream (the caller's side is gone).
		abort(io.ErrClosedPipe)
		if err != nil && ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	}
	// The target stopped taking bytes: it is closing. Its last bytes still
	// go up; the gateway ends the response once it has read them.
	select {
	case <-upDone:
	case <-ctx.Done():
		abort(ctx.Err())
		return nil
	}
	timer := time.AfterFunc(drainTimeout, cancel)
	defer timer.Stop()
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

// endReader notes that its reader ended (EOF or an error), which tells a
// copy's read side ending from its write side failing.
type endReader struct {
	r     io.Reader
	ended bool
}

func (e *endReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil {
		e.ended = true
	}
	return n, err
}

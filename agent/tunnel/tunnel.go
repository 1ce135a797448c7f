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
	"sync"
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
	Dial   func(ctx context.Context, network, address string) (net.Conn, error)
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
	target, err := o.dial(ctx, t)
	if err != nil {
		log.Warn("tunnel: dial failed", "address", t.Address, "error", err)
		o.report(ctx, client, t.ID, err.Error())
		return
	}
	defer target.Close()
	if err := o.splice(ctx, client, t.ID, target); err != nil {
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

// splice opens the dial-back with the target's bytes as its request body
// and copies its response body to the target.
func (o *Opener) splice(ctx context.Context, client *http.Client, id string, target net.Conn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url(id), pr)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	var wg sync.WaitGroup
	defer wg.Wait()
	// Up: the target's bytes into the request body, from now on (the pipe
	// blocks until the transport takes them).
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := io.Copy(pw, target)
		_ = pw.CloseWithError(err)
		cancel()
	}()
	defer target.Close() // unblocks the copy up when the stream ends first
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("dial-back: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("dial-back refused: HTTP %d", resp.StatusCode)
	}
	// Down: the caller's bytes to the target.
	_, err = io.Copy(target, resp.Body)
	if err != nil && ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

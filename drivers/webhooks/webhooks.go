// Package webhooks sends signed webhook deliveries (docs/webhooks.md): the
// Standard Webhooks headers and signature (webhook-id, webhook-timestamp,
// webhook-signature: v1,<base64 HMAC-SHA256 of id.timestamp.body>), over
// an HTTP client that refuses to connect to anything but public addresses
// (the SSRF guard: checked at connect time, so a name that resolves to a
// private address later, DNS rebinding, is refused then too).
package webhooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"code.dny.dev/ssrf"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/better-compute/better-compute/core"
)

// ResponseLimit bounds the response body kept of an attempt.
const ResponseLimit = 1024

// DefaultTimeout bounds one attempt, connect to the last byte.
const DefaultTimeout = 10 * time.Second

// Sender sends deliveries. AllowLoopback lets it reach loopback receivers
// (the dev stack and tests); every other private, link-local or special
// address is refused whatever it says.
type Sender struct {
	AllowLoopback bool
	Timeout       time.Duration
	// Resolver resolves a URL's host for CheckURL; nil is the system's.
	Resolver *net.Resolver

	guard  *ssrf.Guardian
	client *http.Client
}

// New is a Sender; see Sender for the options.
func New(allowLoopback bool, timeout time.Duration) *Sender {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	opts := []ssrf.Option{ssrf.WithAnyPort()}
	if allowLoopback {
		opts = append(opts, ssrf.WithAllowedV4Prefixes(netip.MustParsePrefix("127.0.0.0/8")),
			ssrf.WithAllowedV6Prefixes(netip.MustParsePrefix("::1/128")))
	}
	s := &Sender{AllowLoopback: allowLoopback, Timeout: timeout, guard: ssrf.New(opts...)}
	dialer := &net.Dialer{Timeout: timeout, Control: s.guard.Safe}
	s.client = &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               nil, // a proxy would connect for us, past the guard
			DialContext:         dialer.DialContext,
			TLSHandshakeTimeout: timeout,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     90 * time.Second,
		},
		// A redirect is the receiver's answer, not a new destination.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return s
}

// CheckURL refuses a URL a subscription may not have: not https (http only
// to loopback when allowed), with credentials, or whose host resolves to
// an address the guard refuses (INVALID_INPUT, field url, reason
// privateAddress).
func (s *Sender) CheckURL(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Opaque != "" {
		return bad("url", "format", "url must be an absolute http(s) URL")
	}
	if u.User != nil {
		return bad("url", "credentials", "url must not carry credentials: the signature authenticates deliveries")
	}
	if u.Fragment != "" {
		return bad("url", "format", "url must not have a fragment")
	}
	host := u.Hostname()
	addrs, err := s.resolve(ctx, host)
	if err != nil {
		return bad("url", "unresolvable", fmt.Sprintf("url's host %s does not resolve: %v", host, err))
	}
	loopbackOnly := true
	for _, a := range addrs {
		if err := s.guard.SafeAddr(a); err != nil {
			return bad("url", "privateAddress", fmt.Sprintf("url's host %s resolves to %s, which is not a public address", host, a))
		}
		loopbackOnly = loopbackOnly && a.IsLoopback()
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && s.AllowLoopback && loopbackOnly:
	default:
		return bad("url", "scheme", "url must be https")
	}
	return nil
}

func (s *Sender) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	r := s.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	ips, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, errors.New("no addresses")
	}
	for i := range ips {
		ips[i] = ips[i].Unmap()
	}
	return ips, nil
}

func bad(field, reason, msg string) error {
	return core.Errorf(core.CodeInvalidInput, "%s", msg).WithDetails(map[string]any{"field": field, "reason": reason})
}

// Message is one delivery to send: its id (the webhook-id header, the same
// on every attempt), its body, and the signing secrets (whsec_…): each
// signs, so a receiver holding either side of a rotation verifies it.
type Message struct {
	URL     string
	ID      string
	Body    []byte
	Secrets []string
}

// Result is one attempt: the status (0 without a response), how long it
// took, the first ResponseLimit bytes of the answer, and the error when
// there was no answer. OK is a 2xx status.
type Result struct {
	Status   int
	Latency  time.Duration
	Response string
	Err      string
	OK       bool
}

// Send makes one attempt at m, signed now.
func (s *Sender) Send(ctx context.Context, m Message) Result {
	now := time.Now()
	var sigs []string
	for _, secret := range m.Secrets {
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil {
			return Result{Err: fmt.Sprintf("signing secret: %v", err)}
		}
		sig, err := wh.Sign(m.ID, now, m.Body)
		if err != nil {
			return Result{Err: fmt.Sprintf("signing: %v", err)}
		}
		sigs = append(sigs, sig)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.URL, bytes.NewReader(m.Body))
	if err != nil {
		return Result{Err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "better-compute-webhooks/1")
	req.Header.Set(standardwebhooks.HeaderWebhookID, m.ID)
	req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, fmt.Sprint(now.Unix()))
	req.Header.Set(standardwebhooks.HeaderWebhookSignature, strings.Join(sigs, " "))
	resp, err := s.client.Do(req)
	res := Result{}
	if err != nil {
		res.Latency = time.Since(now)
		res.Err = err.Error()
		return res
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, ResponseLimit))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	res.Latency = time.Since(now)
	res.Status, res.Response = resp.StatusCode, strings.ReplaceAll(strings.ToValidUTF8(string(body), "\uFFFD"), "\x00", "")
	res.OK = resp.StatusCode >= 200 && resp.StatusCode < 300
	return res
}

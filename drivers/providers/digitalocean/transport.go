package digitalocean

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/better-compute/better-compute/drivers/providers"
)

// Rate-limit headers DigitalOcean answers with every response.
const (
	headerLimit      = "RateLimit-Limit"
	headerRemaining  = "RateLimit-Remaining"
	headerReset      = "RateLimit-Reset"
	headerRetryAfter = "Retry-After"
)

// penaltyWithoutHint is how long a 429 that names no time stops the
// credential: the per-minute window is a sliding minute, so its oldest
// call leaves it within a minute, usually far sooner.
const penaltyWithoutHint = 15 * time.Second

// limitedTransport is the one way a Provider's requests leave: it waits
// on the credential's Limiter, adds the token, and reports the answer's
// RateLimit-* headers (and a 429's penalty) back to the Limiter. It never
// retries.
type limitedTransport struct {
	base    http.RoundTripper
	limiter providers.Limiter
	key     string
	token   string
	// host is the API's host: the token goes nowhere else (a redirect
	// elsewhere is refused, not followed with the token).
	host string
	now  func() time.Time
}

func (t *limitedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if req.URL.Host != t.host {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("%w: %w: the token is only sent to %s, not %s", providers.ErrNotSent, providers.ErrRefused, t.host, req.URL.Host)
	}
	if err := t.limiter.Wait(ctx, t.key); err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		if limited, ok := providers.AsRateLimited(err); ok {
			err = limited
		}
		return nil, fmt.Errorf("%w: waiting for the rate limiter: %w", providers.ErrNotSent, err)
	}
	out := req.Clone(ctx)
	out.Header.Set("Authorization", "Bearer "+t.token)
	resp, err := t.base.RoundTrip(out)
	if err != nil {
		if notSent(err) {
			return nil, fmt.Errorf("%w: %w", providers.ErrNotSent, err)
		}
		return nil, err
	}
	bg := context.WithoutCancel(ctx)
	if limit, remaining, reset, ok := rateHeaders(resp.Header); ok {
		t.limiter.Observe(bg, t.key, limit, remaining, reset)
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		t.limiter.Penalize(bg, t.key, retryAt(resp.Header, t.now()))
	}
	return resp, nil
}

// notSent says the request never reached the provider: the dial failed.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// rateHeaders reads RateLimit-Limit, -Remaining and -Reset (epoch seconds).
func rateHeaders(h http.Header) (limit, remaining int, reset time.Time, ok bool) {
	limit, err1 := strconv.Atoi(h.Get(headerLimit))
	remaining, err2 := strconv.Atoi(h.Get(headerRemaining))
	if err1 != nil || err2 != nil {
		return 0, 0, time.Time{}, false
	}
	if secs, err := strconv.ParseInt(h.Get(headerReset), 10, 64); err == nil && secs > 0 {
		reset = time.Unix(secs, 0)
	}
	return limit, remaining, reset, true
}

// retryAt is when a 429 says to try again: Retry-After (seconds or an
// HTTP date); else RateLimit-Reset when nothing remains of the hourly
// window; else penaltyWithoutHint from now (the per-minute window).
func retryAt(h http.Header, now time.Time) time.Time {
	if v := h.Get(headerRetryAfter); v != "" {
		if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
			return now.Add(time.Duration(secs) * time.Second)
		}
		if at, err := http.ParseTime(v); err == nil {
			return at
		}
	}
	if _, remaining, reset, ok := rateHeaders(h); ok && remaining <= 0 && reset.After(now) {
		return reset
	}
	return now.Add(penaltyWithoutHint)
}

package dofake

import (
	"net/http"
	"strconv"
	"time"
)

// rateLimits keeps, per token, the instants of its accepted requests of
// the last hour: DigitalOcean's windows slide (a request "expires" an hour
// after it was made), with a burst limit per minute on top.
type rateLimits struct {
	accepted map[string][]time.Time
}

func newRateLimits() rateLimits { return rateLimits{accepted: map[string][]time.Time{}} }

// verdict is what the limiter decided for one request, and the headers it
// answers with: RateLimit-Limit is the hourly limit, RateLimit-Remaining
// what is left of it, RateLimit-Reset (epoch seconds) when the oldest
// request of the hour expires.
type verdict struct {
	allowed          bool
	limit, remaining int
	reset            time.Time
	// retryAfter is the Retry-After of a refusal, in whole seconds.
	retryAfter int
}

func (v verdict) setHeaders(h http.Header) {
	h.Set("RateLimit-Limit", strconv.Itoa(v.limit))
	h.Set("RateLimit-Remaining", strconv.Itoa(v.remaining))
	h.Set("RateLimit-Reset", strconv.FormatInt(v.reset.Unix(), 10))
}

// take counts one request of token at now, unless a window is full.
func (rl *rateLimits) take(token string, s Settings, now time.Time) verdict {
	times := rl.accepted[token]
	hourAgo := now.Add(-time.Hour)
	drop := 0
	for drop < len(times) && !times[drop].After(hourAgo) {
		drop++
	}
	times = times[drop:]
	minuteAgo := now.Add(-time.Minute)
	inMinute := 0
	for i := len(times) - 1; i >= 0 && times[i].After(minuteAgo); i-- {
		inMinute++
	}

	v := verdict{limit: s.PerHour}
	var freesAt time.Time
	switch {
	case len(times) >= s.PerHour:
		freesAt = times[len(times)-s.PerHour].Add(time.Hour)
	case inMinute >= s.PerMinute:
		freesAt = times[len(times)-s.PerMinute].Add(time.Minute)
	default:
		times = append(times, now)
		v.allowed = true
	}
	rl.accepted[token] = times
	v.remaining = max(0, s.PerHour-len(times))
	v.reset = now.Add(time.Hour)
	if len(times) > 0 {
		v.reset = times[0].Add(time.Hour)
	}
	if !v.allowed {
		v.retryAfter = max(1, int((freesAt.Sub(now)+time.Second-1)/time.Second))
	}
	return v
}

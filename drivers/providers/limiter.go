package providers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"
)

// LimiterKey is the Limiter key of a token: the hex SHA-256 of the token,
// so limiter state, rows and logs never hold the token itself.
func LimiterKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// MemoryLimiter is a Limiter for one process (tests, the dev stack): per
// key, one token bucket per window; a call takes one token from every
// window, or waits for the window that refills last. Processes that share
// a credential use store/ratelimits instead.
type MemoryLimiter struct {
	windows []Window
	now     func() time.Time

	mu   sync.Mutex
	keys map[string]*memoryBuckets
}

type memoryBuckets struct {
	tokens       []float64
	refilledAt   time.Time
	blockedUntil time.Time
}

// NewMemoryLimiter limits every key to windows (DigitalOceanWindows when
// none are given).
func NewMemoryLimiter(windows ...Window) *MemoryLimiter {
	if len(windows) == 0 {
		windows = DigitalOceanWindows()
	}
	return &MemoryLimiter{windows: windows, now: time.Now, keys: map[string]*memoryBuckets{}}
}

// Wait takes one token of every window for key, sleeping until there is
// one. When the next token comes after ctx's deadline it answers
// *RateLimited at once rather than sleeping into the deadline.
func (l *MemoryLimiter) Wait(ctx context.Context, key string) error {
	for {
		now := l.now()
		wait := l.take(key, now)
		if wait <= 0 {
			return nil
		}
		if err := sleepFor(ctx, now, wait); err != nil {
			return err
		}
	}
}

// sleepFor sleeps wait from now, or refuses at once when that passes ctx's
// deadline; a cancelled ctx answers its error.
func sleepFor(ctx context.Context, now time.Time, wait time.Duration) error {
	if dl, ok := ctx.Deadline(); ok && now.Add(wait).After(dl) {
		return &RateLimited{RetryAt: now.Add(wait)}
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// take refills key's buckets to now and takes one token of each when all
// have one (answering 0), or answers how long until they will.
func (l *MemoryLimiter) take(key string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.refill(key, now)
	if now.Before(b.blockedUntil) {
		return b.blockedUntil.Sub(now)
	}
	var wait time.Duration
	for i, w := range l.windows {
		if b.tokens[i] < 1 {
			wait = max(wait, time.Duration((1-b.tokens[i])*float64(w.Period)/float64(w.Limit))+1)
		}
	}
	if wait > 0 {
		return wait
	}
	for i := range b.tokens {
		b.tokens[i]--
	}
	return 0
}

// refill brings key's buckets to now (a new key starts full).
func (l *MemoryLimiter) refill(key string, now time.Time) *memoryBuckets {
	b, ok := l.keys[key]
	if !ok {
		b = &memoryBuckets{tokens: make([]float64, len(l.windows)), refilledAt: now}
		for i, w := range l.windows {
			b.tokens[i] = float64(w.Limit)
		}
		l.keys[key] = b
		return b
	}
	if elapsed := now.Sub(b.refilledAt); elapsed > 0 {
		for i, w := range l.windows {
			b.tokens[i] = min(float64(w.Limit), b.tokens[i]+float64(elapsed)*float64(w.Limit)/float64(w.Period))
		}
		b.refilledAt = now
	}
	return b
}

// Observe sets the window the headers describe (the one whose Limit is
// limit, else the longest) to what remains of it: the provider counts
// every call of the token (other tools' too) and its sliding window frees
// calls as they age, so its count replaces ours, up or down. With nothing
// remaining it blocks key until reset, which frees one call; that call's
// answer says how many more.
func (l *MemoryLimiter) Observe(_ context.Context, key string, limit, remaining int, reset time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b := l.refill(key, now)
	i := ObservedWindow(l.windows, limit)
	w := l.windows[i]
	if remaining > 0 || !reset.After(now) {
		b.tokens[i] = min(float64(w.Limit), float64(max(remaining, 0)))
		return
	}
	// Nothing remains until reset, when the oldest call leaves the window:
	// the bucket is set to refill to one token exactly then.
	b.tokens[i] = 1 - float64(reset.Sub(now))*float64(w.Limit)/float64(w.Period)
	if reset.After(b.blockedUntil) {
		b.blockedUntil = reset
	}
}

// Penalize blocks key until until.
func (l *MemoryLimiter) Penalize(_ context.Context, key string, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.refill(key, l.now())
	if until.After(b.blockedUntil) {
		b.blockedUntil = until
	}
}

// ObservedWindow is the index of the window a RateLimit-Limit header of
// limit describes: the window with that Limit, else the longest one
// (DigitalOcean's headers describe its hourly window).
func ObservedWindow(windows []Window, limit int) int {
	longest := 0
	for i, w := range windows {
		if w.Limit == limit {
			return i
		}
		if w.Period > windows[longest].Period {
			longest = i
		}
	}
	return longest
}

// Package ratelimits is the providers' rate limiter shared by every process
// and workflow: per credential key and window, a token bucket in
// provider_rate_limits, refilled on the database's clock. It has the method
// set of drivers/providers.Limiter (Wait, Observe, Penalize) and satisfies
// it structurally: store builds on core and does not import drivers.
package ratelimits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/better-compute/core"
)

// Window is one window of a credential's limit: at most Limit calls in
// any Period. It has providers.Window's fields, so one converts to the
// other (ratelimits.Window(w)).
type Window struct {
	Name   string
	Limit  int
	Period time.Duration
}

// RateLimited is Wait's refusal when the next token comes after the
// caller's deadline. Like providers.RateLimited it answers RetryTime, by
// which the providers' transport turns it into theirs.
type RateLimited struct {
	RetryAt time.Time
}

func (e *RateLimited) Error() string {
	return "provider: rate limited until " + e.RetryAt.UTC().Format(time.RFC3339)
}

// RetryTime is when the next call may go.
func (e *RateLimited) RetryTime() time.Time { return e.RetryAt }

// statementTimeout bounds each of the limiter's statements, so a stuck
// database never holds a provider call longer than this per try.
const statementTimeout = 5 * time.Second

// Limiter is the PostgreSQL limiter.
type Limiter struct {
	pool    *pgxpool.Pool
	windows []Window
	names   []string
	limits  []int32
	periods []int64
	log     *slog.Logger
}

// New limits every key to windows over pool's connections. Observe and
// Penalize cannot answer an error: their failures are logged on log (nil:
// slog.Default()).
func New(pool *pgxpool.Pool, log *slog.Logger, windows ...Window) (*Limiter, error) {
	if len(windows) == 0 {
		return nil, core.Errorf(core.CodeInvalidInput, "a rate limiter needs at least one window").WithDetails(map[string]any{"field": "windows"})
	}
	if log == nil {
		log = slog.Default()
	}
	l := &Limiter{pool: pool, windows: windows, log: log}
	seen := map[string]bool{}
	for _, w := range windows {
		if w.Name == "" || seen[w.Name] || w.Limit < 1 || w.Period < time.Millisecond {
			return nil, core.Errorf(core.CodeInvalidInput, "window %q: a unique name, a limit of at least 1 and a period of at least 1 ms are required", w.Name).
				WithDetails(map[string]any{"field": "windows", "window": w.Name})
		}
		seen[w.Name] = true
		l.names = append(l.names, w.Name)
		l.limits = append(l.limits, int32(w.Limit))
		l.periods = append(l.periods, w.Period.Milliseconds())
	}
	return l, nil
}

var keyPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

func checkKey(key string) error {
	if !keyPattern.MatchString(key) {
		return core.Errorf(core.CodeInvalidInput, "a rate-limit key is the hex SHA-256 of a credential").WithDetails(map[string]any{"field": "key"})
	}
	return nil
}

// takeSQL refills key's buckets to the database's clock and, when every
// window has a token and no penalty holds, takes one of each, in one
// statement. The rows are locked in key order (no deadlock between
// waiters); a waiter that queued behind another sees the row as that one
// left it (READ COMMITTED re-reads a locked row). Each row answers whether
// the call was granted and how long, in ms, until that window would grant.
const takeSQL = `
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS t),
want AS (SELECT * FROM unnest($2::text[], $3::int[], $4::bigint[]) AS w(name, capacity, period_ms)),
cur AS (
	SELECT r.key, r.window_name, w.capacity, w.period_ms, r.blocked_until, r.refilled_at,
	       least(w.capacity::float8, r.tokens + greatest(0, extract(epoch FROM (clock.t - r.refilled_at)) * 1000)
	             * w.capacity / w.period_ms) AS avail
	FROM provider_rate_limits r JOIN want w ON w.name = r.window_name CROSS JOIN clock
	WHERE r.key = $1
	ORDER BY r.window_name
	FOR UPDATE OF r
),
decision AS (
	SELECT count(*) = cardinality($2::text[]) AND bool_and(cur.avail >= 1 AND cur.blocked_until <= clock.t) AS granted
	FROM cur CROSS JOIN clock
)
UPDATE provider_rate_limits p SET
	tokens      = cur.avail - CASE WHEN d.granted THEN 1 ELSE 0 END,
	capacity    = cur.capacity,
	period_ms   = cur.period_ms,
	refilled_at = greatest(cur.refilled_at, clock.t)
FROM cur CROSS JOIN decision d CROSS JOIN clock
WHERE p.key = cur.key AND p.window_name = cur.window_name
RETURNING d.granted,
	CASE WHEN d.granted THEN 0 ELSE greatest(
		CASE WHEN cur.blocked_until > clock.t THEN extract(epoch FROM (cur.blocked_until - clock.t)) * 1000 ELSE 0 END,
		CASE WHEN cur.avail < 1 THEN (1 - cur.avail) * cur.period_ms / cur.capacity ELSE 0 END,
		0) END`

// seedSQL creates key's missing buckets, full.
const seedSQL = `
INSERT INTO provider_rate_limits (key, window_name, capacity, period_ms, tokens, refilled_at)
SELECT $1, w.name, w.capacity, w.period_ms, w.capacity, clock_timestamp()
FROM unnest($2::text[], $3::int[], $4::bigint[]) AS w(name, capacity, period_ms)
ON CONFLICT (key, window_name) DO NOTHING`

// Wait takes one token of every window for key, sleeping until there is
// one; when the next comes after ctx's deadline it answers the refusal at
// once instead of sleeping into the deadline.
func (l *Limiter) Wait(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	for {
		granted, wait, err := l.take(ctx, key)
		if err != nil {
			return err
		}
		if granted {
			return nil
		}
		// A little jitter, so waiters woken by one refill do not all
		// query at the same instant.
		wait += time.Duration(rand.Int64N(int64(time.Millisecond) * 5))
		if dl, ok := ctx.Deadline(); ok && time.Now().Add(wait).After(dl) {
			return &RateLimited{RetryAt: time.Now().Add(wait)}
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// take is one try: granted, or how long until the slowest window grants.
func (l *Limiter) take(ctx context.Context, key string) (bool, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, statementTimeout)
	defer cancel()
	for seeded := false; ; seeded = true {
		rows, err := l.pool.Query(ctx, takeSQL, key, l.names, l.limits, l.periods)
		if err != nil {
			return false, 0, fmt.Errorf("ratelimits: taking a token: %w", err)
		}
		n, granted := 0, true
		var waitMS float64
		for rows.Next() {
			var g bool
			var w float64
			if err := rows.Scan(&g, &w); err != nil {
				rows.Close()
				return false, 0, fmt.Errorf("ratelimits: taking a token: %w", err)
			}
			n++
			granted = granted && g
			waitMS = max(waitMS, w)
		}
		if err := rows.Err(); err != nil {
			return false, 0, fmt.Errorf("ratelimits: taking a token: %w", err)
		}
		if n == len(l.windows) || seeded {
			if n == 0 {
				return false, 0, errors.New("ratelimits: the buckets were not created")
			}
			return granted && n == len(l.windows), time.Duration(waitMS*float64(time.Millisecond)) + time.Millisecond, nil
		}
		if _, err := l.pool.Exec(ctx, seedSQL, key, l.names, l.limits, l.periods); err != nil {
			return false, 0, fmt.Errorf("ratelimits: creating the buckets: %w", err)
		}
	}
}

// observeSQL lowers one window to what the provider says remains, and
// with nothing remaining blocks the key until the reset.
// observeSQL sets one window to what the provider says remains of it (its
// count replaces ours, up or down). With nothing remaining until a reset
// to come, the bucket is set to refill to one token exactly at the reset
// (the oldest call leaves the window then; that call's answer says how
// many more).
const observeSQL = `
WITH clock AS MATERIALIZED (SELECT clock_timestamp() AS t)
UPDATE provider_rate_limits SET
	tokens = CASE WHEN $3::float8 <= 0 AND $4::timestamptz > clock.t
	              THEN 1 - extract(epoch FROM ($4::timestamptz - clock.t)) * 1000 * capacity / period_ms
	              ELSE least(capacity::float8, $3::float8) END,
	refilled_at = greatest(refilled_at, clock.t)
FROM clock
WHERE key = $1 AND window_name = $2`

const blockSQL = `
UPDATE provider_rate_limits SET blocked_until = greatest(blocked_until, $2)
WHERE key = $1`

// Observe sets the window the headers describe (the one whose Limit is
// limit, else the longest) to remaining; with nothing remaining it blocks
// key until reset, which frees one call.
func (l *Limiter) Observe(ctx context.Context, key string, limit, remaining int, reset time.Time) {
	if checkKey(key) != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, statementTimeout)
	defer cancel()
	w := l.windows[observedWindow(l.windows, limit)]
	var resetAt *time.Time
	if !reset.IsZero() {
		resetAt = &reset
	}
	if remaining <= 0 && resetAt != nil {
		l.block(ctx, key, reset)
	}
	if _, err := l.pool.Exec(ctx, observeSQL, key, w.Name, float64(max(remaining, 0)), resetAt); err != nil {
		l.log.WarnContext(ctx, "ratelimits: recording the provider's rate-limit headers", "error", err)
	}
}

// Penalize blocks key until until (after a 429).
func (l *Limiter) Penalize(ctx context.Context, key string, until time.Time) {
	if checkKey(key) != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, statementTimeout)
	defer cancel()
	l.block(ctx, key, until)
}

func (l *Limiter) block(ctx context.Context, key string, until time.Time) {
	if _, err := l.pool.Exec(ctx, seedSQL, key, l.names, l.limits, l.periods); err != nil {
		l.log.WarnContext(ctx, "ratelimits: creating the buckets", "error", err)
		return
	}
	if _, err := l.pool.Exec(ctx, blockSQL, key, until); err != nil {
		l.log.WarnContext(ctx, "ratelimits: blocking a credential", "error", err)
	}
}

// observedWindow is the window a RateLimit-Limit header of limit
// describes: the one with that Limit, else the longest (as
// providers.ObservedWindow).
func observedWindow(windows []Window, limit int) int {
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

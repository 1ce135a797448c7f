package ratelimits_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store/ratelimits"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func key(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func newLimiter(t testing.TB, pool *pgxpool.Pool, windows ...ratelimits.Window) *ratelimits.Limiter {
	t.Helper()
	l, err := ratelimits.New(pool, nil, windows...)
	require.NoError(t, err)
	return l
}

// otherPool is a second connection pool to the same database: another
// process sharing the credential.
func otherPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestConcurrentWaitsNeverExceedTheWindow(t *testing.T) {
	url := testenv.DatabaseURL(t)
	pools := []*pgxpool.Pool{otherPool(t, url), otherPool(t, url)}
	windows := []ratelimits.Window{{Name: "minute", Limit: 5, Period: time.Hour}, {Name: "hour", Limit: 50, Period: time.Hour}}
	limiters := []*ratelimits.Limiter{newLimiter(t, pools[0], windows...), newLimiter(t, pools[1], windows...)}
	k := key("token-a")

	var granted, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Go(func() {
			l := limiters[g%2]
			for range 3 {
				// The next token is 12 minutes away: a waiter past its
				// deadline is refused at once, without sleeping.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := l.Wait(ctx, k)
				cancel()
				var limited *ratelimits.RateLimited
				switch {
				case err == nil:
					granted.Add(1)
				case errors.As(err, &limited):
					refused.Add(1)
				default:
					t.Errorf("wait: %v", err)
				}
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 5, granted.Load(), "grants of a 5-token window")
	require.EqualValues(t, 36-5, refused.Load())

	// Another credential has its own buckets.
	require.NoError(t, limiters[0].Wait(context.Background(), key("token-b")))
}

func TestGrantsFollowTheRefillRate(t *testing.T) {
	s := testenv.Store(t)
	const capacity, period = 10, 500 * time.Millisecond
	l := newLimiter(t, s.Pool, ratelimits.Window{Name: "fast", Limit: capacity, Period: period})
	k := key("token-rate")

	var grants atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 6 {
		wg.Go(func() {
			for range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				if err := l.Wait(ctx, k); err != nil {
					t.Errorf("wait: %v", err)
				} else {
					grants.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	require.EqualValues(t, 30, grants.Load())
	// A bucket never grants more than its capacity plus what refilled
	// while the waits ran, however fast or slow the machine is.
	refilled := float64(elapsed) / float64(period) * capacity
	require.LessOrEqual(t, float64(grants.Load()), capacity+refilled+1, "grants within %v", elapsed)
}

func TestPenaltiesAndObservedHeaders(t *testing.T) {
	// DigitalOcean's limits, refilled a hundred times slower: no token
	// comes back while a case runs.
	windows := []ratelimits.Window{{Name: "minute", Limit: 250, Period: 100 * time.Minute}, {Name: "hour", Limit: 5000, Period: 100 * time.Hour}}
	type step func(t *testing.T, l *ratelimits.Limiter, k string)
	deadlineWait := func(t *testing.T, l *ratelimits.Limiter, k string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return l.Wait(ctx, k)
	}
	tests := []struct {
		name   string
		before step
		grants int // of 20 waits with a deadline
		after  func(t *testing.T, err error)
	}{
		{name: "a fresh credential", before: func(*testing.T, *ratelimits.Limiter, string) {}, grants: 20},
		{
			name: "a 429 penalty blocks until it ends",
			before: func(t *testing.T, l *ratelimits.Limiter, k string) {
				l.Penalize(context.Background(), k, time.Now().Add(time.Hour))
			},
			grants: 0,
			after: func(t *testing.T, err error) {
				var limited *ratelimits.RateLimited
				require.ErrorAs(t, err, &limited)
				require.WithinDuration(t, time.Now().Add(time.Hour), limited.RetryTime(), time.Minute)
			},
		},
		{
			name: "a penalty in the past changes nothing",
			before: func(t *testing.T, l *ratelimits.Limiter, k string) {
				l.Penalize(context.Background(), k, time.Now().Add(-time.Minute))
			},
			grants: 20,
		},
		{
			name: "remaining 0 blocks until the reset",
			before: func(t *testing.T, l *ratelimits.Limiter, k string) {
				l.Observe(context.Background(), k, 5000, 0, time.Now().Add(30*time.Minute))
			},
			grants: 0,
		},
		{
			name: "remaining 3 of the hour leaves three calls",
			before: func(t *testing.T, l *ratelimits.Limiter, k string) {
				require.NoError(t, l.Wait(context.Background(), k)) // the call whose answer said so
				l.Observe(context.Background(), k, 5000, 3, time.Now().Add(30*time.Minute))
			},
			grants: 3,
		},
		{
			name: "an unknown limit describes the longest window",
			before: func(t *testing.T, l *ratelimits.Limiter, k string) {
				require.NoError(t, l.Wait(context.Background(), k))
				l.Observe(context.Background(), k, 1234, 2, time.Time{})
			},
			grants: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testenv.Store(t)
			l := newLimiter(t, s.Pool, windows...)
			k := key(tt.name)
			tt.before(t, l, k)
			granted := 0
			var last error
			for range 20 {
				if err := deadlineWait(t, l, k); err == nil {
					granted++
				} else {
					last = err
				}
			}
			require.Equal(t, tt.grants, granted)
			if tt.after != nil {
				tt.after(t, last)
			}
		})
	}
}

func TestRefillsAfterWaiting(t *testing.T) {
	s := testenv.Store(t)
	l := newLimiter(t, s.Pool, ratelimits.Window{Name: "tiny", Limit: 2, Period: 200 * time.Millisecond})
	k := key("token-refill")
	for range 2 {
		require.NoError(t, l.Wait(context.Background(), k))
	}
	// The third call sleeps until the bucket refills, within the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, l.Wait(ctx, k))

	// A cancelled wait answers the context's error.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	for {
		err := l.Wait(ctx, k)
		if err != nil {
			require.ErrorIs(t, err, context.Canceled)
			break
		}
	}
}

func TestBadInput(t *testing.T) {
	s := testenv.Store(t)
	tests := []struct {
		name    string
		windows []ratelimits.Window
		key     string
	}{
		{name: "no window"},
		{name: "a zero limit", windows: []ratelimits.Window{{Name: "m", Limit: 0, Period: time.Minute}}},
		{name: "a duplicate name", windows: []ratelimits.Window{{Name: "m", Limit: 1, Period: time.Minute}, {Name: "m", Limit: 2, Period: time.Hour}}},
		{name: "a sub-millisecond period", windows: []ratelimits.Window{{Name: "m", Limit: 1, Period: time.Microsecond}}},
		{name: "a key that is not a digest", windows: []ratelimits.Window{{Name: "m", Limit: 1, Period: time.Minute}}, key: "dop_v1_secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := ratelimits.New(s.Pool, nil, tt.windows...)
			if tt.key != "" {
				require.NoError(t, err)
				err = l.Wait(context.Background(), tt.key)
			}
			require.ErrorIs(t, err, core.ErrInvalidInput)
		})
	}
	var n int
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM provider_rate_limits`).Scan(&n))
	require.Zero(t, n, "bad input wrote nothing")
}

// BenchmarkWait is one granted Wait: one statement round trip.
func BenchmarkWait(b *testing.B) {
	s := testenv.Store(b)
	l := newLimiter(b, s.Pool, ratelimits.Window{Name: "minute", Limit: 1 << 30, Period: time.Minute}, ratelimits.Window{Name: "hour", Limit: 1 << 30, Period: time.Hour})
	k := key("bench")
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if err := l.Wait(ctx, k); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWaitParallel is Waits of one credential from 4 goroutines a core:
// they serialize on the credential's rows.
func BenchmarkWaitParallel(b *testing.B) {
	s := testenv.Store(b)
	l := newLimiter(b, s.Pool, ratelimits.Window{Name: "minute", Limit: 1 << 30, Period: time.Minute}, ratelimits.Window{Name: "hour", Limit: 1 << 30, Period: time.Hour})
	k := key("bench-parallel")
	ctx := context.Background()
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := l.Wait(ctx, k); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// The PostgreSQL limiter is a providers.Limiter, and the providers'
// windows convert to its own.
var (
	_ providers.Limiter = (*ratelimits.Limiter)(nil)
	_                   = ratelimits.Window(providers.DigitalOceanWindows()[0])
)

func TestItServesTheDigitalOceanDriver(t *testing.T) {
	s := testenv.Store(t)
	var windows []ratelimits.Window
	for _, w := range providers.DigitalOceanWindows() {
		windows = append(windows, ratelimits.Window(w))
	}
	l := newLimiter(t, s.Pool, windows...)
	k := providers.LimiterKey("dop_v1_token")
	require.NoError(t, l.Wait(context.Background(), k))
	l.Penalize(context.Background(), k, time.Now().Add(time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	limited, ok := providers.AsRateLimited(l.Wait(ctx, k))
	require.True(t, ok, "its refusal reads as the providers' RateLimited")
	require.WithinDuration(t, time.Now().Add(time.Hour), limited.RetryAt, time.Minute)
	var stored int
	require.NoError(t, s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM provider_rate_limits WHERE key = $1`, k).Scan(&stored))
	require.Equal(t, 2, stored, "one bucket per window, under the digest")
}

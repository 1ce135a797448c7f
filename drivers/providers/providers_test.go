package providers

import (
	"context"
	"errors"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func TestMemoryLimiterBuckets(t *testing.T) {
	windows := []Window{{Name: "minute", Limit: 3, Period: time.Minute}, {Name: "hour", Limit: 5, Period: time.Hour}}
	type call struct {
		at   time.Duration // after t0
		wait time.Duration // 0: granted
	}
	tests := []struct {
		name   string
		before func(l *MemoryLimiter)
		calls  []call
	}{
		{
			name: "the minute window runs out, then refills a token every 20 s",
			calls: []call{
				{0, 0}, {0, 0}, {0, 0},
				{0, 20*time.Second + 1},
				{10 * time.Second, 10*time.Second + 1},
				{20 * time.Second, 0},
			},
		},
		{
			name: "the hour window runs out after five, a token every 12 minutes",
			calls: []call{
				{0, 0}, {0, 0}, {0, 0},
				{time.Minute, 0}, {time.Minute, 0},
				{2 * time.Minute, 10*time.Minute + 1}, // 2 of 60 minutes' refill is 1/6 token
				{12 * time.Minute, 0},
			},
		},
		{
			name: "a penalty blocks until it ends",
			before: func(l *MemoryLimiter) {
				l.Penalize(context.Background(), "k", t0.Add(90*time.Second))
			},
			calls: []call{{0, 90 * time.Second}, {time.Minute, 30 * time.Second}, {90 * time.Second, 0}},
		},
		{
			name: "nothing remaining blocks until the reset, which frees one call",
			before: func(l *MemoryLimiter) {
				l.Observe(context.Background(), "k", 5, 0, t0.Add(time.Minute))
			},
			calls: []call{{0, time.Minute}, {time.Minute, 0}, {time.Minute, 12 * time.Minute}},
		},
		{
			name: "an observed remainder lowers the window it names",
			before: func(l *MemoryLimiter) {
				l.Observe(context.Background(), "k", 5, 1, t0.Add(time.Hour))
			},
			calls: []call{{0, 0}, {0, 12*time.Minute + 1}},
		},
		{
			name: "a remainder above the limit fills the window, no more",
			before: func(l *MemoryLimiter) {
				l.Observe(context.Background(), "k", 5, 4000, t0.Add(time.Hour))
			},
			calls: []call{{0, 0}, {0, 0}, {0, 0}, {0, 20*time.Second + 1}},
		},
		{
			name: "a remainder the provider freed raises the window again",
			before: func(l *MemoryLimiter) {
				l.Observe(context.Background(), "k", 5, 0, t0.Add(time.Second))
				l.now = func() time.Time { return t0.Add(time.Second) }
				l.Observe(context.Background(), "k", 5, 4, t0.Add(time.Hour))
			},
			calls: []call{{time.Second, 0}, {time.Second, 0}, {time.Second, 0}, {time.Minute, 0}, {time.Minute, 11*time.Minute + time.Second}}, // 720 s a token, 59 s of it refilled
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewMemoryLimiter(windows...)
			l.now = func() time.Time { return t0 }
			if tt.before != nil {
				tt.before(l)
			}
			for i, c := range tt.calls {
				// Float refills: equal to the millisecond.
				require.InDelta(t, float64(c.wait), float64(l.take("k", t0.Add(c.at))), float64(time.Millisecond), "call %d at +%v", i, c.at)
			}
			require.Zero(t, l.take("other", t0), "another key has its own buckets")
		})
	}
}

func TestMemoryLimiterWait(t *testing.T) {
	l := NewMemoryLimiter(Window{Name: "tiny", Limit: 1, Period: time.Hour})
	ctx := context.Background()
	require.NoError(t, l.Wait(ctx, "k"))

	// The next token is an hour away: a deadline before it is refused at
	// once, naming when.
	short, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := l.Wait(short, "k")
	var limited *RateLimited
	require.ErrorAs(t, err, &limited)
	require.WithinDuration(t, time.Now().Add(time.Hour), limited.RetryAt, time.Minute)
	got, ok := AsRateLimited(err)
	require.True(t, ok)
	require.Equal(t, limited.RetryAt, got.RetryAt)

	// Without a deadline it sleeps; cancelling ends the sleep.
	cancelled, cancelNow := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Wait(cancelled, "k") }()
	cancelNow()
	require.ErrorIs(t, <-done, context.Canceled)

	// A refill within the deadline is waited for.
	fast := NewMemoryLimiter(Window{Name: "fast", Limit: 1, Period: 10 * time.Millisecond})
	for range 3 {
		require.NoError(t, fast.Wait(short, "k"))
	}
}

func TestMemoryLimiterIsSafeForConcurrentUse(t *testing.T) {
	l := NewMemoryLimiter(Window{Name: "m", Limit: 10, Period: time.Hour})
	var granted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if l.Wait(ctx, "k") == nil {
					granted.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 10, granted.Load())
}

func TestNamesAndTags(t *testing.T) {
	tagPattern := regexp.MustCompile(`^[A-Za-z0-9:_-]{1,255}$`)
	tests := []struct {
		id, tenant string
		name       string
	}{
		{id: "inst_01jabcdefghjkmnpqrstvwxyz0", tenant: "ten_acme", name: "bc-i-01jabcdefghjkmnpqrstvwxy"},
		{id: "inst_abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz", tenant: "root", name: "bc-i-abcdefghijklmnopqrstuvwx"},
		{id: "inst_SHORT", tenant: "t.e/n ant", name: "bc-i-short"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.name, ServerName(tt.id))
		tags := ServerTags(tt.id, tt.tenant)
		require.Equal(t, []string{ManagedTag, "better-compute-instance:" + tt.id, TenantTag(tt.tenant)}, tags)
		for _, tag := range tags {
			require.Regexp(t, tagPattern, tag)
		}
	}
	require.Equal(t, "better-compute-tenant:t_e_n_ant", TenantTag("t.e/n ant"))
	require.Equal(t, LimiterKey("a"), LimiterKey("a"))
	require.NotContains(t, LimiterKey("dop_v1_secret"), "secret")
	require.Len(t, LimiterKey("x"), 64)
}

func TestMemoryJournal(t *testing.T) {
	j := NewMemoryJournal()
	now := t0
	j.now = func() time.Time { return now }
	ctx := context.Background()
	_, pending, err := j.Pending(ctx)
	require.NoError(t, err)
	require.False(t, pending)
	require.NoError(t, j.Record(ctx))
	now = now.Add(time.Minute)
	ago, pending, err := j.Pending(ctx)
	require.NoError(t, err)
	require.True(t, pending)
	require.Equal(t, time.Minute, ago)
	require.NoError(t, j.Forget(ctx))
	_, pending, _ = j.Pending(ctx)
	require.False(t, pending)
	require.Equal(t, 1, j.Recorded())
}

func TestRateLimitedIsFoundThroughWrapping(t *testing.T) {
	at := t0.Add(time.Minute)
	err := errors.Join(errors.New("context"), &RateLimited{RetryAt: at})
	got, ok := AsRateLimited(err)
	require.True(t, ok)
	require.Equal(t, at, got.RetryAt)
	_, ok = AsRateLimited(ErrUnavailable)
	require.False(t, ok)
}

// BenchmarkMemoryWait is one granted Wait of the in-process limiter.
func BenchmarkMemoryWait(b *testing.B) {
	l := NewMemoryLimiter(Window{Name: "minute", Limit: 1 << 30, Period: time.Minute}, Window{Name: "hour", Limit: 1 << 30, Period: time.Hour})
	ctx := context.Background()
	for b.Loop() {
		if err := l.Wait(ctx, "k"); err != nil {
			b.Fatal(err)
		}
	}
}

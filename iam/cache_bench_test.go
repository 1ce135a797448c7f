package iam

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkCachedReadDecision is a read decision answered from the cache.
func BenchmarkCachedReadDecision(b *testing.B) {
	p, inner, _ := newCacheTestPort(CacheOptions{})
	req := cacheReadReq(cacheCallerA, "pool_1")
	ctx := context.Background()
	if _, err := p.Authorize(ctx, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if d, err := p.Authorize(ctx, req); err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
	}
	b.StopTimer()
	if n := inner.count("Authorize"); n != 1 {
		b.Fatalf("inner calls = %d, want 1", n)
	}
}

// BenchmarkCachedReadDecisionParallel is the same hit from every P at once
// (the single lock's contention).
func BenchmarkCachedReadDecisionParallel(b *testing.B) {
	p, _, _ := newCacheTestPort(CacheOptions{})
	req := cacheReadReq(cacheCallerA, "pool_1")
	ctx := context.Background()
	if _, err := p.Authorize(ctx, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := p.Authorize(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCachedAuthenticate is an authentication answered from the cache
// (sha256 of the credential, a copy of the Caller).
func BenchmarkCachedAuthenticate(b *testing.B) {
	p, _, _ := newCacheTestPort(CacheOptions{})
	ctx := context.Background()
	if _, err := p.Authenticate(ctx, cacheCredA); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := p.Authenticate(ctx, cacheCredA); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCachedAuthorizeMany50 is a list page of 50 items, all held.
func BenchmarkCachedAuthorizeMany50(b *testing.B) {
	p, _, _ := newCacheTestPort(CacheOptions{})
	ctx := context.Background()
	reqs := make([]Request, MaxBatch)
	for i := range reqs {
		reqs[i] = cacheReadReq(cacheCallerA, fmt.Sprintf("pool_%d", i))
	}
	if _, err := p.AuthorizeMany(ctx, reqs); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := p.AuthorizeMany(ctx, reqs); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDropSessionFull is DropSession with both caches full (a scan).
func BenchmarkDropSessionFull(b *testing.B) {
	p, _, _ := newCacheTestPort(CacheOptions{})
	ctx := context.Background()
	for i := 0; i < DefaultCacheEntries; i++ {
		c := cacheCallerA
		c.SessionID = fmt.Sprintf("ses_%d", i%100)
		if _, err := p.Authorize(ctx, cacheReadReq(c, fmt.Sprintf("pool_%d", i))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		p.DropSession("ses_absent")
	}
}

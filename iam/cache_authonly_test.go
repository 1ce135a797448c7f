package iam

import (
	"context"
	"testing"
)

// An IAM host caches authentications only: its API servers cache the read
// allows, and a second cache would double their age.
func TestCacheAuthenticationsOnly(t *testing.T) {
	p, inner, _ := newCacheTestPort(CacheOptions{AuthenticationsOnly: true})
	ctx := context.Background()
	for range 2 {
		if _, err := p.Authenticate(ctx, cacheCredA); err != nil {
			t.Fatal(err)
		}
		cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, "pool_1"))
		if _, err := p.AuthorizeMany(ctx, []Request{cacheReadReq(cacheCallerA, "pool_2")}); err != nil {
			t.Fatal(err)
		}
	}
	if a, d, m := inner.count("Authenticate"), inner.count("Authorize"), inner.count("AuthorizeMany"); a != 1 || d != 2 || m != 2 {
		t.Fatalf("inner saw %d authenticate, %d authorize, %d batches; want 1, 2, 2", a, d, m)
	}
}

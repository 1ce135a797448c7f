package iam

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
)

// ---- test doubles ----

// cacheCountingPort is an iam.Port test double that counts the calls that reach
// it. Credentials it knows authenticate as the mapped Caller; a request is
// allowed unless its action contains "deny". When gate is set, every call
// blocks: it sends a fresh release channel on gate and waits until the test
// closes it.
type cacheCountingPort struct {
	mu      sync.Mutex
	calls   map[string]int
	batches [][]Request
	callers map[string]Caller // by cacheCredKey
	gate    chan chan struct{}

	authorizeErr error
	manyErr      error
	manyShort    bool // AuthorizeMany answers one decision too few
}

func newCacheCountingPort() *cacheCountingPort {
	return &cacheCountingPort{calls: map[string]int{}, callers: map[string]Caller{}}
}

func cacheCredKey(c Credential) string { return c.Authorization + "\x00" + c.Cookie }

func (f *cacheCountingPort) addCaller(cred Credential, c Caller) { f.callers[cacheCredKey(cred)] = c }

func (f *cacheCountingPort) setGate(g chan chan struct{}) {
	f.mu.Lock()
	f.gate = g
	f.mu.Unlock()
}

func (f *cacheCountingPort) enter(method string) {
	f.mu.Lock()
	f.calls[method]++
	g := f.gate
	f.mu.Unlock()
	if g != nil {
		release := make(chan struct{})
		g <- release
		<-release
	}
}

func (f *cacheCountingPort) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *cacheCountingPort) batchSizes() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n []int
	for _, b := range f.batches {
		n = append(n, len(b))
	}
	return n
}

func cacheDecide(r Request) Decision {
	if strings.Contains(r.Action, "deny") {
		return Decision{Allowed: false, Reason: ReasonDeny}
	}
	return Decision{Allowed: true, Reason: ReasonAllow}
}

func (f *cacheCountingPort) Authenticate(_ context.Context, cred Credential) (*Caller, error) {
	f.enter("Authenticate")
	f.mu.Lock()
	c, ok := f.callers[cacheCredKey(cred)]
	f.mu.Unlock()
	if !ok {
		return nil, core.Errorf(core.CodeUnauthn, "unknown credential")
	}
	c.SourceIP = cred.SourceIP
	return &c, nil
}

func (f *cacheCountingPort) Authorize(_ context.Context, req Request) (Decision, error) {
	f.enter("Authorize")
	if f.authorizeErr != nil {
		return Decision{}, f.authorizeErr
	}
	return cacheDecide(req), nil
}

func (f *cacheCountingPort) Require(_ context.Context, req Request) error {
	f.enter("Require")
	if !cacheDecide(req).Allowed {
		return core.Errorf(core.CodeAccessDenied, "denied")
	}
	return nil
}

func (f *cacheCountingPort) AuthorizeMany(_ context.Context, reqs []Request) ([]Decision, error) {
	f.enter("AuthorizeMany")
	f.mu.Lock()
	f.batches = append(f.batches, append([]Request(nil), reqs...))
	f.mu.Unlock()
	if len(reqs) > MaxBatch {
		return nil, core.Errorf(core.CodeInvalidInput, "batch of %d", len(reqs))
	}
	if f.manyErr != nil {
		return nil, f.manyErr
	}
	out := make([]Decision, 0, len(reqs))
	for _, r := range reqs {
		out = append(out, cacheDecide(r))
	}
	if f.manyShort {
		out = out[:len(out)-1]
	}
	return out, nil
}

type cacheRefreshingPort struct {
	*cacheCountingPort
	refreshed []Resource
}

func (r *cacheRefreshingPort) RefreshResource(_ context.Context, _ string, res Resource) error {
	r.refreshed = append(r.refreshed, res)
	return nil
}

type cacheClock struct {
	mu sync.Mutex
	t  time.Time
}

func newCacheClock() *cacheClock {
	return &cacheClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *cacheClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *cacheClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// ---- fixtures ----

var (
	cacheCredA  = Credential{Authorization: "Bearer bc_a", SourceIP: "10.0.0.1"}
	cacheCredA2 = Credential{Cookie: "iam_session=a2", SourceIP: "10.0.0.2"}
	cacheCredB  = Credential{Authorization: "Bearer bc_b", SourceIP: "10.0.0.3"}
	cacheCredG  = Credential{Authorization: "Bearer bc_agent", SourceIP: "10.0.0.4"}

	cacheCallerA  = Caller{TenantID: "ten_1", IdentityID: "idn_a", IdentityKind: KindPerson, SessionID: "ses_a", SessionKind: SessionUser, MFA: true}
	cacheCallerA2 = Caller{TenantID: "ten_1", IdentityID: "idn_a", IdentityKind: KindPerson, SessionID: "ses_a2", SessionKind: SessionUser}
	cacheCallerB  = Caller{TenantID: "ten_1", IdentityID: "idn_b", IdentityKind: KindService, SessionID: "ses_b", SessionKind: SessionService}
	cacheCallerG  = Caller{TenantID: "ten_1", IdentityID: "idn_agent", IdentityKind: KindAgent, SessionID: "ses_g", SessionKind: SessionAgent, AgentID: "idn_agent", DelegatedBy: "idn_a"}
)

func newCacheTestPort(opts CacheOptions) (*CachingPort, *cacheCountingPort, *cacheClock) {
	inner := newCacheCountingPort()
	inner.addCaller(cacheCredA, cacheCallerA)
	inner.addCaller(cacheCredA2, cacheCallerA2)
	inner.addCaller(cacheCredB, cacheCallerB)
	inner.addCaller(cacheCredG, cacheCallerG)
	clock := newCacheClock()
	if opts.Now == nil {
		opts.Now = clock.Now
	}
	return NewCachingPort(inner, opts), inner, clock
}

func cacheReadReq(c Caller, id string) Request {
	return Request{Caller: &c, TenantID: c.TenantID, Action: "compute:pools:read", Resource: Resource{Type: "compute-pool", ID: id}}
}

func cacheMustAuthorize(t *testing.T, p Port, r Request) Decision {
	t.Helper()
	d, err := p.Authorize(context.Background(), r)
	if err != nil {
		t.Fatalf("Authorize(%v): %v", r.Resource, err)
	}
	return d
}

func cacheMustAuthenticate(t *testing.T, p Port, cred Credential) *Caller {
	t.Helper()
	c, err := p.Authenticate(context.Background(), cred)
	if err != nil {
		t.Fatalf("Authenticate: %v", err)
	}
	return c
}

// ---- authentications ----

func TestCacheAuthenticate(t *testing.T) {
	known := func(auth, cookie string) Credential { return Credential{Authorization: auth, Cookie: cookie} }
	tests := []struct {
		name          string
		known         []Credential // credentials the inner port accepts (as cacheCallerB)
		first, second Credential
		wantCalls     int
		wantErr       *core.Error // of both calls
	}{
		{name: "success is cached", first: cacheCredA, second: cacheCredA, wantCalls: 1},
		{name: "another source IP still hits", first: cacheCredA, second: Credential{Authorization: cacheCredA.Authorization, SourceIP: "192.0.2.9"}, wantCalls: 1},
		{name: "request id and agent do not matter", first: cacheCredA, second: Credential{Authorization: cacheCredA.Authorization, RequestID: "req_2", UserAgent: "x"}, wantCalls: 1},
		{name: "another token misses", first: cacheCredA, second: cacheCredB, wantCalls: 2},
		{name: "a cookie added misses", first: cacheCredA, second: Credential{Authorization: cacheCredA.Authorization, Cookie: "c"}, known: []Credential{known(cacheCredA.Authorization, "c")}, wantCalls: 2},
		{name: "different splits never collide", first: known("Bearer ab", "c"), second: known("Bearer a", "bc"), known: []Credential{known("Bearer ab", "c"), known("Bearer a", "bc")}, wantCalls: 2},
		{name: "failure is not cached", first: known("Bearer nope", ""), second: known("Bearer nope", ""), wantCalls: 2, wantErr: core.ErrUnauthn},
		{name: "no credential goes to inner", first: Credential{}, second: Credential{}, wantCalls: 2, wantErr: core.ErrUnauthn},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, inner, _ := newCacheTestPort(CacheOptions{})
			for _, c := range tt.known {
				inner.addCaller(c, cacheCallerB)
			}
			for _, cred := range []Credential{tt.first, tt.second} {
				c, err := p.Authenticate(context.Background(), cred)
				if tt.wantErr != nil {
					if !errors.Is(err, tt.wantErr) {
						t.Fatalf("err = %v, want %v", err, tt.wantErr)
					}
					continue
				}
				if err != nil {
					t.Fatalf("Authenticate: %v", err)
				}
				if c.SourceIP != cred.SourceIP {
					t.Errorf("SourceIP = %q, want the current request's %q", c.SourceIP, cred.SourceIP)
				}
			}
			if got := inner.count("Authenticate"); got != tt.wantCalls {
				t.Errorf("inner Authenticate calls = %d, want %d", got, tt.wantCalls)
			}
			s := p.Stats().Authentications
			if tt.wantErr == nil && s.Hits+s.Misses != 2 {
				t.Errorf("hits+misses = %d+%d, want 2", s.Hits, s.Misses)
			}
			if tt.wantErr != nil && s.Entries != 0 {
				t.Errorf("entries = %d after failures, want 0", s.Entries)
			}
		})
	}
}

func TestCacheAuthenticateCopies(t *testing.T) {
	p, inner, _ := newCacheTestPort(CacheOptions{})
	first := cacheMustAuthenticate(t, p, cacheCredA)
	// A caller of the port mutating its Caller must not change the cache.
	first.IdentityID = "idn_mallory"
	first.RootAuthority = true
	first.SourceIP = "203.0.113.66"

	second := cacheMustAuthenticate(t, p, Credential{Authorization: cacheCredA.Authorization, SourceIP: "10.9.9.9"})
	if second == first {
		t.Fatal("two calls got the same *Caller")
	}
	want := cacheCallerA
	want.SourceIP = "10.9.9.9"
	if *second != want {
		t.Fatalf("cached caller = %+v, want %+v", *second, want)
	}
	third := cacheMustAuthenticate(t, p, Credential{Authorization: cacheCredA.Authorization})
	if third.SourceIP != "" {
		t.Fatalf("SourceIP = %q leaked from an earlier request", third.SourceIP)
	}
	if n := inner.count("Authenticate"); n != 1 {
		t.Fatalf("inner calls = %d, want 1", n)
	}
}

// ---- read decisions ----

func TestCacheAuthorize(t *testing.T) {
	base := cacheReadReq(cacheCallerA, "pool_1")
	with := func(f func(r *Request)) Request {
		r := base
		c := *base.Caller
		r.Caller = &c
		f(&r)
		return r
	}
	deny := with(func(r *Request) { r.Action = "compute:pools:deny" })
	tests := []struct {
		name          string
		first, second Request
		innerErr      error
		wantCalls     int
		wantAllowed   bool
	}{
		{name: "allow is cached", first: base, second: base, wantCalls: 1, wantAllowed: true},
		{name: "same key, another caller copy", first: base, second: with(func(r *Request) { r.Context = map[string]any{"k": 1} }), wantCalls: 1, wantAllowed: true},
		{name: "deny is never cached", first: deny, second: deny, wantCalls: 2},
		{name: "error is never cached", first: base, second: base, innerErr: core.Errorf(core.CodeNotFound, "gone"), wantCalls: 2},
		{name: "another session misses", first: base, second: with(func(r *Request) { r.Caller.SessionID = "ses_other" }), wantCalls: 2, wantAllowed: true},
		{name: "another tenant misses", first: base, second: with(func(r *Request) { r.TenantID = "ten_root" }), wantCalls: 2, wantAllowed: true},
		{name: "another action misses", first: base, second: with(func(r *Request) { r.Action = "compute:pools:list" }), wantCalls: 2, wantAllowed: true},
		{name: "another type misses", first: base, second: with(func(r *Request) { r.Resource.Type = "compute-node" }), wantCalls: 2, wantAllowed: true},
		{name: "another id misses", first: base, second: with(func(r *Request) { r.Resource.ID = "pool_2" }), wantCalls: 2, wantAllowed: true},
		{name: "no caller is not cached", first: with(func(r *Request) { r.Caller = nil }), second: with(func(r *Request) { r.Caller = nil }), wantCalls: 2, wantAllowed: true},
		{name: "no session is not cached", first: with(func(r *Request) { r.Caller.SessionID = "" }), second: with(func(r *Request) { r.Caller.SessionID = "" }), wantCalls: 2, wantAllowed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, inner, _ := newCacheTestPort(CacheOptions{})
			inner.authorizeErr = tt.innerErr
			for _, r := range []Request{tt.first, tt.second} {
				d, err := p.Authorize(context.Background(), r)
				if tt.innerErr != nil {
					if !errors.Is(err, tt.innerErr) {
						t.Fatalf("err = %v, want %v", err, tt.innerErr)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed != tt.wantAllowed {
					t.Fatalf("Allowed = %v, want %v", d.Allowed, tt.wantAllowed)
				}
			}
			if got := inner.count("Authorize"); got != tt.wantCalls {
				t.Errorf("inner Authorize calls = %d, want %d", got, tt.wantCalls)
			}
		})
	}
}

func TestCacheRequireNeverCached(t *testing.T) {
	p, inner, _ := newCacheTestPort(CacheOptions{})
	r := cacheReadReq(cacheCallerA, "pool_1")
	r.Action = "compute:pools:update"
	cacheMustAuthorize(t, p, r) // an allow for the same key is held...
	for i := 0; i < 3; i++ {
		if err := p.Require(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	if n := inner.count("Require"); n != 3 { // ...and Require still always asks
		t.Fatalf("inner Require calls = %d, want 3", n)
	}
	r.Action = "compute:pools:deny"
	if err := p.Require(context.Background(), r); !errors.Is(err, core.ErrAccessDenied) {
		t.Fatalf("Require deny = %v", err)
	}
	if s := p.Stats().Decisions; s.Entries != 1 || s.Hits != 0 {
		t.Fatalf("Require touched the decision cache: %+v", s)
	}
}

// ---- lifetimes and the cap ----

func TestCacheTTL(t *testing.T) {
	tests := []struct {
		name      string
		opts      CacheOptions
		auth      bool // the authentication cache, else the decision cache
		steps     []time.Duration
		wantCalls int
	}{
		{name: "auth just inside 30 s", auth: true, steps: []time.Duration{30*time.Second - time.Nanosecond}, wantCalls: 1},
		{name: "auth expires at 30 s", auth: true, steps: []time.Duration{30 * time.Second}, wantCalls: 2},
		{name: "decision just inside 10 s", steps: []time.Duration{10*time.Second - time.Nanosecond}, wantCalls: 1},
		{name: "decision expires at 10 s", steps: []time.Duration{10 * time.Second}, wantCalls: 2},
		{name: "a hit does not extend the lifetime", steps: []time.Duration{6 * time.Second, 6 * time.Second}, wantCalls: 2},
		{name: "configured auth lifetime", opts: CacheOptions{AuthTTL: time.Second}, auth: true, steps: []time.Duration{time.Second}, wantCalls: 2},
		{name: "configured decision lifetime", opts: CacheOptions{DecisionTTL: time.Minute}, steps: []time.Duration{50 * time.Second}, wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, inner, clock := newCacheTestPort(tt.opts)
			call := func() {
				if tt.auth {
					cacheMustAuthenticate(t, p, cacheCredA)
				} else {
					cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, "pool_1"))
				}
			}
			call()
			for _, d := range tt.steps {
				clock.Advance(d)
				call()
			}
			method := "Authorize"
			if tt.auth {
				method = "Authenticate"
			}
			if got := inner.count(method); got != tt.wantCalls {
				t.Fatalf("inner %s calls = %d, want %d", method, got, tt.wantCalls)
			}
		})
	}
}

func TestCacheStatsCollectsExpired(t *testing.T) {
	p, _, clock := newCacheTestPort(CacheOptions{})
	cacheMustAuthenticate(t, p, cacheCredA)
	cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, "pool_1"))
	clock.Advance(10 * time.Second)
	s := p.Stats()
	if s.Authentications.Entries != 1 || s.Decisions.Entries != 0 || s.Decisions.Expirations != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestCacheLRUEviction(t *testing.T) {
	tests := []struct {
		name      string
		touch     bool // use the first entry again before the one over the cap
		wantEvict string
	}{
		{name: "least recently stored goes first", wantEvict: "pool_1"},
		{name: "a recent hit keeps an entry", touch: true, wantEvict: "pool_2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, inner, _ := newCacheTestPort(CacheOptions{MaxDecisions: 3})
			for _, id := range []string{"pool_1", "pool_2", "pool_3"} {
				cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, id))
			}
			if tt.touch {
				cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, "pool_1"))
			}
			cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, "pool_4"))
			s := p.Stats().Decisions
			if s.Entries != 3 || s.Evictions != 1 {
				t.Fatalf("entries=%d evictions=%d, want 3 and 1", s.Entries, s.Evictions)
			}
			for _, id := range []string{"pool_1", "pool_2", "pool_3", "pool_4"} {
				before := inner.count("Authorize")
				cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, id))
				reached := inner.count("Authorize") > before
				if reached != (id == tt.wantEvict) {
					t.Errorf("%s reached inner = %v, want %v", id, reached, id == tt.wantEvict)
				}
				if reached {
					break // re-storing it evicts another; the rest were checked
				}
			}
		})
	}

	t.Run("authentications", func(t *testing.T) {
		p, inner, _ := newCacheTestPort(CacheOptions{MaxAuthentications: 2})
		cacheMustAuthenticate(t, p, cacheCredA)
		cacheMustAuthenticate(t, p, cacheCredA2)
		cacheMustAuthenticate(t, p, cacheCredB) // evicts cacheCredA
		cacheMustAuthenticate(t, p, cacheCredB)
		cacheMustAuthenticate(t, p, cacheCredA2)
		if n := inner.count("Authenticate"); n != 3 {
			t.Fatalf("inner calls = %d, want 3", n)
		}
		cacheMustAuthenticate(t, p, cacheCredA)
		if n := inner.count("Authenticate"); n != 4 {
			t.Fatalf("evicted credential did not reach inner: calls = %d", n)
		}
		if s := p.Stats().Authentications; s.Evictions != 2 || s.Entries != 2 {
			t.Fatalf("stats = %+v", s)
		}
	})

	t.Run("defaults", func(t *testing.T) {
		p, _, _ := newCacheTestPort(CacheOptions{})
		if p.auth.limit != DefaultCacheEntries || p.dec.limit != DefaultCacheEntries ||
			p.auth.ttl != 30*time.Second || p.dec.ttl != 10*time.Second {
			t.Fatalf("defaults: auth %d/%v dec %d/%v", p.auth.limit, p.auth.ttl, p.dec.limit, p.dec.ttl)
		}
	})
}

// ---- invalidation ----

var (
	cacheCreds   = map[string]Credential{"A": cacheCredA, "A2": cacheCredA2, "B": cacheCredB, "G": cacheCredG}
	cacheCallers = map[string]Caller{"A": cacheCallerA, "A2": cacheCallerA2, "B": cacheCallerB, "G": cacheCallerG}
	cacheNames   = []string{"A", "A2", "B", "G"}
)

func TestCacheDrops(t *testing.T) {
	tests := []struct {
		name         string
		drop         func(p *CachingPort)
		wantAuthGone string // cacheNames whose authentication is dropped
		wantDecGone  string // cacheNames whose decisions are dropped
	}{
		{name: "DropIdentity", drop: func(p *CachingPort) { p.DropIdentity("idn_a") }, wantAuthGone: "A A2 G", wantDecGone: "A A2 G"},
		{name: "DropIdentity of the agent", drop: func(p *CachingPort) { p.DropIdentity("idn_agent") }, wantAuthGone: "G", wantDecGone: "G"},
		{name: "DropIdentity unknown", drop: func(p *CachingPort) { p.DropIdentity("idn_zzz") }},
		{name: "DropIdentity empty", drop: func(p *CachingPort) { p.DropIdentity("") }},
		{name: "DropSession", drop: func(p *CachingPort) { p.DropSession("ses_a") }, wantAuthGone: "A", wantDecGone: "A"},
		{name: "DropSession empty", drop: func(p *CachingPort) { p.DropSession("") }},
		{name: "DropDecisions", drop: func(p *CachingPort) { p.DropDecisions() }, wantDecGone: "A A2 B G"},
		{name: "Clear", drop: func(p *CachingPort) { p.Clear() }, wantAuthGone: "A A2 B G", wantDecGone: "A A2 B G"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, inner, _ := newCacheTestPort(CacheOptions{})
			for _, n := range cacheNames {
				cacheMustAuthenticate(t, p, cacheCreds[n])
				cacheMustAuthorize(t, p, cacheReadReq(cacheCallers[n], "pool_1"))
				cacheMustAuthorize(t, p, cacheReadReq(cacheCallers[n], "pool_2"))
			}
			tt.drop(p)
			gone := func(list, n string) bool { return strings.Contains(" "+list+" ", " "+n+" ") }
			for _, n := range cacheNames {
				before := inner.count("Authenticate")
				cacheMustAuthenticate(t, p, cacheCreds[n])
				if got, want := inner.count("Authenticate") > before, gone(tt.wantAuthGone, n); got != want {
					t.Errorf("authentication of %s reached inner = %v, want %v", n, got, want)
				}
				for _, id := range []string{"pool_1", "pool_2"} {
					before := inner.count("Authorize")
					cacheMustAuthorize(t, p, cacheReadReq(cacheCallers[n], id))
					if got, want := inner.count("Authorize") > before, gone(tt.wantDecGone, n); got != want {
						t.Errorf("decision of %s on %s reached inner = %v, want %v", n, id, got, want)
					}
				}
			}
		})
	}
}

// TestCacheDropInFlight races a drop against a call blocked in the inner
// port: the call started before the drop and finishes after it, so its
// (older) answer must not be stored.
func TestCacheDropInFlight(t *testing.T) {
	type op struct {
		name   string
		call   func(t *testing.T, p *CachingPort)
		method string
		auth   bool
	}
	ops := []op{
		{name: "Authenticate", method: "Authenticate", auth: true, call: func(t *testing.T, p *CachingPort) { cacheMustAuthenticate(t, p, cacheCredA) }},
		{name: "Authorize", method: "Authorize", call: func(t *testing.T, p *CachingPort) { cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, "pool_1")) }},
		{name: "AuthorizeMany", method: "AuthorizeMany", call: func(t *testing.T, p *CachingPort) {
			if _, err := p.AuthorizeMany(context.Background(), []Request{cacheReadReq(cacheCallerA, "pool_1"), cacheReadReq(cacheCallerA, "pool_2")}); err != nil {
				t.Error(err)
			}
		}},
		{name: "Authorize as agent", method: "Authorize", call: func(t *testing.T, p *CachingPort) { cacheMustAuthorize(t, p, cacheReadReq(cacheCallerG, "pool_1")) }},
	}
	drops := []struct {
		name      string
		drop      func(p *CachingPort)
		keepsAuth bool // an authentication in flight is still stored
		keepsDec  bool // a decision in flight is still stored
	}{
		{name: "DropSession", drop: func(p *CachingPort) { p.DropSession("ses_a"); p.DropSession("ses_g") }},
		{name: "DropIdentity", drop: func(p *CachingPort) { p.DropIdentity("idn_a") }},
		{name: "DropDecisions", drop: func(p *CachingPort) { p.DropDecisions() }, keepsAuth: true},
		{name: "Clear", drop: func(p *CachingPort) { p.Clear() }},
		{name: "DropSession of another", drop: func(p *CachingPort) { p.DropSession("ses_b") }, keepsAuth: true, keepsDec: true},
		{name: "DropIdentity of another", drop: func(p *CachingPort) { p.DropIdentity("idn_b") }, keepsAuth: true, keepsDec: true},
	}
	for _, o := range ops {
		for _, d := range drops {
			t.Run(o.name+"/"+d.name, func(t *testing.T) {
				p, inner, _ := newCacheTestPort(CacheOptions{})
				gate := make(chan chan struct{})
				inner.setGate(gate)

				done := make(chan struct{})
				go func() {
					defer close(done)
					o.call(t, p)
				}()
				release := <-gate // the call is inside inner now
				d.drop(p)
				close(release)
				<-done
				inner.setGate(nil)

				wantKept := d.keepsDec
				if o.auth {
					wantKept = d.keepsAuth
				}
				st := p.Stats()
				cs := st.Decisions
				if o.auth {
					cs = st.Authentications
				}
				if wantKept && cs.Discarded != 0 || !wantKept && cs.Discarded == 0 {
					t.Errorf("discarded = %d, want kept %v", cs.Discarded, wantKept)
				}

				o.call(t, p) // the next call reaches inner unless the answer was kept
				want := 2
				if wantKept {
					want = 1
				}
				if got := inner.count(o.method); got != want {
					t.Errorf("inner %s calls = %d, want %d", o.method, got, want)
				}
				o.call(t, p) // and an answer fetched after the drop is cached
				if got := inner.count(o.method); got != want {
					t.Errorf("after refill: inner %s calls = %d, want %d", o.method, got, want)
				}
				cacheAssertNoFlights(t, p)
			})
		}
	}
}

// TestCacheDropBetweenFlights: a drop between two flights discards the older
// flight's answer and keeps the newer one's, whichever lands first.
func TestCacheDropBetweenFlights(t *testing.T) {
	for _, olderFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("older lands first %v", olderFirst), func(t *testing.T) {
			p, inner, _ := newCacheTestPort(CacheOptions{})
			gate := make(chan chan struct{})
			inner.setGate(gate)
			start := func(id string) chan struct{} {
				done := make(chan struct{})
				go func() { defer close(done); cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, id)) }()
				return done
			}
			oldDone := start("pool_old")
			oldRelease := <-gate
			p.DropSession("ses_a")
			newDone := start("pool_new")
			newRelease := <-gate
			if olderFirst {
				close(oldRelease)
				<-oldDone
			}
			close(newRelease)
			<-newDone
			if !olderFirst {
				close(oldRelease)
				<-oldDone
			}
			inner.setGate(nil)

			cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, "pool_new"))
			if n := inner.count("Authorize"); n != 2 {
				t.Fatalf("answer of the flight after the drop was not cached: calls = %d", n)
			}
			cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, "pool_old"))
			if n := inner.count("Authorize"); n != 3 {
				t.Fatalf("answer of the flight before the drop was cached: calls = %d", n)
			}
			cacheAssertNoFlights(t, p)
		})
	}
}

// TestCacheMarksBounded: a call stuck in inner while many drops go by keeps
// the marks bounded; past the bound the stuck answer is discarded anyway.
func TestCacheMarksBounded(t *testing.T) {
	p, inner, _ := newCacheTestPort(CacheOptions{})
	gate := make(chan chan struct{})
	inner.setGate(gate)
	done := make(chan struct{})
	go func() { defer close(done); cacheMustAuthorize(t, p, cacheReadReq(cacheCallerB, "pool_1")) }()
	release := <-gate
	for i := 0; i < 3*maxMarks; i++ {
		p.DropSession(fmt.Sprintf("ses_%d", i))
	}
	p.mu.Lock()
	n := len(p.sessionDroppedAt) + len(p.identityDroppedAt)
	p.mu.Unlock()
	if n > maxMarks {
		t.Fatalf("%d marks held, more than %d", n, maxMarks)
	}
	close(release)
	<-done
	inner.setGate(nil)
	if s := p.Stats().Decisions; s.Discarded != 1 || s.Entries != 0 {
		t.Fatalf("stuck answer after the marks collapsed: %+v", s)
	}
	cacheAssertNoFlights(t, p)
}

func cacheAssertNoFlights(t *testing.T, p *CachingPort) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.inflight) != 0 || p.identityDroppedAt != nil || p.sessionDroppedAt != nil {
		t.Fatalf("after every call landed: inflight=%v identity marks=%v session marks=%v",
			p.inflight, p.identityDroppedAt, p.sessionDroppedAt)
	}
}

// ---- AuthorizeMany ----

func TestCacheAuthorizeMany(t *testing.T) {
	reqs := func(n int, action string) []Request {
		out := make([]Request, n)
		for i := range out {
			out[i] = cacheReadReq(cacheCallerA, fmt.Sprintf("pool_%03d", i))
			if action != "" && i%2 == 1 {
				out[i].Action = action
			}
		}
		return out
	}
	tests := []struct {
		name        string
		warm        []int // indexes answered by Authorize first (allows get cached)
		n           int
		oddAction   string // the action of odd requests
		short       bool
		manyErr     error
		wantErr     *core.Error
		wantBatches []int
		anyBatches  bool // the batches sent are not checked
		wantCached  int  // allows held afterwards
	}{
		{name: "empty", n: 0},
		{name: "all held", n: 3, warm: []int{0, 1, 2}, wantCached: 3},
		{name: "held answered locally, rest in one call", n: 6, warm: []int{0, 3, 5}, wantBatches: []int{3}, wantCached: 6},
		{name: "denies are not cached", n: 6, oddAction: "compute:pools:deny", warm: []int{0}, wantBatches: []int{5}, wantCached: 3},
		{name: "split into batches of 50", n: 120, wantBatches: []int{20, 50, 50}, wantCached: 120},
		{name: "held ones are left out of the batches", n: 55, warm: []int{1, 2, 3, 4, 5}, wantBatches: []int{50}, wantCached: 55},
		{name: "exactly 50", n: 50, wantBatches: []int{50}, wantCached: 50},
		{name: "51", n: 51, wantBatches: []int{1, 50}, wantCached: 51},
		{name: "length mismatch is INTERNAL_ERROR", n: 4, short: true, wantErr: core.ErrInternal, wantBatches: []int{4}},
		// Which of the two concurrent batches goes out before the other's
		// failure cancels it varies: only the failure and what is cached
		// are checked.
		{name: "a short batch fails the whole call", n: 60, short: true, wantErr: core.ErrInternal, anyBatches: true},
		{name: "an inner error aborts and caches nothing", n: 4, manyErr: core.Errorf(core.CodeNotFound, "no pool"), wantErr: core.ErrNotFound, wantBatches: []int{4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, inner, _ := newCacheTestPort(CacheOptions{})
			rs := reqs(tt.n, tt.oddAction)
			for _, i := range tt.warm {
				cacheMustAuthorize(t, p, rs[i])
			}
			inner.manyShort, inner.manyErr = tt.short, tt.manyErr
			got, err := p.AuthorizeMany(context.Background(), rs)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(rs) {
					t.Fatalf("%d decisions for %d requests", len(got), len(rs))
				}
				for i, r := range rs {
					if got[i] != cacheDecide(r) {
						t.Fatalf("decision %d = %+v, want %+v (order lost)", i, got[i], cacheDecide(r))
					}
				}
			}
			// The batches go out concurrently: their sizes, not their order.
			sizes := inner.batchSizes()
			slices.Sort(sizes)
			if !tt.anyBatches && fmt.Sprint(sizes) != fmt.Sprint(tt.wantBatches) {
				t.Fatalf("inner batches %v, want %v", sizes, tt.wantBatches)
			}
			// Only misses went to inner, each once.
			seen := map[string]bool{}
			inner.mu.Lock()
			for _, b := range inner.batches {
				for _, r := range b {
					if seen[r.Resource.ID] {
						t.Errorf("%s sent twice", r.Resource.ID)
					}
					seen[r.Resource.ID] = true
				}
			}
			inner.mu.Unlock()
			for _, i := range tt.warm {
				if seen[rs[i].Resource.ID] {
					t.Errorf("held %s was sent to inner", rs[i].Resource.ID)
				}
			}
			wantCached := tt.wantCached
			if tt.wantErr != nil {
				wantCached = len(tt.warm)
			}
			if s := p.Stats().Decisions; s.Entries != wantCached {
				t.Fatalf("entries = %d, want %d", s.Entries, wantCached)
			}
		})
	}
}

func TestCacheAuthorizeManyUncacheable(t *testing.T) {
	p, inner, _ := newCacheTestPort(CacheOptions{})
	noSession := cacheReadReq(Caller{TenantID: "ten_1", IdentityID: "idn_x"}, "pool_1")
	rs := []Request{noSession, {TenantID: "ten_1", Action: "compute:pools:read"}, cacheReadReq(cacheCallerA, "pool_1")}
	for i := 0; i < 2; i++ {
		if _, err := p.AuthorizeMany(context.Background(), rs); err != nil {
			t.Fatal(err)
		}
	}
	if sizes := inner.batchSizes(); fmt.Sprint(sizes) != "[3 2]" {
		t.Fatalf("batches %v, want [3 2]", sizes)
	}
}

// ---- Refresher ----

func TestCachePortRefresher(t *testing.T) {
	plain := NewCachingPort(newCacheCountingPort(), CacheOptions{})
	if _, ok := plain.Port().(Refresher); ok {
		t.Fatal("Port() of an inner port without RefreshResource implements Refresher")
	}
	if _, ok := plain.Refresher(); ok {
		t.Fatal("Refresher() reported one for an inner port without it")
	}
	var _ Port = plain.Port()

	inner := &cacheRefreshingPort{cacheCountingPort: newCacheCountingPort()}
	inner.addCaller(cacheCredA, cacheCallerA)
	cp := NewCachingPort(inner, CacheOptions{})
	port := cp.Port()
	r, ok := port.(Refresher)
	if !ok {
		t.Fatal("Port() of a refreshing inner port does not implement Refresher")
	}
	res := Resource{Type: "compute-pool", ID: "pool_1"}
	if err := r.RefreshResource(context.Background(), "ten_1", res); err != nil || len(inner.refreshed) != 1 || inner.refreshed[0] != res {
		t.Fatalf("refresh not passed through: %v %v", err, inner.refreshed)
	}
	if rr, ok := cp.Refresher(); !ok || rr != Refresher(inner) {
		t.Fatal("Refresher() did not return the inner port")
	}
	// The view shares the caches.
	cacheMustAuthenticate(t, port, cacheCredA)
	cacheMustAuthenticate(t, cp, cacheCredA)
	if n := inner.count("Authenticate"); n != 1 {
		t.Fatalf("view and port do not share the cache: %d calls", n)
	}
}

// ---- concurrency ----

func TestCacheConcurrentUse(t *testing.T) {
	p, inner, clock := newCacheTestPort(CacheOptions{MaxAuthentications: 3, MaxDecisions: 20})
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			ctx := context.Background()
			for i := 0; i < 400; i++ {
				n := cacheNames[(g+i)%len(cacheNames)]
				switch i % 9 {
				case 0:
					p.DropSession(cacheCallers[n].SessionID)
				case 1:
					p.DropIdentity(cacheCallers[n].IdentityID)
				case 2:
					if i%45 == 2 {
						p.Clear()
					} else {
						p.DropDecisions()
					}
				case 3:
					_ = p.Stats()
					clock.Advance(time.Second)
				case 4, 5:
					c, err := p.Authenticate(ctx, cacheCreds[n])
					if err != nil || c.SessionID != cacheCallers[n].SessionID || c.SourceIP != cacheCreds[n].SourceIP {
						t.Errorf("Authenticate %s = %+v, %v", n, c, err)
						return
					}
					c.IdentityID = "mutated"
				case 6:
					rs := make([]Request, 0, 70)
					for j := 0; j < 70; j++ {
						rs = append(rs, cacheReadReq(cacheCallers[n], fmt.Sprintf("pool_%d", (i+j)%30)))
					}
					if _, err := p.AuthorizeMany(ctx, rs); err != nil {
						t.Error(err)
						return
					}
				default:
					if d, err := p.Authorize(ctx, cacheReadReq(cacheCallers[n], fmt.Sprintf("pool_%d", i%30))); err != nil || !d.Allowed {
						t.Errorf("Authorize = %v, %v", d, err)
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	cacheAssertNoFlights(t, p)
	for _, n := range cacheNames {
		if c := cacheMustAuthenticate(t, p, cacheCreds[n]); c.IdentityID != cacheCallers[n].IdentityID {
			t.Fatalf("a caller's mutation reached the cache: %+v", c)
		}
	}
	if inner.count("Authenticate") == 0 {
		t.Fatal("inner never called")
	}
}

// TestCachePrunesMarks: marks older than every flight in the air are
// forgotten while other flights are still in flight, and the ones a flight
// needs are kept.
func TestCachePrunesMarks(t *testing.T) {
	p, inner, _ := newCacheTestPort(CacheOptions{})
	gate := make(chan chan struct{})
	inner.setGate(gate)
	start := func(r Request) chan struct{} {
		done := make(chan struct{})
		go func() { defer close(done); cacheMustAuthorize(t, p, r) }()
		return done
	}
	marks := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.sessionDroppedAt) + len(p.identityDroppedAt)
	}

	oldDone := start(cacheReadReq(cacheCallerB, "pool_1"))
	oldRelease := <-gate
	for i := 0; i < 200; i++ {
		p.DropSession(fmt.Sprintf("ses_old_%d", i))
	}
	newDone := start(cacheReadReq(cacheCallerA, "pool_2"))
	newRelease := <-gate
	close(oldRelease)
	<-oldDone
	for i := 0; i < 100; i++ {
		p.DropSession(fmt.Sprintf("ses_new_%d", i))
	}
	if n := marks(); n > 100 {
		t.Fatalf("%d marks held; the 200 older than every flight were not pruned", n)
	}
	p.DropSession("ses_a")
	close(newRelease)
	<-newDone
	inner.setGate(nil)

	cacheMustAuthorize(t, p, cacheReadReq(cacheCallerB, "pool_1"))
	cacheMustAuthorize(t, p, cacheReadReq(cacheCallerA, "pool_2"))
	if n := inner.count("Authorize"); n != 3 {
		t.Fatalf("inner calls = %d, want 3 (B kept, A discarded)", n)
	}
	cacheAssertNoFlights(t, p)
}

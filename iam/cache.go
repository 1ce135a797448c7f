package iam

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"
)

// The two caches in front of IAM ("Caches" in the actions-and-resources
// spec):
//
//	Authentications  sha256 of the Authorization header and the IAM cookie  30 s  the Caller
//	Read decisions   session, source address, tenant, action, type and id   10 s  allows only
//
// Both hold at most 10 000 entries, least recently used out first.
// Mutations (Require) are never cached. Every drop also discards the answers
// that were in flight when it happened, so a revocation is never overwritten
// by an older allow.
//
// Each cache is golang-lru's lock-free simplelru with a lifetime per entry
// read against the injected clock (see lru below for why not expirable).

// Defaults for CacheOptions.
const (
	DefaultAuthTTL      = 30 * time.Second
	DefaultDecisionTTL  = 10 * time.Second
	DefaultCacheEntries = 10_000
)

// CacheOptions configures NewCachingPort. Zero (or negative) fields take the
// defaults.
type CacheOptions struct {
	AuthTTL            time.Duration    // lifetime of an authentication; DefaultAuthTTL
	DecisionTTL        time.Duration    // lifetime of a read allow; DefaultDecisionTTL
	MaxAuthentications int              // DefaultCacheEntries
	MaxDecisions       int              // DefaultCacheEntries
	Now                func() time.Time // the clock; time.Now
	// AuthenticationsOnly caches no decisions: for an IAM host, whose API
	// servers already cache read allows (two caches would double their age).
	AuthenticationsOnly bool
}

// CacheCounters are one cache's statistics. Entries is the number held now;
// the others count since the port was made (Clear does not reset them).
type CacheCounters struct {
	Entries     int    `json:"entries"`
	Hits        uint64 `json:"hits"`
	Misses      uint64 `json:"misses"`
	Evictions   uint64 `json:"evictions"`   // least recently used out at the cap
	Expirations uint64 `json:"expirations"` // removed because their lifetime ended
	Discarded   uint64 `json:"discarded"`   // answers not stored because a drop happened while they were in flight
}

// CacheStats are the statistics of both caches.
type CacheStats struct {
	Authentications CacheCounters `json:"authentications"`
	Decisions       CacheCounters `json:"decisions"`
}

// CachingPort is an iam.Port that caches successful authentications and read
// allows of an inner Port. It is safe for concurrent use.
//
// It has no RefreshResource method of its own, so that a type assertion to
// Refresher never succeeds for an inner port that cannot refresh; use Port()
// to get a view that implements Refresher exactly when the inner port does,
// or Refresher() to reach the inner Refresher directly.
type CachingPort struct {
	inner    Port
	now      func() time.Time
	authOnly bool // AuthenticationsOnly

	mu   sync.Mutex
	auth *lru[[sha256.Size]byte, authEntry]
	dec  *lru[decisionKey, decisionEntry]

	// Drop generations. epoch is a global sequence bumped by every drop; a
	// call to inner captures it before it starts (its flight's start) and
	// stores its answer only if no drop that concerns the answer has a
	// sequence number above the start. authDroppedAt and decDroppedAt are the
	// global generations (Clear, DropDecisions); identityDroppedAt and
	// sessionDroppedAt hold the per-identity and per-session ones, and only
	// while some call is in flight that started before them (see prune).
	epoch             uint64
	authDroppedAt     uint64
	decDroppedAt      uint64
	identityDroppedAt map[string]uint64
	sessionDroppedAt  map[string]uint64
	inflight          map[uint64]int // start epoch -> calls to inner in flight
	pruneAt           int

	latency *prometheus.HistogramVec // the answers' latency (metrics.go)
}

var _ Port = (*CachingPort)(nil)

// NewCachingPort wraps inner with the authentication and read-decision
// caches.
func NewCachingPort(inner Port, opts CacheOptions) *CachingPort {
	if opts.AuthTTL <= 0 {
		opts.AuthTTL = DefaultAuthTTL
	}
	if opts.DecisionTTL <= 0 {
		opts.DecisionTTL = DefaultDecisionTTL
	}
	if opts.MaxAuthentications <= 0 {
		opts.MaxAuthentications = DefaultCacheEntries
	}
	if opts.MaxDecisions <= 0 {
		opts.MaxDecisions = DefaultCacheEntries
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &CachingPort{
		inner:    inner,
		now:      opts.Now,
		authOnly: opts.AuthenticationsOnly,
		auth:     newLRU[[sha256.Size]byte, authEntry](opts.MaxAuthentications, opts.AuthTTL),
		dec:      newLRU[decisionKey, decisionEntry](opts.MaxDecisions, opts.DecisionTTL),
		inflight: make(map[uint64]int),
		pruneAt:  minPruneAt,
		latency:  newPortLatency(),
	}
}

// Inner returns the wrapped port.
func (p *CachingPort) Inner() Port { return p.inner }

// Refresher returns the inner port's Refresher, if it has one.
func (p *CachingPort) Refresher() (Refresher, bool) {
	r, ok := p.inner.(Refresher)
	return r, ok
}

// Port returns p as a Port that also implements Refresher when, and only
// when, the inner port does, so `port.(iam.Refresher)` answers through the
// cache exactly as it would without it. Refreshing is passed straight to the
// inner port.
func (p *CachingPort) Port() Port {
	if r, ok := p.inner.(Refresher); ok {
		return refreshingCachingPort{CachingPort: p, r: r}
	}
	return p
}

type refreshingCachingPort struct {
	*CachingPort
	r Refresher
}

func (p refreshingCachingPort) RefreshResource(ctx context.Context, tenantID string, r Resource) error {
	return p.r.RefreshResource(ctx, tenantID, r)
}

// ---- authentications ----

type authEntry struct {
	caller Caller // a private copy, SourceIP empty
}

// authKey is the sha256 over the Authorization header and the cookie. The
// header's length goes first, so no two splits of the same bytes collide.
func authKey(c Credential) [sha256.Size]byte {
	b := make([]byte, 8, 8+len(c.Authorization)+len(c.Cookie))
	binary.BigEndian.PutUint64(b, uint64(len(c.Authorization)))
	b = append(b, c.Authorization...)
	b = append(b, c.Cookie...)
	return sha256.Sum256(b)
}

// Authenticate answers from the cache when it can. A cached Caller is a copy
// whose SourceIP is this credential's. Only successes are cached.
func (p *CachingPort) Authenticate(ctx context.Context, cred Credential) (*Caller, error) {
	defer p.observe(opAuthenticate, time.Now())
	if !cred.Present() {
		return p.inner.Authenticate(ctx, cred)
	}
	key := authKey(cred)
	now := p.now()

	p.mu.Lock()
	if e, ok := p.auth.get(key, now); ok {
		p.mu.Unlock()
		c := e.caller // get returned a copy
		c.SourceIP = cred.SourceIP
		if c.credential != nil { // forward this request's headers, not the first one's
			k := cred
			k.SourceIP, k.RequestID = "", ""
			c.credential = &k
		}
		return &c, nil
	}
	f := p.takeOffLocked()
	p.mu.Unlock()
	defer p.abandon(&f)

	caller, err := p.inner.Authenticate(ctx, cred)
	if err != nil || caller == nil {
		return caller, err
	}
	stored := *caller // Caller has no reference fields: this is a deep copy
	stored.SourceIP = ""

	now = p.now()
	p.mu.Lock()
	if p.staleLocked(f.start, p.authDroppedAt, &stored) {
		p.auth.counters.Discarded++
	} else {
		p.auth.put(key, authEntry{caller: stored}, now)
	}
	p.landLocked(&f)
	p.mu.Unlock()

	out := *caller
	out.SourceIP = cred.SourceIP
	return &out, nil
}

// ---- read decisions ----

// decisionKey narrows the spec's key (session, tenant, action, type, id)
// with the source address: a policy may read context.sourceIp, so an allow
// from one address says nothing of the same session's read from another.
// The narrower key can only cost extra decisions, never allow more.
type decisionKey struct {
	session, source, tenant, action, rtype, rid string
}

type decisionEntry struct {
	decision Decision
	who      identities
}

// identities are the identities a Caller acts as or for: dropping any of
// them drops the Caller's cached answers.
type identities struct {
	identity, agent, delegatedBy string
}

func identitiesOf(c *Caller) identities {
	return identities{identity: c.IdentityID, agent: c.AgentID, delegatedBy: c.DelegatedBy}
}

func (w identities) has(id string) bool {
	return id == w.identity || id == w.agent || id == w.delegatedBy
}

// decisionKeyOf returns the cache key of a request; false for a request
// that cannot be cached (no caller or no session).
func decisionKeyOf(r *Request) (decisionKey, bool) {
	if r.Caller == nil || r.Caller.SessionID == "" {
		return decisionKey{}, false
	}
	return decisionKey{
		session: r.Caller.SessionID,
		source:  r.Caller.SourceIP,
		tenant:  r.TenantID,
		action:  r.Action,
		rtype:   r.Resource.Type,
		rid:     r.Resource.ID,
	}, true
}

// Authorize answers a read's decision, from the cache when an allow is held.
// Only allows are stored.
func (p *CachingPort) Authorize(ctx context.Context, req Request) (Decision, error) {
	defer p.observe(opAuthorize, time.Now())
	key, cacheable := decisionKeyOf(&req)
	if !cacheable || p.authOnly {
		return p.inner.Authorize(ctx, req)
	}
	now := p.now()

	p.mu.Lock()
	if e, ok := p.dec.get(key, now); ok {
		p.mu.Unlock()
		return e.decision, nil
	}
	f := p.takeOffLocked()
	p.mu.Unlock()
	defer p.abandon(&f)

	d, err := p.inner.Authorize(ctx, req)
	if err != nil || !d.Allowed {
		return d, err
	}

	now = p.now()
	p.mu.Lock()
	p.storeDecisionLocked(f.start, key, &req, d, now)
	p.landLocked(&f)
	p.mu.Unlock()
	return d, nil
}

// Require is a mutation's decision: never cached.
func (p *CachingPort) Require(ctx context.Context, req Request) error {
	defer p.observe(opRequire, time.Now())
	return p.inner.Require(ctx, req)
}

// TakesAnyBatch implements AnyBatch: AuthorizeMany batches what it sends.
func (p *CachingPort) TakesAnyBatch() bool { return true }

// AuthorizeMany answers the held allows itself, under one lock for the
// whole call, and sends the rest to the inner port with
// AuthorizeInBatches (batches of at most MaxBatch, a few at once), keeping
// the order of reqs. It takes any number of requests. New allows are
// stored only when every batch succeeded.
func (p *CachingPort) AuthorizeMany(ctx context.Context, reqs []Request) ([]Decision, error) {
	defer p.observe(opAuthorizeMany, time.Now())
	if p.authOnly {
		return AuthorizeInBatches(ctx, p.inner, reqs)
	}
	out := make([]Decision, len(reqs))
	if len(reqs) == 0 {
		return out, nil
	}
	now := p.now()

	misses := make([]int, 0, len(reqs))
	p.mu.Lock()
	for i := range reqs {
		if key, ok := decisionKeyOf(&reqs[i]); ok {
			if e, hit := p.dec.get(key, now); hit {
				out[i] = e.decision
				continue
			}
		}
		misses = append(misses, i)
	}
	if len(misses) == 0 {
		p.mu.Unlock()
		return out, nil
	}
	f := p.takeOffLocked()
	p.mu.Unlock()
	defer p.abandon(&f)

	batch := reqs // nothing was held: send the caller's slice as is
	if len(misses) < len(reqs) {
		batch = make([]Request, len(misses))
		for j, i := range misses {
			batch[j] = reqs[i]
		}
	}
	ds, err := AuthorizeInBatches(ctx, p.inner, batch)
	if err != nil {
		return nil, err
	}
	for j, i := range misses {
		out[i] = ds[j]
	}

	now = p.now()
	p.mu.Lock()
	for _, i := range misses {
		if !out[i].Allowed {
			continue
		}
		if key, ok := decisionKeyOf(&reqs[i]); ok {
			p.storeDecisionLocked(f.start, key, &reqs[i], out[i], now)
		}
	}
	p.landLocked(&f)
	p.mu.Unlock()
	return out, nil
}

func (p *CachingPort) storeDecisionLocked(start uint64, key decisionKey, req *Request, d Decision, now time.Time) {
	if p.staleLocked(start, p.decDroppedAt, req.Caller) {
		p.dec.counters.Discarded++
		return
	}
	p.dec.put(key, decisionEntry{decision: d, who: identitiesOf(req.Caller)}, now)
}

// ---- invalidation ----

// DropIdentity drops every authentication of the identity and every decision
// of its sessions, including those of agent sessions acting as or delegated
// by it, and discards such answers in flight.
func (p *CachingPort) DropIdentity(identityID string) {
	if identityID == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bumpLocked() {
		p.identityDroppedAt = p.markLocked(p.identityDroppedAt, identityID)
	}
	p.auth.removeIf(func(_ [sha256.Size]byte, e authEntry) bool { return identitiesOf(&e.caller).has(identityID) })
	p.dec.removeIf(func(_ decisionKey, e decisionEntry) bool { return e.who.has(identityID) })
}

// DropSession drops the authentications and decisions of one session and
// discards such answers in flight.
func (p *CachingPort) DropSession(sessionID string) {
	if sessionID == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bumpLocked() {
		p.sessionDroppedAt = p.markLocked(p.sessionDroppedAt, sessionID)
	}
	p.auth.removeIf(func(_ [sha256.Size]byte, e authEntry) bool { return e.caller.SessionID == sessionID })
	p.dec.removeIf(func(k decisionKey, _ decisionEntry) bool { return k.session == sessionID })
}

// DropDecisions drops every read decision and discards decisions in flight.
func (p *CachingPort) DropDecisions() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.epoch++
	p.decDroppedAt = p.epoch
	p.dec.purge()
}

// Clear drops both caches and discards every answer in flight. Counters are
// kept.
func (p *CachingPort) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.epoch++
	p.authDroppedAt = p.epoch
	p.decDroppedAt = p.epoch
	p.auth.purge()
	p.dec.purge()
}

// Stats reports both caches' counters. Expired entries are collected first,
// so Entries counts only live ones.
func (p *CachingPort) Stats() CacheStats {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.auth.sweep(now)
	p.dec.sweep(now)
	s := CacheStats{Authentications: p.auth.counters, Decisions: p.dec.counters}
	s.Authentications.Entries = p.auth.len()
	s.Decisions.Entries = p.dec.len()
	return s
}

// ---- generations ----

// flight is one call to the inner port whose answer may be stored.
type flight struct {
	start  uint64
	landed bool
}

// takeOffLocked records a call to the inner port starting now.
func (p *CachingPort) takeOffLocked() flight {
	p.inflight[p.epoch]++
	return flight{start: p.epoch}
}

// landLocked ends a flight; it must run in the same critical section as the
// staleness check of its answer, after it, so that prune cannot drop a mark
// the check still needs.
func (p *CachingPort) landLocked(f *flight) {
	if f.landed {
		return
	}
	f.landed = true
	if n := p.inflight[f.start] - 1; n > 0 {
		p.inflight[f.start] = n
	} else {
		delete(p.inflight, f.start)
	}
	p.pruneLocked()
}

// abandon lands a flight whose answer is not stored (an error, a deny, a
// panic in the inner port). Deferred; a no-op after landLocked.
func (p *CachingPort) abandon(f *flight) {
	if f.landed {
		return
	}
	p.mu.Lock()
	p.landLocked(f)
	p.mu.Unlock()
}

// bumpLocked advances the drop sequence for a per-identity or per-session
// drop and reports whether to record a mark: not when no call is in flight,
// since a call that starts later captures a start at or after this drop and
// the mark could never matter.
func (p *CachingPort) bumpLocked() bool {
	p.epoch++
	if len(p.inflight) == 0 {
		return false
	}
	p.pruneLocked()
	return true
}

// maxMarks bounds the per-identity and per-session marks. Past it (a call
// stuck in the inner port while thousands of drops go by) the marks collapse
// into the global generations: every answer then in flight is discarded,
// which costs misses, never correctness.
const maxMarks = 4096

// markLocked records in m that id was dropped at the current epoch.
func (p *CachingPort) markLocked(m map[string]uint64, id string) map[string]uint64 {
	if len(p.identityDroppedAt)+len(p.sessionDroppedAt) >= maxMarks {
		p.authDroppedAt, p.decDroppedAt = p.epoch, p.epoch
		p.identityDroppedAt, p.sessionDroppedAt = nil, nil
		p.pruneAt = minPruneAt
		return nil
	}
	if m == nil {
		m = make(map[string]uint64)
	}
	m[id] = p.epoch
	return m
}

// staleLocked reports whether an answer for c from a flight that started at
// start must be discarded: a global drop (globalDroppedAt) or a drop of one
// of c's identities or of its session happened after the flight started.
func (p *CachingPort) staleLocked(start, globalDroppedAt uint64, c *Caller) bool {
	if globalDroppedAt > start {
		return true
	}
	if len(p.sessionDroppedAt) > 0 && p.sessionDroppedAt[c.SessionID] > start {
		return true
	}
	if len(p.identityDroppedAt) > 0 {
		for _, id := range [...]string{c.IdentityID, c.AgentID, c.DelegatedBy} {
			if id != "" && p.identityDroppedAt[id] > start {
				return true
			}
		}
	}
	return false
}

const minPruneAt = 64

// pruneLocked forgets per-identity and per-session marks no flight can need:
// all of them when nothing is in flight, else those at or below the oldest
// flight's start. It runs in full only when the marks have doubled since the
// last prune, so its cost is amortized.
func (p *CachingPort) pruneLocked() {
	n := len(p.identityDroppedAt) + len(p.sessionDroppedAt)
	if n == 0 {
		return
	}
	if len(p.inflight) == 0 {
		p.identityDroppedAt, p.sessionDroppedAt = nil, nil
		p.pruneAt = minPruneAt
		return
	}
	if n < p.pruneAt {
		return
	}
	oldest := p.epoch
	for s := range p.inflight {
		oldest = min(oldest, s)
	}
	for k, v := range p.identityDroppedAt {
		if v <= oldest {
			delete(p.identityDroppedAt, k)
		}
	}
	for k, v := range p.sessionDroppedAt {
		if v <= oldest {
			delete(p.sessionDroppedAt, k)
		}
	}
	p.pruneAt = max(minPruneAt, 2*(len(p.identityDroppedAt)+len(p.sessionDroppedAt)))
}

// ---- LRU with a lifetime ----

// lru is golang-lru's simplelru with each entry's expiry stored beside its
// value and read against the port's clock. expirable.LRU is not used: it
// reads time.Now itself (TTL tests would have to sleep), runs a cleanup
// goroutine per cache that cannot be stopped, and its eviction callback
// cannot tell a capacity eviction from an expiry, which Stats counts
// apart. simplelru has no lock of its own: CachingPort.mu guards it together
// with the drop generations, which must be checked under the same lock as
// the store.
type lru[K comparable, V any] struct {
	limit    int
	ttl      time.Duration
	entries  *simplelru.LRU[K, expiring[V]]
	counters CacheCounters
}

type expiring[V any] struct {
	val     V
	expires time.Time
}

// newLRU needs limit > 0, which NewCachingPort guarantees.
func newLRU[K comparable, V any](limit int, ttl time.Duration) *lru[K, V] {
	entries, err := simplelru.NewLRU[K, expiring[V]](limit, nil)
	if err != nil {
		panic(fmt.Sprintf("iam: cache of %d entries: %v", limit, err))
	}
	return &lru[K, V]{limit: limit, ttl: ttl, entries: entries}
}

// get returns a live entry and marks it most recently used; it counts a hit
// or a miss and removes an expired entry.
func (c *lru[K, V]) get(key K, now time.Time) (v V, ok bool) {
	e, ok := c.entries.Get(key)
	if !ok {
		c.counters.Misses++
		return v, false
	}
	if !now.Before(e.expires) {
		c.entries.Remove(key)
		c.counters.Expirations++
		c.counters.Misses++
		return v, false
	}
	c.counters.Hits++
	return e.val, true
}

// put stores val under key for ttl from now, evicting the least recently
// used entry beyond the cap. The oldest is removed here rather than by Add,
// so that an entry already past its lifetime counts as an expiration.
func (c *lru[K, V]) put(key K, val V, now time.Time) {
	if !c.entries.Contains(key) && c.entries.Len() >= c.limit {
		if _, old, ok := c.entries.RemoveOldest(); ok {
			if now.Before(old.expires) {
				c.counters.Evictions++
			} else {
				c.counters.Expirations++
			}
		}
	}
	c.entries.Add(key, expiring[V]{val: val, expires: now.Add(c.ttl)})
}

func (c *lru[K, V]) removeIf(drop func(K, V) bool) {
	for _, k := range c.entries.Keys() {
		if e, ok := c.entries.Peek(k); ok && drop(k, e.val) {
			c.entries.Remove(k)
		}
	}
}

func (c *lru[K, V]) sweep(now time.Time) {
	for _, k := range c.entries.Keys() {
		if e, ok := c.entries.Peek(k); ok && !now.Before(e.expires) {
			c.entries.Remove(k)
			c.counters.Expirations++
		}
	}
}

func (c *lru[K, V]) purge() { c.entries.Purge() }

func (c *lru[K, V]) len() int { return c.entries.Len() }

package iam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// The authorization projection: every process keeps the authz_resources
// rows in memory, so the resolver answers a decision without I/O
// (actions-and-resources spec, "How the resolver answers").
//
// Freshness. Load reads every row in one REPEATABLE READ snapshot; TailOnce
// then reads the rows changed since, about once a second (Run), sooner when
// a NOTIFY arrives. Changes are selected by the writer's transaction id
// against the previous snapshot (store.ReadAuthzChanges), not by a seq
// cursor, because seq values become visible out of order: the commit of a
// transaction that took seq 5 after one that took seq 6 is still seen, by
// the first tail that runs after it.
//
// Refresh re-reads one row after a commit so that the very next decision
// sees it; a miss in memory costs one primary-key read bounded to
// MissTimeout.
//
// Consistency between the writers of the map. Three paths put rows read
// from the database into memory: a tail pass, Refresh and the miss path.
// Installing a row read earlier over one read later would show a stale row,
// the very bug Refresh exists to prevent (a reservation extended past a
// policy's cap decided on the old duration). So:
//
//   - every read-then-install runs under one lock (serial), so installs
//     happen in the order of the reads and a tail pass never lands an older
//     snapshot over a Refresh's newer row. The miss path only tries the
//     lock: when it is busy, the miss is answered but not cached.
//   - Refresh first drops the row from memory and marks it (poisoned)
//     before it waits for the lock. A tail pass that started before the
//     mark skips the row, so a failed or timed-out Refresh leaves it absent
//     and the next decision takes the bounded miss path: absence is always
//     safe, a stale copy is not. A pass that starts after the mark read its
//     snapshot after the writer committed, so it may install the row again.

// Defaults for ProjectionOptions.
const (
	DefaultTailInterval   = time.Second
	DefaultMissTimeout    = 20 * time.Millisecond
	DefaultRefreshTimeout = 2 * time.Second
	DefaultTailTimeout    = 10 * time.Second
	// DefaultReloadAfter: a projection whose last successful tail is older
	// than this reloads everything rather than trust a feed that may have
	// been pruned (store.DefaultAuthzChangesKeep keeps an hour).
	DefaultReloadAfter = 30 * time.Minute
	DefaultPruneEvery  = 5 * time.Minute
)

// Sentinel errors of the resolver and the projection. ErrResolveFailed (and
// ErrNotLoaded, which wraps it) denies with RESOLVE_FAILED; ErrResolverRequired
// denies with RESOURCE_RESOLVER_REQUIRED. Neither is core NOT_FOUND.
var (
	ErrResolverRequired = errors.New("iam: no resolver for this resource type (RESOURCE_RESOLVER_REQUIRED)")
	ErrResolveFailed    = errors.New("iam: the resource could not be resolved (RESOLVE_FAILED)")
	ErrNotLoaded        = fmt.Errorf("%w: the authorization projection is not loaded", ErrResolveFailed)
)

// ProjectionOptions configures NewProjection. Zero fields take the defaults.
type ProjectionOptions struct {
	// Catalog, when set, keeps only the attributes each type declares;
	// undeclared ones are dropped as rows are loaded. Nil keeps every
	// attribute. Values are kept as stored even when they are not of the
	// declared type, so that the decision (which converts them) fails
	// closed rather than see the attribute as absent.
	Catalog        *core.Catalog
	TailInterval   time.Duration // Run's polling interval; DefaultTailInterval
	MissTimeout    time.Duration // the bound of a miss's primary-key read; DefaultMissTimeout
	RefreshTimeout time.Duration // the bound of Refresh; DefaultRefreshTimeout
	TailTimeout    time.Duration // the bound of one Load or TailOnce; DefaultTailTimeout
	ReloadAfter    time.Duration // DefaultReloadAfter
	// PruneEvery is how often Run prunes authz_changes, keeping PruneKeep
	// (store.DefaultAuthzChangesKeep); negative: Run never prunes.
	PruneEvery time.Duration
	PruneKeep  time.Duration
	Logger     *slog.Logger
	Now        func() time.Time
}

func (o *ProjectionOptions) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.TailInterval, DefaultTailInterval)
	def(&o.MissTimeout, DefaultMissTimeout)
	def(&o.RefreshTimeout, DefaultRefreshTimeout)
	def(&o.TailTimeout, DefaultTailTimeout)
	def(&o.ReloadAfter, DefaultReloadAfter)
	if o.PruneEvery == 0 {
		o.PruneEvery = DefaultPruneEvery
	}
	def(&o.PruneKeep, store.DefaultAuthzChangesKeep)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// ProjectionStats are the projection's state for system.selfCheck and
// metrics.
type ProjectionStats struct {
	Loaded bool `json:"loaded"`
	Rows   int  `json:"rows"`
	// LastTail is when the last Load or TailOnce succeeded (zero: never);
	// Lag is the time since then.
	LastTail time.Time     `json:"lastTail"`
	Lag      time.Duration `json:"lag"`
	// LastSeq is the highest authz_changes seq applied (seq values commit
	// out of order: a lower one may still arrive).
	LastSeq   int64  `json:"lastSeq"`
	LastError string `json:"lastError,omitempty"` // of the last failed Load or TailOnce, cleared by a success
	Tails     uint64 `json:"tails"`
	Failures  uint64 `json:"failures"` // failed Loads and TailOnces
	Loads     uint64 `json:"loads"`
	Applied   uint64 `json:"applied"` // changed rows applied by tails
	Misses    uint64 `json:"misses"`  // lookups that went to the database
	MissFails uint64 `json:"missFails"`
	Refreshes uint64 `json:"refreshes"`
	// AttributesDropped counts attributes not declared by their type that
	// loading left out.
	AttributesDropped uint64 `json:"attributesDropped"`
}

type authzKey struct{ typ, id string }

// authzEntry is one row in memory. It is never modified once in the map,
// so readers may keep it after the lock is released.
type authzEntry struct {
	tenantID   string
	ownerID    string
	parentType string
	parentID   string
	attributes map[string]any
	sharedWith []string
}

func (e *authzEntry) visibleIn(tenantID string) bool {
	return e.tenantID == tenantID || slices.Contains(e.sharedWith, tenantID) || slices.Contains(e.sharedWith, store.SharedWithAll)
}

// Projection is the in-memory authorization projection of one process. It
// is safe for concurrent use; a hit takes a read lock and does no I/O.
type Projection struct {
	store *store.Store
	opts  ProjectionOptions
	// attrs: per full type name, the declared attributes and their types.
	attrs map[string]map[string]core.AttrType

	// serial serialises every read-then-install (see the comment at the
	// top); a channel so that waiting honours a context.
	serial  chan struct{}
	created time.Time

	loaded atomic.Bool

	mu       sync.RWMutex
	entries  map[authzKey]*authzEntry
	poisoned map[authzKey]uint64 // rows Refresh dropped, by tick
	tick     uint64
	// refreshQ are the Refreshes waiting for their rows' read
	// (refreshQueued), under refreshMu.
	refreshMu sync.Mutex
	refreshQ  []*refreshWaiter
	snapshot  string // the snapshot the memory reflects (tail passes only)
	lastOK    time.Time
	stats     ProjectionStats

	// testHookTailRead, when set, runs in TailOnce between the read and
	// the apply (tests only).
	testHookTailRead func()
}

// NewProjection makes an unloaded projection over s. Call Load (or Run).
func NewProjection(s *store.Store, opts ProjectionOptions) *Projection {
	opts.defaults()
	p := &Projection{
		store:    s,
		opts:     opts,
		serial:   make(chan struct{}, 1),
		created:  opts.Now(),
		entries:  map[authzKey]*authzEntry{},
		poisoned: map[authzKey]uint64{},
	}
	if opts.Catalog != nil {
		p.attrs = map[string]map[string]core.AttrType{}
		for _, t := range opts.Catalog.Types() {
			m := make(map[string]core.AttrType, len(t.Attributes))
			for _, a := range t.Attributes {
				m[a.Name] = a.Type
			}
			p.attrs[t.FullName] = m
		}
	}
	return p
}

func (p *Projection) acquire(ctx context.Context) error {
	select {
	case p.serial <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *Projection) tryAcquire() bool {
	select {
	case p.serial <- struct{}{}:
		return true
	default:
		return false
	}
}

func (p *Projection) release() { <-p.serial }

// entryOf builds the in-memory entry of a row, keeping only declared
// attributes when the projection has a catalog.
func (p *Projection) entryOf(r store.AuthzResource) (*authzEntry, int) {
	e := &authzEntry{
		tenantID: r.TenantID, ownerID: r.OwnerID, parentType: r.ParentType, parentID: r.ParentID,
		sharedWith: slices.Clip(r.SharedWith),
	}
	dropped := 0
	if p.attrs == nil {
		e.attributes = r.Attributes
		return e, 0
	}
	declared := p.attrs[r.Type]
	e.attributes = make(map[string]any, len(r.Attributes))
	for name, v := range r.Attributes {
		if _, ok := declared[name]; ok {
			e.attributes[name] = v
		} else {
			dropped++
		}
	}
	return e, dropped
}

// Loaded reports whether the projection has loaded.
func (p *Projection) Loaded() bool { return p.loaded.Load() }

// Lag is the time since the last successful Load or TailOnce (since the
// projection was made, before the first).
func (p *Projection) Lag() time.Duration {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.lagLocked()
}

func (p *Projection) lagLocked() time.Duration {
	if p.lastOK.IsZero() {
		return p.opts.Now().Sub(p.created)
	}
	return p.opts.Now().Sub(p.lastOK)
}

// Stats returns the projection's counters and state.
func (p *Projection) Stats() ProjectionStats {
	p.mu.RLock()
	defer p.mu.RUnlock()
	s := p.stats
	s.Loaded = p.loaded.Load()
	s.Rows = len(p.entries)
	s.LastTail = p.lastOK
	s.Lag = p.lagLocked()
	return s
}

// Load reads every row, replacing what memory holds.
func (p *Projection) Load(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.opts.TailTimeout)
	defer cancel()
	if err := p.acquire(ctx); err != nil {
		return p.failed(fmt.Errorf("iam: projection load: %w", err))
	}
	defer p.release()
	return p.loadLocked(ctx)
}

// loadLocked runs holding serial.
func (p *Projection) loadLocked(ctx context.Context) error {
	p.mu.Lock()
	clear(p.poisoned)
	p.mu.Unlock()
	st, err := p.store.LoadAuthz(ctx)
	if err != nil {
		return p.failed(fmt.Errorf("iam: projection load: %w", err))
	}
	entries := make(map[authzKey]*authzEntry, len(st.Resources))
	dropped := 0
	for _, r := range st.Resources {
		e, n := p.entryOf(r)
		entries[authzKey{r.Type, r.ID}] = e
		dropped += n
	}
	p.mu.Lock()
	for k := range p.poisoned { // dropped by Refresh while we read
		delete(entries, k)
	}
	p.entries = entries
	p.snapshot = st.Snapshot
	p.lastOK = p.opts.Now()
	p.stats.LastSeq = max(p.stats.LastSeq, st.MaxSeq)
	p.stats.LastError = ""
	p.stats.Loads++
	p.stats.AttributesDropped += uint64(dropped)
	p.mu.Unlock()
	p.loaded.Store(true)
	return nil
}

func (p *Projection) failed(err error) error {
	p.mu.Lock()
	p.stats.Failures++
	p.stats.LastError = err.Error()
	p.mu.Unlock()
	return err
}

// TailOnce applies the changes committed since the last Load or TailOnce.
// An unloaded projection, or one whose last success is older than
// ReloadAfter, loads everything instead.
func (p *Projection) TailOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.opts.TailTimeout)
	defer cancel()
	if err := p.acquire(ctx); err != nil {
		return p.failed(fmt.Errorf("iam: projection tail: %w", err))
	}
	defer p.release()
	p.mu.Lock()
	reload := !p.loaded.Load() || p.lagLocked() > p.opts.ReloadAfter
	since := p.snapshot
	clear(p.poisoned) // marks from before this pass: our snapshot is newer
	p.mu.Unlock()
	if reload {
		return p.loadLocked(ctx)
	}
	d, err := p.store.ReadAuthzChanges(ctx, since)
	if err != nil {
		return p.failed(fmt.Errorf("iam: projection tail: %w", err))
	}
	if p.testHookTailRead != nil {
		p.testHookTailRead()
	}
	type change struct {
		k authzKey
		e *authzEntry
	}
	changes := make([]change, len(d.Changes))
	dropped := 0
	for i, c := range d.Changes {
		changes[i].k = authzKey{c.Type, c.ID}
		if c.Resource != nil {
			var n int
			changes[i].e, n = p.entryOf(*c.Resource)
			dropped += n
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range changes {
		if _, ok := p.poisoned[c.k]; ok {
			continue // Refresh dropped it during this pass; leave it absent
		}
		if c.e == nil {
			delete(p.entries, c.k)
		} else {
			p.entries[c.k] = c.e
		}
	}
	p.snapshot = d.Snapshot
	p.lastOK = p.opts.Now()
	p.stats.LastSeq = max(p.stats.LastSeq, d.MaxSeq)
	p.stats.LastError = ""
	p.stats.Tails++
	p.stats.Applied += uint64(len(changes))
	p.stats.AttributesDropped += uint64(dropped)
	return nil
}

// Refresh re-reads one row (a primary-key read) so that the next decision
// sees what the caller just committed, whether or not the tailer has run.
// It drops the row from memory first: when the row does not exist it stays
// dropped and Refresh returns nil (the next decision reads the database and
// answers NOT_FOUND); when the read fails or times out it stays dropped and
// Refresh returns an UNAVAILABLE error, so the next decision takes the
// bounded miss path and fails closed. typ is the prefixed type as stored.
// tenantID names the decision's tenant; the row is re-read whatever its
// view.
func (p *Projection) Refresh(ctx context.Context, typ, id, tenantID string) error {
	k := authzKey{typ, id}
	p.mu.Lock()
	delete(p.entries, k)
	p.tick++
	mark := p.tick
	p.poisoned[k] = mark
	p.stats.Refreshes++
	p.mu.Unlock()

	// Concurrent Refreshes queue their rows; whichever holds serial reads
	// every queued row in one statement, so admissions in flight together
	// wait for one read instead of one read each. Every queued row was
	// marked before the read, so the read is as fresh as each needs.
	w := &refreshWaiter{k: k, mark: mark, done: make(chan error, 1)}
	p.refreshMu.Lock()
	p.refreshQ = append(p.refreshQ, w)
	p.refreshMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, p.opts.RefreshTimeout)
	defer cancel()
	for {
		select {
		case err := <-w.done:
			return err
		case p.serial <- struct{}{}:
			p.refreshQueued(ctx, w)
			p.release()
		case <-ctx.Done():
			p.unqueue(w)
			select {
			case err := <-w.done: // answered meanwhile
				return err
			default:
			}
			return core.Wrap(core.CodeUnavailable, ctx.Err(), fmt.Sprintf("the authorization projection could not re-read %s/%s", typ, id))
		}
	}
}

// refreshWaiter is a Refresh waiting for its row to be read.
type refreshWaiter struct {
	k    authzKey
	mark uint64
	done chan error // buffered: the answer never blocks the reader
}

// unqueue takes w out of the queue, if no read took it yet.
func (p *Projection) unqueue(w *refreshWaiter) {
	p.refreshMu.Lock()
	defer p.refreshMu.Unlock()
	if i := slices.Index(p.refreshQ, w); i >= 0 {
		p.refreshQ = slices.Delete(p.refreshQ, i, i+1)
	}
}

// refreshQueued runs holding serial: it reads the rows of every queued
// Refresh in one statement and installs each, unless a later Refresh of the
// row owns it now. A row that does not exist stays dropped (nil); a failed
// read leaves every row dropped and answers UNAVAILABLE, except when it
// failed because own's context ended: the others are queued again for the
// next holder.
func (p *Projection) refreshQueued(ctx context.Context, own *refreshWaiter) {
	p.refreshMu.Lock()
	batch := p.refreshQ
	p.refreshQ = nil
	p.refreshMu.Unlock()
	if len(batch) == 0 {
		return
	}
	keys := make([][2]string, len(batch))
	for i, w := range batch {
		keys[i] = [2]string{w.k.typ, w.k.id}
	}
	rows, err := store.GetAuthzResources(ctx, p.store.Pool, keys)
	if err != nil {
		if ctx.Err() != nil {
			p.refreshMu.Lock()
			for _, w := range batch {
				if w != own {
					p.refreshQ = append(p.refreshQ, w)
				}
			}
			p.refreshMu.Unlock()
			batch = []*refreshWaiter{own}
		}
		for _, w := range batch {
			w.done <- core.Wrap(core.CodeUnavailable, err, fmt.Sprintf("the authorization projection could not re-read %s/%s", w.k.typ, w.k.id))
		}
		return
	}
	read := make(map[authzKey]store.AuthzResource, len(rows))
	for _, r := range rows {
		read[authzKey{r.Type, r.ID}] = r
	}
	for _, w := range batch {
		r, ok := read[w.k]
		if !ok {
			w.done <- nil
			continue
		}
		e, dropped := p.entryOf(r)
		p.mu.Lock()
		p.stats.AttributesDropped += uint64(dropped)
		// A later Refresh of the row owns it now (it may have dropped the
		// row after our read); an unloaded projection gets everything
		// from Load.
		if m, ok := p.poisoned[w.k]; (!ok || m == w.mark) && p.loaded.Load() {
			p.entries[w.k] = e
		}
		p.mu.Unlock()
		w.done <- nil
	}
}

// lookup answers one row as tenantID sees it: from memory when the row is
// there and visible in tenantID's view, and otherwise from one primary-key
// read bounded to MissTimeout. A row held in memory but outside the view
// takes the same read as a row memory lacks, for two reasons: a caller must
// not tell "exists elsewhere" from "does not exist" by how fast the answer
// comes, and the read sees an offer that shared the row with tenantID after
// the last tail. An absent row is core NOT_FOUND (the caller checks the
// view of a present one); an unloaded projection, a timeout or a failed
// read wrap ErrResolveFailed.
func (p *Projection) lookup(ctx context.Context, typ, id, tenantID string) (*authzEntry, error) {
	if !p.loaded.Load() {
		return nil, ErrNotLoaded
	}
	k := authzKey{typ, id}
	p.mu.RLock()
	e := p.entries[k]
	p.mu.RUnlock()
	if e != nil && e.visibleIn(tenantID) {
		return e, nil
	}
	return p.miss(ctx, k)
}

func (p *Projection) miss(ctx context.Context, k authzKey) (*authzEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.MissTimeout)
	defer cancel()
	// Cache only when no other read-then-install runs (see above); never wait.
	cache := p.tryAcquire()
	if cache {
		defer p.release()
	}
	p.mu.Lock()
	p.stats.Misses++
	start := p.tick
	p.mu.Unlock()
	r, err := store.GetAuthzResource(ctx, p.store.Pool, k.typ, k.id)
	if errors.Is(err, core.ErrNotFound) {
		return nil, err
	}
	if err != nil {
		p.mu.Lock()
		p.stats.MissFails++
		p.mu.Unlock()
		return nil, fmt.Errorf("%w: reading %s/%s: %w", ErrResolveFailed, k.typ, k.id, err)
	}
	e, dropped := p.entryOf(r)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.AttributesDropped += uint64(dropped)
	if cache {
		// A Refresh that dropped the row after this read began may have
		// seen a newer commit than we did: leave the row to it.
		if m, ok := p.poisoned[k]; !ok || m <= start {
			if _, have := p.entries[k]; !have {
				p.entries[k] = e
			}
		}
	}
	return e, nil
}

// Run loads the projection (retrying until it succeeds) and then tails
// authz_changes every TailInterval and whenever a NOTIFY arrives, on a
// dedicated LISTEN connection that it reconnects after a failure. It prunes
// old changes every PruneEvery. It returns when ctx ends.
func (p *Projection) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	notify := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.listen(ctx, notify) })
	defer wg.Wait()

	if !p.Loaded() {
		load := func() (struct{}, error) { return struct{}{}, p.Load(ctx) }
		logFailure := func(err error, _ time.Duration) {
			p.opts.Logger.Warn("authorization projection: load failed", "err", err)
		}
		// Without a first load nothing can be authorized, so it retries for as
		// long as the process runs; only ctx ends it.
		if _, err := backoff.Retry(ctx, load, backoff.WithBackOff(reconnectBackoff()),
			backoff.WithMaxElapsedTime(0), backoff.WithNotify(logFailure)); err != nil {
			return nil
		}
	}
	ticker := time.NewTicker(p.opts.TailInterval)
	defer ticker.Stop()
	lastPrune := time.Time{}
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-wake:
		}
		if err := p.TailOnce(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !failing {
				p.opts.Logger.Warn("authorization projection: tail failed", "err", err)
			}
			failing = true
		} else if failing {
			p.opts.Logger.Info("authorization projection: tailing again")
			failing = false
		}
		if now := p.opts.Now(); p.opts.PruneEvery > 0 && now.Sub(lastPrune) >= p.opts.PruneEvery {
			lastPrune = now
			pctx, cancel := context.WithTimeout(ctx, p.opts.TailTimeout)
			if _, err := store.PruneAuthzChanges(pctx, p.store.Pool, p.opts.PruneKeep); err != nil && ctx.Err() == nil {
				p.opts.Logger.Warn("authorization projection: prune failed", "err", err)
			}
			cancel()
		}
	}
}

// listen keeps a LISTEN connection open until ctx ends.
func (p *Projection) listen(ctx context.Context, notify func()) {
	retry := reconnectBackoff()
	for ctx.Err() == nil {
		start := p.opts.Now()
		err := p.store.ListenAuthzChanges(ctx, notify)
		if ctx.Err() != nil {
			return
		}
		if p.opts.Now().Sub(start) > time.Minute {
			retry.Reset() // it was up for a while: retry soon
		}
		p.opts.Logger.Warn("authorization projection: listen failed; polling until it reconnects", "err", err)
		if !sleepCtx(ctx, retry.NextBackOff()) {
			return
		}
	}
}

// reconnectBackoff waits 250ms after the first failure and doubles up to
// 30s. It has no jitter: each process retries one load and one LISTEN
// connection, too few to herd the database.
func reconnectBackoff() *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval: 250 * time.Millisecond,
		Multiplier:      2,
		MaxInterval:     30 * time.Second,
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// cloneAttributes is what the resolver hands out: callers may change their
// copy without touching the projection's.
func cloneAttributes(m map[string]any) map[string]any {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}

package iam

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
)

// The iam package's tests share one PostgreSQL cluster per test binary.
func TestMain(m *testing.M) { testenv.Main(m) }

const (
	rootTenant = "root"
	tenantA    = "tnt-a"
	tenantB    = "tnt-b"
	tenantC    = "tnt-c"
)

type fixture struct {
	s   *store.Store
	cat *core.Catalog
	p   *Projection
	r   *ProjectionResolver
	now time.Time
	mu  sync.Mutex
}

func (f *fixture) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fixture) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func newFixture(t testing.TB, opts ProjectionOptions) *fixture {
	t.Helper()
	cat, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{s: testenv.Store(t), cat: cat, now: time.Unix(1_700_000_000, 0)}
	opts.Catalog = cat
	if opts.Now == nil {
		opts.Now = f.clock
	}
	f.p = NewProjection(f.s, opts)
	f.r, err = NewProjectionResolver(ProjectionResolverConfig{Projection: f.p, Catalog: cat, RootTenant: rootTenant})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func put(t testing.TB, s *store.Store, rs ...store.AuthzResource) {
	t.Helper()
	err := s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		for _, r := range rs {
			if err := store.PutAuthzResource(context.Background(), tx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func del(t testing.TB, s *store.Store, typ, id string) {
	t.Helper()
	err := s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		return store.DeleteAuthzResource(context.Background(), tx, typ, id)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// peek reports whether memory holds the row (without the miss path).
func peek(p *Projection, typ, id string) (*authzEntry, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	e, ok := p.entries[authzKey{typ, id}]
	return e, ok
}

func mustLoad(t testing.TB, p *Projection) {
	t.Helper()
	if err := p.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func mustTail(t testing.TB, p *Projection) {
	t.Helper()
	if err := p.TailOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func reservation(id, tenant string, hours float64) store.AuthzResource {
	return store.AuthzResource{
		Type: "compute-reservation", ID: id, TenantID: tenant, OwnerID: "idn_owner",
		ParentType: "compute-pool", ParentID: "pool_1",
		Attributes: map[string]any{"durationHours": hours, "gpuCount": 8, "gpuModel": "H100"},
	}
}

func pool(id, tenant string, sharedWith ...string) store.AuthzResource {
	return store.AuthzResource{Type: "compute-pool", ID: id, TenantID: tenant, SharedWith: sharedWith,
		Attributes: map[string]any{"gpuModel": "H100", "class": "metal-host"}}
}

func TestProjectionLoad(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, ProjectionOptions{})
	put(t, f.s, reservation("rsv_1", tenantA, 24), pool("pool_1", tenantA))

	res := Resource{Type: "compute-reservation", ID: "rsv_1"}
	if f.p.Loaded() {
		t.Fatal("Loaded before Load")
	}
	_, err := f.r.Resolve(ctx, tenantA, res)
	if !errors.Is(err, ErrNotLoaded) || !errors.Is(err, ErrResolveFailed) || errors.Is(err, core.ErrNotFound) {
		t.Fatalf("Resolve on an unloaded projection = %v; want ErrNotLoaded, not NOT_FOUND", err)
	}
	// The row-less scopes do not need the projection.
	if _, err := f.r.Resolve(ctx, rootTenant, Resource{Type: "compute-fleet", ID: "global"}); err != nil {
		t.Fatalf("fleet scope on an unloaded projection: %v", err)
	}

	mustLoad(t, f.p)
	if !f.p.Loaded() {
		t.Fatal("not Loaded after Load")
	}
	got, err := f.r.Resolve(ctx, tenantA, res)
	if err != nil {
		t.Fatal(err)
	}
	if got.Attributes["durationHours"] != 24.0 || got.OwnerID != "idn_owner" {
		t.Fatalf("Resolve = %+v", got)
	}
	st := f.p.Stats()
	if st.Rows != 2 || st.Loads != 1 || !st.Loaded || st.LastSeq < 2 || !st.LastTail.Equal(f.clock()) || st.Lag != 0 {
		t.Fatalf("Stats = %+v", st)
	}
	f.advance(3 * time.Second)
	if lag := f.p.Lag(); lag != 3*time.Second {
		t.Fatalf("Lag = %v, want 3s", lag)
	}
}

func TestProjectionTail(t *testing.T) {
	const typ = "compute-reservation"
	tests := []struct {
		name string
		// before is in the database at Load; change runs after it.
		before []store.AuthzResource
		change func(t *testing.T, s *store.Store)
		// want is the row memory holds after the tail (nil: none), and
		// wantBefore what it holds between the change and the tail.
		wantBefore, want *float64
	}{
		{
			name:   "insert",
			change: func(t *testing.T, s *store.Store) { put(t, s, reservation("rsv_1", tenantA, 10)) },
			want:   ptr(10.0),
		},
		{
			name:       "update",
			before:     []store.AuthzResource{reservation("rsv_1", tenantA, 10)},
			change:     func(t *testing.T, s *store.Store) { put(t, s, reservation("rsv_1", tenantA, 11)) },
			wantBefore: ptr(10.0), want: ptr(11.0),
		},
		{
			name:       "delete",
			before:     []store.AuthzResource{reservation("rsv_1", tenantA, 10)},
			change:     func(t *testing.T, s *store.Store) { del(t, s, typ, "rsv_1") },
			wantBefore: ptr(10.0),
		},
		{
			name: "insert then delete between two tails",
			change: func(t *testing.T, s *store.Store) {
				put(t, s, reservation("rsv_1", tenantA, 10))
				del(t, s, typ, "rsv_1")
			},
		},
		{
			name:   "delete and insert again",
			before: []store.AuthzResource{reservation("rsv_1", tenantA, 10)},
			change: func(t *testing.T, s *store.Store) {
				del(t, s, typ, "rsv_1")
				put(t, s, reservation("rsv_1", tenantA, 12))
			},
			wantBefore: ptr(10.0), want: ptr(12.0),
		},
		{
			name:   "the key changes",
			before: []store.AuthzResource{reservation("rsv_0", tenantA, 10)},
			change: func(t *testing.T, s *store.Store) {
				if _, err := s.Pool.Exec(context.Background(), `UPDATE authz_resources SET id = 'rsv_1' WHERE id = 'rsv_0'`); err != nil {
					t.Fatal(err)
				}
			},
			want: ptr(10.0),
		},
	}
	check := func(t *testing.T, p *Projection, want *float64) {
		t.Helper()
		e, ok := peek(p, typ, "rsv_1")
		switch {
		case want == nil && ok:
			t.Fatalf("memory holds %+v, want nothing", e)
		case want != nil && !ok:
			t.Fatalf("memory holds nothing, want durationHours %v", *want)
		case want != nil && e.attributes["durationHours"] != *want:
			t.Fatalf("memory holds durationHours %v, want %v", e.attributes["durationHours"], *want)
		}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, ProjectionOptions{})
			if len(tc.before) > 0 {
				put(t, f.s, tc.before...)
			}
			mustLoad(t, f.p)
			tc.change(t, f.s)
			check(t, f.p, tc.wantBefore)
			mustTail(t, f.p)
			check(t, f.p, tc.want)
			if _, ok := peek(f.p, typ, "rsv_0"); ok {
				t.Fatal("memory still holds rsv_0")
			}
			// A second tail with nothing new changes nothing.
			applied := f.p.Stats().Applied
			mustTail(t, f.p)
			check(t, f.p, tc.want)
			if st := f.p.Stats(); st.Applied != applied || st.Tails != 2 {
				t.Fatalf("an idle tail: %+v", st)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// seqOf is the newest change seq of a row, as tx sees it.
func seqOf(t *testing.T, q store.DBTX, typ, id string) int64 {
	t.Helper()
	var seq int64
	if err := q.QueryRow(context.Background(), `SELECT max(seq) FROM authz_changes WHERE type = $1 AND id = $2`, typ, id).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	return seq
}

// TestProjectionOutOfOrderCommits commits a change whose seq is lower than
// one already tailed, and one that stays open across several tails: a
// cursor that advanced to the highest seq seen would miss both.
func TestProjectionOutOfOrderCommits(t *testing.T) {
	ctx := context.Background()
	for _, outcome := range []string{"commit", "rollback"} {
		t.Run(outcome, func(t *testing.T) {
			f := newFixture(t, ProjectionOptions{})
			put(t, f.s, reservation("rsv_upd", tenantA, 1))
			mustLoad(t, f.p)

			// Transaction 1 takes the lower seqs and stays open.
			tx1, err := f.s.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx1.Rollback(ctx)
			if err := store.PutAuthzResource(ctx, tx1, reservation("rsv_slow", tenantA, 5)); err != nil {
				t.Fatal(err)
			}
			if err := store.PutAuthzResource(ctx, tx1, reservation("rsv_upd", tenantA, 2)); err != nil {
				t.Fatal(err)
			}
			slowSeq := seqOf(t, tx1, "compute-reservation", "rsv_slow")

			// Transaction 2 takes a higher seq and commits first.
			put(t, f.s, reservation("rsv_fast", tenantA, 6))
			fastSeq := seqOf(t, f.s.Pool, "compute-reservation", "rsv_fast")
			if slowSeq >= fastSeq {
				t.Fatalf("seqs: slow %d, fast %d; the test needs slow < fast", slowSeq, fastSeq)
			}

			mustTail(t, f.p)
			if _, ok := peek(f.p, "compute-reservation", "rsv_fast"); !ok {
				t.Fatal("the committed change is not applied")
			}
			if _, ok := peek(f.p, "compute-reservation", "rsv_slow"); ok {
				t.Fatal("an uncommitted change is applied")
			}
			if st := f.p.Stats(); st.LastSeq < fastSeq {
				t.Fatalf("LastSeq = %d, want at least %d", st.LastSeq, fastSeq)
			}
			// More commits and tails while transaction 1 stays open.
			for i := range 3 {
				put(t, f.s, reservation(fmt.Sprintf("rsv_more%d", i), tenantA, 7))
				mustTail(t, f.p)
			}
			if e, _ := peek(f.p, "compute-reservation", "rsv_upd"); e == nil || e.attributes["durationHours"] != 1.0 {
				t.Fatalf("rsv_upd before transaction 1 ends: %+v", e)
			}

			if outcome == "commit" {
				if err := tx1.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			} else if err := tx1.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			mustTail(t, f.p)
			slow, slowOK := peek(f.p, "compute-reservation", "rsv_slow")
			upd, _ := peek(f.p, "compute-reservation", "rsv_upd")
			if outcome == "commit" {
				if !slowOK || slow.attributes["durationHours"] != 5.0 || upd.attributes["durationHours"] != 2.0 {
					t.Fatalf("after the late commit: rsv_slow %+v (%v), rsv_upd %+v", slow, slowOK, upd)
				}
			} else if slowOK || upd.attributes["durationHours"] != 1.0 {
				t.Fatalf("after the rollback: rsv_slow %+v (%v), rsv_upd %+v", slow, slowOK, upd)
			}
			// Memory now equals the table.
			assertMatchesTable(t, f)
		})
	}
}

// TestProjectionConcurrentWriters races many writers against the tailer and
// checks that memory ends equal to the table.
func TestProjectionConcurrentWriters(t *testing.T) {
	f := newFixture(t, ProjectionOptions{})
	mustLoad(t, f.p)
	ctx, cancel := context.WithCancel(context.Background())
	tailDone := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			if err := f.p.TailOnce(ctx); err != nil && ctx.Err() == nil {
				tailDone <- err
				return
			}
		}
		tailDone <- nil
	}()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 25 {
				id := fmt.Sprintf("rsv_%d", (w*7+i)%20)
				var err error
				if i%5 == 4 {
					err = f.s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
						return store.DeleteAuthzResource(ctx, tx, "compute-reservation", id)
					})
				} else {
					err = f.s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
						return store.PutAuthzResource(ctx, tx, reservation(id, tenantA, float64(w*100+i)))
					})
				}
				if err != nil && !isSerializationConflict(err) {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	cancel()
	if err := <-tailDone; err != nil {
		t.Fatal(err)
	}
	mustTail(t, f.p)
	assertMatchesTable(t, f)
}

// isSerializationConflict: two writers inserting the same new key at once
// may collide on the primary key; that is the writers' business.
func isSerializationConflict(err error) bool {
	return err != nil && (errors.Is(err, context.Canceled) || containsSQLState(err, "23505") || containsSQLState(err, "40P01"))
}

func containsSQLState(err error, code string) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && pgErr.SQLState() == code
}

func assertMatchesTable(t *testing.T, f *fixture) {
	t.Helper()
	st, err := f.s.LoadAuthz(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f.p.mu.RLock()
	defer f.p.mu.RUnlock()
	if len(st.Resources) != len(f.p.entries) {
		t.Fatalf("memory holds %d rows, the table %d", len(f.p.entries), len(st.Resources))
	}
	for _, r := range st.Resources {
		e, ok := f.p.entries[authzKey{r.Type, r.ID}]
		if !ok {
			t.Fatalf("memory lacks %s", r.Key())
		}
		if e.tenantID != r.TenantID || fmt.Sprint(e.attributes) != fmt.Sprint(r.Attributes) {
			t.Fatalf("%s: memory %+v, table %+v", r.Key(), e, r)
		}
	}
}

func TestProjectionMissPath(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, ProjectionOptions{})
	mustLoad(t, f.p)
	res := Resource{Type: "compute-reservation", ID: "rsv_late"}

	if _, err := f.r.Resolve(ctx, tenantA, res); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("an absent row: %v, want NOT_FOUND", err)
	}
	if _, ok := peek(f.p, res.Type, res.ID); ok {
		t.Fatal("an absent row is cached")
	}
	// Committed after Load, not yet tailed: one primary-key read, then cached.
	put(t, f.s, reservation(res.ID, tenantA, 3))
	got, err := f.r.Resolve(ctx, tenantA, res)
	if err != nil || got.Attributes["durationHours"] != 3.0 {
		t.Fatalf("Resolve = %+v, %v", got, err)
	}
	if _, ok := peek(f.p, res.Type, res.ID); !ok {
		t.Fatal("the miss is not cached")
	}
	// In another tenant's view the row is NOT_FOUND like an absent row, and
	// costs the same primary-key read although memory holds it.
	if _, err := f.r.Resolve(ctx, tenantB, Resource{Type: "compute-reservation", ID: "rsv_late"}); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("another tenant: %v, want NOT_FOUND", err)
	}
	if st := f.p.Stats(); st.Misses != 3 || st.MissFails != 0 {
		t.Fatalf("Stats = %+v", st)
	}
}

// lockTable holds an ACCESS EXCLUSIVE lock on authz_resources until the
// returned function runs: every read of the table blocks meanwhile.
func lockTable(t *testing.T, s *store.Store) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE authz_resources IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unlock = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(unlock)
	return unlock
}

func TestProjectionMissFailureDenies(t *testing.T) {
	ctx := context.Background()
	res := Resource{Type: "compute-reservation", ID: "rsv_2"}

	t.Run("timeout", func(t *testing.T) {
		f := newFixture(t, ProjectionOptions{})
		put(t, f.s, reservation("rsv_1", tenantA, 1))
		mustLoad(t, f.p)
		put(t, f.s, reservation(res.ID, tenantA, 2))
		unlock := lockTable(t, f.s)
		// The read blocks on the lock; MissTimeout (20 ms) ends it.
		_, err := f.r.Resolve(ctx, tenantA, res)
		if !errors.Is(err, ErrResolveFailed) || errors.Is(err, core.ErrNotFound) {
			t.Fatalf("a timed-out miss = %v; want ErrResolveFailed, not NOT_FOUND", err)
		}
		// A hit needs no I/O: it answers while the table is locked.
		if _, err := f.r.Resolve(ctx, tenantA, Resource{Type: "compute-reservation", ID: "rsv_1"}); err != nil {
			t.Fatalf("a hit while the table is locked: %v", err)
		}
		if st := f.p.Stats(); st.MissFails != 1 {
			t.Fatalf("Stats = %+v", st)
		}
		unlock()
		if _, err := f.r.Resolve(ctx, tenantA, res); err != nil {
			t.Fatalf("after the lock: %v", err)
		}
	})

	t.Run("closed pool", func(t *testing.T) {
		cat, _ := core.DefaultCatalog()
		s, err := store.Open(ctx, testenv.DatabaseURL(t))
		if err != nil {
			t.Fatal(err)
		}
		p := NewProjection(s, ProjectionOptions{Catalog: cat})
		r, _ := NewProjectionResolver(ProjectionResolverConfig{Projection: p, Catalog: cat, RootTenant: rootTenant})
		mustLoad(t, p)
		s.Close()
		if _, err := r.Resolve(ctx, tenantA, res); !errors.Is(err, ErrResolveFailed) || errors.Is(err, core.ErrNotFound) {
			t.Fatalf("a miss on a closed pool = %v; want ErrResolveFailed", err)
		}
	})

	t.Run("cancelled context", func(t *testing.T) {
		f := newFixture(t, ProjectionOptions{})
		mustLoad(t, f.p)
		put(t, f.s, reservation(res.ID, tenantA, 2))
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := f.r.Resolve(cctx, tenantA, res); !errors.Is(err, ErrResolveFailed) || errors.Is(err, core.ErrNotFound) {
			t.Fatalf("a miss with a cancelled context = %v; want ErrResolveFailed", err)
		}
	})
}

// TestRefreshBoundedExtend is the spec's reservations.extend bug: a policy
// capped at 72 hours must see the extended row (73) in the very next
// decision, though the tailer has not run.
func TestRefreshBoundedExtend(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, ProjectionOptions{})
	res := Resource{Type: "compute-reservation", ID: "rsv_ext"}
	put(t, f.s, reservation(res.ID, tenantA, 72))
	mustLoad(t, f.p)
	if got, err := f.r.Resolve(ctx, tenantA, res); err != nil || got.Attributes["durationHours"] != 72.0 {
		t.Fatalf("before: %+v, %v", got, err)
	}

	put(t, f.s, reservation(res.ID, tenantA, 73)) // transaction 1 of the admission
	if got, _ := f.r.Resolve(ctx, tenantA, res); got.Attributes["durationHours"] != 72.0 {
		t.Fatalf("without Refresh the projection still answers from memory; got %v", got.Attributes)
	}
	if err := f.r.RefreshResource(ctx, tenantA, res); err != nil {
		t.Fatal(err)
	}
	got, err := f.r.Resolve(ctx, tenantA, res)
	if err != nil || got.Attributes["durationHours"] != 73.0 {
		t.Fatalf("after Refresh: %+v, %v; want durationHours 73", got, err)
	}
	if _, ok := peek(f.p, res.Type, res.ID); !ok {
		t.Fatal("Refresh did not cache the row")
	}
	if st := f.p.Stats(); st.Tails != 0 || st.Misses != 0 || st.Refreshes != 1 {
		t.Fatalf("Stats = %+v (the tailer must not have run)", st)
	}
}

func TestRefreshDrops(t *testing.T) {
	ctx := context.Background()
	res := Resource{Type: "compute-reservation", ID: "rsv_1"}

	t.Run("row gone", func(t *testing.T) {
		f := newFixture(t, ProjectionOptions{})
		put(t, f.s, reservation(res.ID, tenantA, 1))
		mustLoad(t, f.p)
		del(t, f.s, res.Type, res.ID)
		if err := f.p.Refresh(ctx, res.Type, res.ID, tenantA); err != nil {
			t.Fatal(err)
		}
		if _, ok := peek(f.p, res.Type, res.ID); ok {
			t.Fatal("Refresh of a deleted row kept it")
		}
		if _, err := f.r.Resolve(ctx, tenantA, res); !errors.Is(err, core.ErrNotFound) {
			t.Fatalf("after Refresh: %v, want NOT_FOUND", err)
		}
	})

	t.Run("read fails", func(t *testing.T) {
		f := newFixture(t, ProjectionOptions{})
		put(t, f.s, reservation(res.ID, tenantA, 1))
		mustLoad(t, f.p)
		unlock := lockTable(t, f.s)
		rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		err := f.p.Refresh(rctx, res.Type, res.ID, tenantA)
		if !errors.Is(err, core.ErrUnavailable) {
			t.Fatalf("Refresh with a blocked read = %v, want UNAVAILABLE", err)
		}
		if _, ok := peek(f.p, res.Type, res.ID); ok {
			t.Fatal("a failed Refresh kept the row")
		}
		// The next decision takes the bounded miss path and fails closed.
		if _, err := f.r.Resolve(ctx, tenantA, res); !errors.Is(err, ErrResolveFailed) {
			t.Fatalf("after a failed Refresh: %v, want ErrResolveFailed", err)
		}
		unlock()
		if got, err := f.r.Resolve(ctx, tenantA, res); err != nil || got.Attributes["durationHours"] != 1.0 {
			t.Fatalf("after the lock: %+v, %v", got, err)
		}
	})

	t.Run("unloaded", func(t *testing.T) {
		f := newFixture(t, ProjectionOptions{})
		put(t, f.s, reservation(res.ID, tenantA, 1))
		if err := f.p.Refresh(ctx, res.Type, res.ID, tenantA); err != nil {
			t.Fatal(err)
		}
		if _, err := f.r.Resolve(ctx, tenantA, res); !errors.Is(err, ErrNotLoaded) {
			t.Fatalf("Refresh made an unloaded projection answer: %v", err)
		}
	})
}

// TestRefreshDuringTail: a tail pass whose snapshot predates the
// admission's commit must not put the old row back after a Refresh dropped
// it, even when that Refresh fails.
func TestRefreshDuringTail(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, ProjectionOptions{})
	res := Resource{Type: "compute-reservation", ID: "rsv_1"}
	put(t, f.s, reservation(res.ID, tenantA, 70))
	mustLoad(t, f.p)
	put(t, f.s, reservation(res.ID, tenantA, 72)) // the tail below reads this

	var refreshErr error
	f.p.testHookTailRead = func() {
		// Between the tail's read and its apply: the admission commits 73
		// and refreshes; the tail holds the lock, so the Refresh times out.
		put(t, f.s, reservation(res.ID, tenantA, 73))
		rctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		refreshErr = f.p.Refresh(rctx, res.Type, res.ID, tenantA)
	}
	mustTail(t, f.p)
	f.p.testHookTailRead = nil
	if !errors.Is(refreshErr, core.ErrUnavailable) {
		t.Fatalf("Refresh during the tail = %v, want UNAVAILABLE", refreshErr)
	}
	if e, ok := peek(f.p, res.Type, res.ID); ok {
		t.Fatalf("the tail put back the row Refresh dropped: %v", e.attributes)
	}
	got, err := f.r.Resolve(ctx, tenantA, res)
	if err != nil || got.Attributes["durationHours"] != 73.0 {
		t.Fatalf("Resolve = %+v, %v; want 73", got, err)
	}
	// The next tail is newer than the drop and applies normally.
	mustTail(t, f.p)
	assertMatchesTable(t, f)
}

func TestProjectionReloadsWhenBehind(t *testing.T) {
	f := newFixture(t, ProjectionOptions{ReloadAfter: time.Minute})
	mustLoad(t, f.p)
	put(t, f.s, reservation("rsv_1", tenantA, 1))
	mustTail(t, f.p)
	if st := f.p.Stats(); st.Loads != 1 || st.Tails != 1 {
		t.Fatalf("Stats = %+v", st)
	}
	f.advance(2 * time.Minute)
	// The feed may have been pruned past us: the next pass reloads.
	if _, err := f.s.Pool.Exec(context.Background(), `DELETE FROM authz_changes`); err != nil {
		t.Fatal(err)
	}
	put(t, f.s, reservation("rsv_2", tenantA, 1))
	if _, err := f.s.Pool.Exec(context.Background(), `DELETE FROM authz_changes`); err != nil {
		t.Fatal(err)
	}
	mustTail(t, f.p)
	if st := f.p.Stats(); st.Loads != 2 || st.Lag != 0 {
		t.Fatalf("Stats = %+v; want a reload", st)
	}
	if _, ok := peek(f.p, "compute-reservation", "rsv_2"); !ok {
		t.Fatal("the reload missed rsv_2")
	}
}

func TestProjectionTailFailureKeepsServing(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, ProjectionOptions{TailTimeout: 50 * time.Millisecond})
	put(t, f.s, reservation("rsv_1", tenantA, 1))
	mustLoad(t, f.p)
	f.advance(time.Second)
	unlock := lockTable(t, f.s)
	if err := f.p.TailOnce(ctx); err == nil {
		t.Fatal("a tail against a locked table succeeded")
	}
	st := f.p.Stats()
	if st.Failures != 1 || st.LastError == "" || st.Lag != time.Second || !st.Loaded {
		t.Fatalf("Stats after a failed tail = %+v", st)
	}
	if _, err := f.r.Resolve(ctx, tenantA, Resource{Type: "compute-reservation", ID: "rsv_1"}); err != nil {
		t.Fatalf("a hit after a failed tail: %v", err)
	}
	unlock()
	mustTail(t, f.p)
	if st := f.p.Stats(); st.LastError != "" || st.Lag != 0 {
		t.Fatalf("Stats after recovering = %+v", st)
	}
}

// TestProjectionRunWakesOnNotify: with a polling interval far longer than
// the test, only the NOTIFY can bring the row in.
func TestProjectionRunWakesOnNotify(t *testing.T) {
	f := newFixture(t, ProjectionOptions{TailInterval: time.Hour, Now: time.Now})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	testutil.Eventually(t, 20*time.Second, "the load", f.p.Loaded)
	// The listener may not be listening yet; keep writing until a change
	// arrives (each write notifies).
	for i := 0; ; i++ {
		put(t, f.s, reservation(fmt.Sprintf("rsv_%d", i), tenantA, 1))
		wait, stop := context.WithTimeout(ctx, 2*time.Second)
		arrived := testutil.Until(wait, func() bool { return f.p.Stats().Applied > 0 })
		stop()
		if arrived {
			break
		}
		if i == 10 {
			t.Fatal("no change arrived through NOTIFY")
		}
	}
	if st := f.p.Stats(); st.Misses != 0 {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestProjectionAttributes(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, ProjectionOptions{})
	r := reservation("rsv_1", tenantA, 24)
	r.Attributes["undeclared"] = "x"
	r.Attributes["spot"] = "yes" // declared boolean: kept, the decision fails closed on it
	r.Attributes["binding"] = "hard"
	r.Attributes["tenantSecret"] = 1
	put(t, f.s, r)
	mustLoad(t, f.p)
	got, err := f.r.Resolve(ctx, tenantA, Resource{Type: r.Type, ID: r.ID})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"durationHours": 24.0, "gpuCount": 8.0, "gpuModel": "H100", "binding": "hard", "spot": "yes"}
	if fmt.Sprint(got.Attributes) != fmt.Sprint(want) {
		t.Fatalf("Attributes = %v, want %v", got.Attributes, want)
	}
	if st := f.p.Stats(); st.AttributesDropped != 2 {
		t.Fatalf("AttributesDropped = %d, want 2", st.AttributesDropped)
	}
	// The answer is the caller's copy.
	got.Attributes["durationHours"] = 1000.0
	again, _ := f.r.Resolve(ctx, tenantA, Resource{Type: r.Type, ID: r.ID})
	if again.Attributes["durationHours"] != 24.0 {
		t.Fatal("changing an answer changed the projection")
	}
}

// TestProjectionHealth covers the two readings system.selfCheck reports:
// Loaded, and a Lag that keeps growing while tails fail, so a projection
// that stopped following the database shows as stale. (That *Projection
// fits api.ProjectionStatus is checked by the compiler where
// internal/controlplane wires it in.)
func TestProjectionHealth(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, ProjectionOptions{})
	put(t, f.s, pool("pool_1", tenantA))

	f.advance(2 * time.Second)
	if f.p.Loaded() || f.p.Lag() != 2*time.Second {
		t.Fatalf("before the first load: Loaded %v, Lag %v; want false, 2s (counted from creation)", f.p.Loaded(), f.p.Lag())
	}
	mustLoad(t, f.p)
	if !f.p.Loaded() || f.p.Lag() != 0 {
		t.Fatalf("after Load: Loaded %v, Lag %v; want true, 0", f.p.Loaded(), f.p.Lag())
	}

	f.advance(time.Second)
	failing, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.p.TailOnce(failing); err == nil {
		t.Fatal("TailOnce with a cancelled context succeeded")
	}
	f.advance(time.Second)
	if lag := f.p.Lag(); lag != 2*time.Second {
		t.Fatalf("Lag after a failed tail = %v, want 2s (since the last success)", lag)
	}
	if st := f.p.Stats(); st.Loaded != f.p.Loaded() || st.Lag != f.p.Lag() || st.Failures != 1 {
		t.Fatalf("Stats = %+v; want Loaded, Lag as read directly and one failure", st)
	}

	if err := f.p.TailOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if lag := f.p.Lag(); lag != 0 {
		t.Fatalf("Lag after a successful tail = %v, want 0", lag)
	}
}

func BenchmarkResolveHit(b *testing.B) {
	ctx := context.Background()
	f := newFixture(b, ProjectionOptions{})
	rows := make([]store.AuthzResource, 1000)
	for i := range rows {
		rows[i] = reservation(fmt.Sprintf("rsv_%d", i), tenantA, float64(i))
	}
	put(b, f.s, rows...)
	mustLoad(b, f.p)
	res := Resource{Type: "compute-reservation", ID: "rsv_500"}
	if _, err := f.r.Resolve(ctx, tenantA, res); err != nil {
		b.Fatal(err)
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := f.r.Resolve(ctx, tenantA, res); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := f.r.Resolve(ctx, tenantA, res); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	if st := f.p.Stats(); st.Misses != 0 {
		b.Fatalf("hits went to the database: %+v", st)
	}
}

// Refreshes that arrive together while the lock is held (here by a tail
// pass) are answered by one read of all their rows, each installed at the
// value its admission committed.
func TestConcurrentRefreshesShareARead(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, ProjectionOptions{})
	const n = 8
	var rows []store.AuthzResource
	for i := range n {
		rows = append(rows, reservation(fmt.Sprintf("rsv_%d", i), tenantA, 1))
	}
	put(t, f.s, rows...)
	mustLoad(t, f.p)

	errs := make(chan error, n)
	f.p.testHookTailRead = func() {
		for i := range n {
			put(t, f.s, reservation(fmt.Sprintf("rsv_%d", i), tenantA, 2))
			go func() { errs <- f.p.Refresh(ctx, "compute-reservation", fmt.Sprintf("rsv_%d", i), tenantA) }()
		}
		testutil.Eventually(t, 10*time.Second, "every Refresh queued behind the tail", func() bool {
			f.p.refreshMu.Lock()
			defer f.p.refreshMu.Unlock()
			return len(f.p.refreshQ) == n
		})
	}
	mustTail(t, f.p)
	f.p.testHookTailRead = nil
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("Refresh: %v", err)
		}
	}
	for i := range n {
		e, ok := peek(f.p, "compute-reservation", fmt.Sprintf("rsv_%d", i))
		if !ok || e.attributes["durationHours"] != 2.0 {
			t.Fatalf("rsv_%d after the shared read: %v, %v; want durationHours 2", i, e, ok)
		}
	}
	if st := f.p.Stats(); st.Refreshes != n {
		t.Fatalf("Stats = %+v; want %d refreshes", st, n)
	}
}

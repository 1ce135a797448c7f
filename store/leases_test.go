package store_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
)

func acquire(s *store.Store, name, holder string, ttl time.Duration) (store.Lease, error) {
	var l store.Lease
	err := s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		l, err = store.AcquireLease(context.Background(), tx, name, holder, ttl)
		return err
	})
	return l, err
}

func renew(s *store.Store, name, holder string, epoch int64, ttl time.Duration) (store.Lease, error) {
	var l store.Lease
	err := s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		l, err = store.RenewLease(context.Background(), tx, name, holder, epoch, ttl)
		return err
	})
	return l, err
}

func release(s *store.Store, name, holder string, epoch int64) error {
	return s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		return store.ReleaseLease(context.Background(), tx, name, holder, epoch)
	})
}

// expire moves a lease's expiry into the past, as if its ttl had run out,
// without waiting for it.
func expire(t *testing.T, s *store.Store, name string) {
	t.Helper()
	if _, err := s.Pool.Exec(context.Background(), `UPDATE leases SET expires_at = now() - interval '1 second' WHERE name = $1`, name); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, what string, err error, code core.Code) {
	t.Helper()
	if got := core.AsError(err).Code; err == nil || got != code {
		t.Fatalf("%s = %v, want %s", what, err, code)
	}
}

func TestLeases(t *testing.T) {
	s := testenv.Store(t)
	const ttl = time.Minute
	type step struct {
		op     string // acquire, renew, release, expire
		holder string
		epoch  int64 // renew and release: the epoch presented
		want   int64 // the epoch the lease is held at after the step (0: refused)
		code   core.Code
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"a free lease is taken at epoch 1", []step{{op: "acquire", holder: "a", want: 1}}},
		{"the same holder renewing keeps the epoch", []step{
			{op: "acquire", holder: "a", want: 1}, {op: "acquire", holder: "a", want: 1}, {op: "renew", holder: "a", epoch: 1, want: 1}}},
		{"a live lease of another holder is CONFLICT", []step{
			{op: "acquire", holder: "a", want: 1}, {op: "acquire", holder: "b", code: core.CodeConflict}}},
		{"an expired lease is taken over with a higher epoch", []step{
			{op: "acquire", holder: "a", want: 1}, {op: "expire"}, {op: "acquire", holder: "b", want: 2},
			{op: "renew", holder: "a", epoch: 1, code: core.CodeConflict}, {op: "renew", holder: "b", epoch: 2, want: 2}}},
		{"the same holder after expiry takes a new epoch", []step{
			{op: "acquire", holder: "a", want: 1}, {op: "expire"}, {op: "acquire", holder: "a", want: 2}}},
		{"a stale epoch is refused", []step{
			{op: "acquire", holder: "a", want: 1}, {op: "expire"}, {op: "acquire", holder: "a", want: 2},
			{op: "renew", holder: "a", epoch: 1, code: core.CodeConflict}, {op: "release", holder: "a", epoch: 1},
			{op: "acquire", holder: "b", code: core.CodeConflict}}},
		{"an expired lease cannot be renewed", []step{
			{op: "acquire", holder: "a", want: 1}, {op: "expire"}, {op: "renew", holder: "a", epoch: 1, code: core.CodeConflict}}},
		{"renewing a lease never taken is CONFLICT", []step{{op: "renew", holder: "a", epoch: 1, code: core.CodeConflict}}},
		{"release frees the lease for the next holder at a higher epoch", []step{
			{op: "acquire", holder: "a", want: 1}, {op: "release", holder: "a", epoch: 1},
			{op: "renew", holder: "a", epoch: 1, code: core.CodeConflict}, {op: "acquire", holder: "b", want: 2}}},
		{"another holder's release does nothing", []step{
			{op: "acquire", holder: "a", want: 1}, {op: "release", holder: "b", epoch: 1},
			{op: "acquire", holder: "b", code: core.CodeConflict}, {op: "renew", holder: "a", epoch: 1, want: 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := store.SiteBootLease(core.NewID("site"))
			for i, st := range c.steps {
				var (
					l   store.Lease
					err error
				)
				switch st.op {
				case "acquire":
					l, err = acquire(s, name, st.holder, ttl)
				case "renew":
					l, err = renew(s, name, st.holder, st.epoch, ttl)
				case "release":
					if err := release(s, name, st.holder, st.epoch); err != nil {
						t.Fatalf("step %d: release: %v", i, err)
					}
					continue
				case "expire":
					expire(t, s, name)
					continue
				}
				if st.code != "" {
					wantCode(t, st.op+" by "+st.holder, err, st.code)
					if msg := core.AsError(err).Message; strings.Contains(msg, `"a"`) || strings.Contains(msg, "epoch") {
						t.Fatalf("step %d: the refusal names the holder or epoch: %q", i, msg)
					}
					continue
				}
				if err != nil || l.Name != name || l.Holder != st.holder || l.Epoch != st.want || !l.ExpiresAt.After(time.Now().Add(-time.Minute)) {
					t.Fatalf("step %d: %s by %s = %+v, %v; want epoch %d", i, st.op, st.holder, l, err, st.want)
				}
			}
		})
	}
}

func TestLeaseLostMessage(t *testing.T) {
	s := testenv.Store(t)
	name := store.SiteBootLease(core.NewID("site"))
	_, err := renew(s, name, "a", 1, time.Minute)
	if e := core.AsError(err); e.Code != core.CodeConflict || !strings.Contains(e.Message, "lease lost") {
		t.Fatalf("renew of a lost lease = %v, want CONFLICT lease lost", err)
	}
	for _, bad := range []func() error{
		func() error { _, err := acquire(s, "", "a", time.Minute); return err },
		func() error { _, err := acquire(s, name, "", time.Minute); return err },
		func() error { _, err := acquire(s, name, "a", 0); return err },
	} {
		wantCode(t, "acquire with bad input", bad(), core.CodeInvalidInput)
	}
}

// Holders racing for one lease: exactly one takes it, at epoch 1; the rest
// are CONFLICT. Then, the lease expired, they race again: one wins at 2.
func TestLeaseRace(t *testing.T) {
	s := testenv.Store(t)
	name := store.SiteBootLease(core.NewID("site"))
	holders := []string{"a", "b", "c", "d", "e", "f"}
	race := func(wantEpoch int64) {
		t.Helper()
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []store.Lease
		)
		start := make(chan struct{})
		for _, h := range holders {
			wg.Go(func() {
				<-start
				l, err := acquire(s, name, h, time.Minute)
				if err != nil {
					if core.AsError(err).Code != core.CodeConflict {
						t.Errorf("%s: %v, want CONFLICT", h, err)
					}
					return
				}
				mu.Lock()
				winners = append(winners, l)
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		if len(winners) != 1 || winners[0].Epoch != wantEpoch {
			t.Fatalf("winners = %+v, want one at epoch %d", winners, wantEpoch)
		}
	}
	race(1)
	expire(t, s, name)
	race(2)
}

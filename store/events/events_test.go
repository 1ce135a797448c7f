package events_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/events"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func publish(ctx context.Context, s *store.Store, es ...store.Event) error {
	return s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		for _, e := range es {
			if err := store.PublishEvent(ctx, tx, e); err != nil {
				return err
			}
		}
		return nil
	})
}

func listEvents(t *testing.T, s *store.Store, q events.Query) []events.Stored {
	t.Helper()
	ctx := context.Background()
	var out []events.Stored
	err := s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		var err error
		out, err = events.Read(ctx, tx, q)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func rsvEvent(tenant, rsv, to string) store.Event {
	return store.Event{TenantID: tenant, Type: "reservation." + to, ResourceType: "reservation", ResourceID: rsv,
		Data: map[string]any{"to": to}}
}

func TestListEventsCursorAndFilters(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	states := []string{"pending", "placed", "binding", "active", "releasing", "released"}
	for i, st := range states {
		// Two reservations of acme interleaved with globex's, one transaction each.
		if err := publish(ctx, s, rsvEvent("acme", "rsv_a", st), rsvEvent("globex", "rsv_g", st), rsvEvent("acme", fmt.Sprintf("rsv_b%d", i%2), st)); err != nil {
			t.Fatal(err)
		}
	}
	all := listEvents(t, s, events.Query{TenantID: "acme", Limit: 500})
	if len(all) != 12 {
		t.Fatalf("acme has %d events, want 12", len(all))
	}
	for i, e := range all {
		if e.TenantID != "acme" || (i > 0 && e.Seq <= all[i-1].Seq) {
			t.Fatalf("event %d = %+v: not acme's, or out of order", i, e)
		}
	}
	// Paging by cursor returns the same events, in the same order.
	var paged []events.Stored
	after := int64(0)
	for {
		page := listEvents(t, s, events.Query{TenantID: "acme", After: after, Limit: 5})
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		after = page[len(page)-1].Seq
	}
	if !reflect.DeepEqual(paged, all) {
		t.Fatalf("paged %d events, listed %d: not the same", len(paged), len(all))
	}
	byType := listEvents(t, s, events.Query{TenantID: "acme", Types: []string{"reservation.active", "reservation.released", "reservation.nope"}, Limit: 500})
	if len(byType) != 4 {
		t.Fatalf("typed filter gave %d events, want 4", len(byType))
	}
	for _, e := range byType {
		if e.Type != "reservation.active" && e.Type != "reservation.released" {
			t.Fatalf("typed filter kept %s", e.Type)
		}
	}
	byRes := listEvents(t, s, events.Query{TenantID: "acme", ResourceID: "rsv_b1", Limit: 500})
	if len(byRes) != 3 {
		t.Fatalf("resource filter gave %d events, want 3", len(byRes))
	}
	if got := listEvents(t, s, events.Query{TenantID: "acme", ResourceID: "rsv_g", Limit: 500}); len(got) != 0 {
		t.Fatalf("acme sees globex's reservation: %+v", got)
	}
	if got := listEvents(t, s, events.Query{TenantID: "acme", After: all[len(all)-1].Seq, Limit: 500}); len(got) != 0 {
		t.Fatalf("after the last event: %+v", got)
	}
}

// An event numbered in a transaction that commits after a later one is
// never skipped by a reader paging by cursor: numbers follow commit order,
// so the late commit numbers after what the reader has already seen.
func TestListEventsNeverSkipsALateCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := testenv.Store(t)
	first, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(context.Background())
	if err := store.PublishEvent(ctx, first, rsvEvent("acme", "rsv_1", "placed")); err != nil {
		t.Fatal(err)
	}
	// A later transaction publishes and commits while the first is open:
	// publishers do not wait for each other before their commits.
	if err := publish(ctx, s, rsvEvent("acme", "rsv_2", "placed")); err != nil {
		t.Fatal(err)
	}
	got := listEvents(t, s, events.Query{TenantID: "acme", Limit: 10})
	if len(got) != 1 || got[0].ResourceID != "rsv_2" || got[0].Seq != 1 {
		t.Fatalf("acme's events while the first publisher is open = %+v, want rsv_2's as 1", got)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got = listEvents(t, s, events.Query{TenantID: "acme", After: got[0].Seq, Limit: 10})
	if len(got) != 1 || got[0].ResourceID != "rsv_1" || got[0].Seq != 2 {
		t.Fatalf("acme's events after the cursor = %+v, want rsv_1's as 2", got)
	}
}

// A tenant's cursor counts its own events only: with two tenants
// publishing in turn, in transactions of one and of both, each tenant's
// events are numbered 1, 2, 3… with no gap where the other's fell.
func TestEventSequencesArePerTenant(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	for i := range 3 {
		if err := publish(ctx, s, rsvEvent("acme", fmt.Sprintf("rsv_a%d", i), "placed")); err != nil {
			t.Fatal(err)
		}
		if err := publish(ctx, s, rsvEvent("globex", fmt.Sprintf("rsv_g%d", i), "placed"),
			rsvEvent("acme", fmt.Sprintf("rsv_b%d", i), "placed"), rsvEvent("globex", fmt.Sprintf("rsv_h%d", i), "placed")); err != nil {
			t.Fatal(err)
		}
	}
	// A transaction that rolls back takes no number.
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if err := store.PublishEvent(ctx, tx, rsvEvent("acme", "rsv_gone", "placed")); err != nil {
			return err
		}
		return errors.New("roll back")
	}); err == nil {
		t.Fatal("the transaction committed")
	}
	if err := publish(ctx, s, rsvEvent("acme", "rsv_last", "placed")); err != nil {
		t.Fatal(err)
	}
	for tenant, want := range map[string]int{"acme": 7, "globex": 6} {
		got := listEvents(t, s, events.Query{TenantID: tenant, Limit: 100})
		if len(got) != want {
			t.Fatalf("%s has %d events, want %d", tenant, len(got), want)
		}
		for i, e := range got {
			if e.Seq != int64(i+1) || e.TenantID != tenant {
				t.Fatalf("%s's event %d = %+v, want seq %d", tenant, i, e, i+1)
			}
		}
	}
	// In a transaction, the tenant's events keep the order they were
	// published in.
	acme := listEvents(t, s, events.Query{TenantID: "acme", After: 1, Limit: 1})
	if len(acme) != 1 || acme[0].ResourceID != "rsv_b0" {
		t.Fatalf("acme's second event = %+v, want rsv_b0", acme)
	}
}

// The publisher, store.PublishEvent, is tested here too: what it writes is
// read back through this package.

func TestPublishEventRejects(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	ok := rsvEvent("acme", "rsv_1", "placed")
	for name, edit := range map[string]func(e *store.Event){
		"no tenant":        func(e *store.Event) { e.TenantID = "" },
		"no type":          func(e *store.Event) { e.Type = "" },
		"no resource type": func(e *store.Event) { e.ResourceType = "" },
		"no resource id":   func(e *store.Event) { e.ResourceID = "" },
		"data not JSON":    func(e *store.Event) { e.Data = map[string]any{"f": func() {}} },
	} {
		e := ok
		edit(&e)
		if err := publish(ctx, s, e); err == nil {
			t.Errorf("%s: PublishEvent(%+v) succeeded", name, e)
		}
	}
	if got := listEvents(t, s, events.Query{TenantID: "acme", Limit: 10}); len(got) != 0 {
		t.Fatalf("rejected events were stored: %+v", got)
	}
}

// An event exists exactly when its transaction commits.
func TestEventCommitsWithItsTransaction(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	boom := errors.New("boom")
	err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if err := store.PublishEvent(ctx, tx, rsvEvent("acme", "rsv_1", "placed")); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if got := listEvents(t, s, events.Query{TenantID: "acme", Limit: 10}); len(got) != 0 {
		t.Fatalf("a rolled-back event is listed: %+v", got)
	}
	e := rsvEvent("acme", "rsv_1", "active")
	e.ProjectID = "prj_1"
	e.Data = map[string]any{"from": "binding", "to": "active", "poolId": "pool_1", "atoms": []any{"a", "b"}}
	if err := publish(ctx, s, e); err != nil {
		t.Fatal(err)
	}
	got := listEvents(t, s, events.Query{TenantID: "acme", Limit: 10})
	if len(got) != 1 || !core.ValidID("evt", got[0].ID) || got[0].Seq < 1 || !reflect.DeepEqual(got[0].Event, e) ||
		time.Since(got[0].CreatedAt) > time.Hour {
		t.Fatalf("listed %+v, want %+v", got, e)
	}
	var unpublished int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE published_at IS NULL`).Scan(&unpublished); err != nil || unpublished != 1 {
		t.Fatalf("unpublished events = %d, %v; the relay's marker must start NULL", unpublished, err)
	}
	// nil data is stored as {}.
	if err := publish(ctx, s, store.Event{TenantID: "acme", Type: "reservation.released", ResourceType: "reservation", ResourceID: "rsv_1"}); err != nil {
		t.Fatal(err)
	}
	got = listEvents(t, s, events.Query{TenantID: "acme", After: got[0].Seq, Limit: 10})
	if len(got) != 1 || got[0].Data == nil || len(got[0].Data) != 0 {
		t.Fatalf("event without data = %+v", got)
	}
}

// Concurrent publishers, some for one tenant and some for both in either
// order, all commit (no deadlock, no serialization failure), and each
// tenant's numbers are exactly 1..n.
func TestConcurrentPublishersNumberEachTenantWithoutGaps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := testenv.Store(t)
	const writers = 24
	errs := make(chan error, writers)
	for i := range writers {
		go func() {
			var es []store.Event
			switch i % 3 {
			case 0:
				es = []store.Event{rsvEvent("acme", fmt.Sprintf("rsv_%d", i), "placed")}
			case 1:
				es = []store.Event{rsvEvent("acme", fmt.Sprintf("rsv_%d", i), "placed"), rsvEvent("globex", fmt.Sprintf("rsv_%d", i), "placed")}
			default:
				es = []store.Event{rsvEvent("globex", fmt.Sprintf("rsv_%d", i), "placed"), rsvEvent("acme", fmt.Sprintf("rsv_%d", i), "placed")}
			}
			errs <- publish(ctx, s, es...)
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for tenant, want := range map[string]int{"acme": writers, "globex": writers * 2 / 3} {
		got := listEvents(t, s, events.Query{TenantID: tenant, Limit: 100})
		if len(got) != want {
			t.Fatalf("%s has %d events, want %d", tenant, len(got), want)
		}
		for i, e := range got {
			if e.Seq != int64(i+1) {
				t.Fatalf("%s's event %d has seq %d", tenant, i, e.Seq)
			}
		}
	}
}

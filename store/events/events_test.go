package events_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

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

// Publishers do not wait for each other; instead a reader sees an event
// only once every transaction that began before it has ended, so an event
// numbered earlier but committed later is never skipped by a reader paging
// by seq.
func TestListEventsHoldsBackEventsBehindAnOpenTransaction(t *testing.T) {
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
	// A later transaction publishes and commits while the first is open.
	if err := publish(ctx, s, rsvEvent("acme", "rsv_2", "placed")); err != nil {
		t.Fatal(err)
	}
	if got := listEvents(t, s, events.Query{TenantID: "acme", Limit: 10}); len(got) != 0 {
		t.Fatalf("events visible while an earlier publisher is open: %+v", got)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := listEvents(t, s, events.Query{TenantID: "acme", Limit: 10})
	if len(got) != 2 || got[0].ResourceID != "rsv_1" || got[1].ResourceID != "rsv_2" || got[0].Seq >= got[1].Seq {
		t.Fatalf("acme's events = %+v, want rsv_1's then rsv_2's", got)
	}
}

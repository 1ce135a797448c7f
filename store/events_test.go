package store_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/events"
)

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

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
)

func putAuthz(ctx context.Context, s *store.Store, r store.AuthzResource) error {
	return s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return store.PutAuthzResource(ctx, tx, r) })
}

func countChanges(t *testing.T, s *store.Store) int {
	t.Helper()
	var n int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM authz_changes`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPutAuthzResourceRejects(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	ok := store.AuthzResource{Type: "compute-pool", ID: "pool_1", TenantID: "t1"}
	tests := []struct {
		name string
		edit func(r *store.AuthzResource)
	}{
		{"no type", func(r *store.AuthzResource) { r.Type = "" }},
		{"no id", func(r *store.AuthzResource) { r.ID = "" }},
		{"no tenant", func(r *store.AuthzResource) { r.TenantID = "" }},
		{"parent type alone", func(r *store.AuthzResource) { r.ParentType = "compute-pool" }},
		{"parent id alone", func(r *store.AuthzResource) { r.ParentID = "pool_0" }},
		{"nested attribute", func(r *store.AuthzResource) { r.Attributes = map[string]any{"a": map[string]any{}} }},
		{"list attribute", func(r *store.AuthzResource) { r.Attributes = map[string]any{"a": []string{"x"}} }},
		{"empty shared tenant", func(r *store.AuthzResource) { r.SharedWith = []string{""} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.edit(&r)
			if err := putAuthz(ctx, s, r); err == nil {
				t.Fatalf("PutAuthzResource(%+v) succeeded", r)
			}
		})
	}
	if n := countChanges(t, s); n != 0 {
		t.Fatalf("%d changes recorded by rejected puts", n)
	}
}

func TestAuthzResourceRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	in := store.AuthzResource{
		Type: "compute-reservation", ID: "rsv_1", TenantID: "t1", OwnerID: "idn_1",
		ParentType: "compute-pool", ParentID: "pool_1",
		Attributes: map[string]any{"durationHours": 72, "spot": false, "gpuModel": "H100"},
		SharedWith: []string{"t3", "t2", "t1", "t3"},
	}
	if err := putAuthz(ctx, s, in); err != nil {
		t.Fatal(err)
	}
	got, err := store.GetAuthzResource(ctx, s.Pool, "compute-reservation", "rsv_1")
	if err != nil {
		t.Fatal(err)
	}
	if got.UpdatedAt.IsZero() {
		t.Fatal("UpdatedAt not set")
	}
	got.UpdatedAt = time.Time{}
	want := in
	want.Attributes = map[string]any{"durationHours": 72.0, "spot": false, "gpuModel": "H100"}
	want.SharedWith = []string{"t2", "t3"} // sorted, once, without the owner
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("read back %+v, want %+v", got, want)
	}

	// Writing the same row again records no change; a real change does.
	before := countChanges(t, s)
	if err := putAuthz(ctx, s, in); err != nil {
		t.Fatal(err)
	}
	if n := countChanges(t, s); n != before {
		t.Fatalf("an identical put recorded %d changes", n-before)
	}
	in.Attributes = map[string]any{"durationHours": 73}
	if err := putAuthz(ctx, s, in); err != nil {
		t.Fatal(err)
	}
	if n := countChanges(t, s); n != before+1 {
		t.Fatalf("a changing put recorded %d changes, want 1", n-before)
	}

	// A row without owner, parent or attributes.
	bare := store.AuthzResource{Type: "compute-project", ID: "prj_1", TenantID: "t1"}
	if err := putAuthz(ctx, s, bare); err != nil {
		t.Fatal(err)
	}
	got, err = store.GetAuthzResource(ctx, s.Pool, "compute-project", "prj_1")
	if err != nil || got.OwnerID != "" || got.ParentType != "" || len(got.Attributes) != 0 || got.SharedWith == nil {
		t.Fatalf("bare row = %+v, %v", got, err)
	}

	// Delete, twice.
	for range 2 {
		if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			return store.DeleteAuthzResource(ctx, tx, "compute-project", "prj_1")
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.GetAuthzResource(ctx, s.Pool, "compute-project", "prj_1"); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("Get after delete = %v, want NOT_FOUND", err)
	}
}

func TestAuthzChangesFollowTheTransaction(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	boom := errors.New("boom")
	err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if err := store.PutAuthzResource(ctx, tx, store.AuthzResource{Type: "compute-pool", ID: "p", TenantID: "t"}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if n := countChanges(t, s); n != 0 {
		t.Fatalf("a rolled-back put left %d changes", n)
	}
	st, err := s.LoadAuthz(ctx)
	if err != nil || len(st.Resources) != 0 || st.MaxSeq != 0 || st.Snapshot == "" {
		t.Fatalf("LoadAuthz = %+v, %v", st, err)
	}
	if err := putAuthz(ctx, s, store.AuthzResource{Type: "compute-pool", ID: "p", TenantID: "t"}); err != nil {
		t.Fatal(err)
	}
	d, err := s.ReadAuthzChanges(ctx, st.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Changes) != 1 || d.Changes[0].Resource == nil || d.Changes[0].Resource.TenantID != "t" || d.MaxSeq != d.Changes[0].Seq {
		t.Fatalf("ReadAuthzChanges = %+v", d)
	}
	if d2, err := s.ReadAuthzChanges(ctx, d.Snapshot); err != nil || len(d2.Changes) != 0 {
		t.Fatalf("ReadAuthzChanges again = %+v, %v", d2, err)
	}
}

func TestPruneAuthzChanges(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	for _, id := range []string{"a", "b", "c"} {
		if err := putAuthz(ctx, s, store.AuthzResource{Type: "compute-pool", ID: id, TenantID: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Pool.Exec(ctx, `UPDATE authz_changes SET changed_at = now() - interval '2 hours' WHERE id IN ('a', 'b')`); err != nil {
		t.Fatal(err)
	}
	n, err := store.PruneAuthzChanges(ctx, s.Pool, 0)
	if err != nil || n != 2 {
		t.Fatalf("PruneAuthzChanges = %d, %v; want 2", n, err)
	}
	if n := countChanges(t, s); n != 1 {
		t.Fatalf("%d changes left, want 1", n)
	}
	if n, err := store.PruneAuthzChanges(ctx, s.Pool, time.Nanosecond); err != nil || n != 1 {
		t.Fatalf("PruneAuthzChanges(1ns) = %d, %v; want 1", n, err)
	}
}

func TestListenAuthzChanges(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := testenv.Store(t)
	notes := make(chan struct{}, 16)
	done := make(chan error, 1)
	go func() { done <- s.ListenAuthzChanges(ctx, func() { notes <- struct{}{} }) }()
	<-notes // listening
	if err := putAuthz(ctx, s, store.AuthzResource{Type: "compute-pool", ID: "p", TenantID: "t"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-notes:
	case err := <-done:
		t.Fatalf("listener ended: %v", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("listener ended with %v, want context.Canceled", err)
	}
}

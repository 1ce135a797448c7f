package api_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// An owner-scoped list (reservations.list) with scope "mine" — the default —
// is one decision on the tenant and the handler's SQL owner filter, with no
// per-item decisions; scope "all" decides every item.
func TestOwnerScopedListScopes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	typ := e.catalog.FullName("reservation")
	var ids []string
	err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		for range 60 {
			id := core.NewID("rsv")
			ids = append(ids, id)
			row := store.AuthzResource{Type: typ, ID: id, TenantID: "acme", ParentType: e.catalog.FullName("pool"), ParentID: core.NewID("pool")}
			if err := store.PutAuthzResource(ctx, tx, row); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var seenScope string
	api.ServeTestList(e.server, "reservations.list", func(_ context.Context, c *api.Call, _ store.Tx) ([]api.TestItem, error) {
		seenScope = c.Scope
		items := make([]api.TestItem, len(ids))
		for i, id := range ids {
			items[i] = api.TestItem{Resource: iam.Resource{Type: typ, ID: id}, Value: id}
		}
		return items, nil
	})
	cases := []struct {
		body    string
		scope   string
		batches int64
	}{
		{`{"tenantId":"acme"}`, "mine", 0},
		{`{"tenantId":"acme","scope":"mine"}`, "mine", 0},
		{`{"tenantId":"acme","scope":"all"}`, "all", 2},
	}
	for _, c := range cases {
		e.outer.reset()
		e.cache.DropDecisions()
		status, body := e.call(e.boot.UserToken, "reservations.list", c.body)
		var got []string
		if status != 200 || json.Unmarshal([]byte(body), &got) != nil || len(got) != 60 {
			t.Fatalf("%s = %d %.200s", c.body, status, body)
		}
		if seenScope != c.scope || e.outer.batches.Load() != c.batches || e.outer.authorize.Load() != 1 {
			t.Fatalf("%s: scope %q, %d batches, %d authorize; want %q, %d, 1",
				c.body, seenScope, e.outer.batches.Load(), e.outer.authorize.Load(), c.scope, c.batches)
		}
	}
	if status, _ := e.call(e.boot.UserToken, "reservations.list", `{"tenantId":"acme","scope":"some"}`); status != 400 {
		t.Fatalf("an unknown scope = %d, want 400", status)
	}
}

// When IAM does not know an item yet (NOT_FOUND aborts the batch), the list
// waits, reloads the page and retries once; a second NOT_FOUND fails the
// request rather than answering a partial list.
func TestListRetriesOnceWhenIAMDoesNotKnowAnItem(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	typ := e.catalog.FullName("reservation")
	known := core.NewID("rsv")
	row := store.AuthzResource{Type: typ, ID: known, TenantID: "acme", ParentType: e.catalog.FullName("pool"), ParentID: core.NewID("pool")}
	if err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return store.PutAuthzResource(ctx, tx, row) }); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name          string
		unknownReads  int // how many page reads include an item IAM does not know
		status, reads int
	}{
		{"caught up after one reload", 1, 200, 2},
		{"still unknown after the reload", 2, 404, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			reads := 0
			api.ServeTestList(e.server, "reservations.list", func(context.Context, *api.Call, store.Tx) ([]api.TestItem, error) {
				reads++
				items := []api.TestItem{{Resource: iam.Resource{Type: typ, ID: known}, Value: known}}
				if reads <= c.unknownReads {
					items = append(items, api.TestItem{Resource: iam.Resource{Type: typ, ID: core.NewID("rsv")}, Value: "ghost"})
				}
				return items, nil
			})
			e.cache.DropDecisions()
			status, body := e.call(e.boot.UserToken, "reservations.list", `{"tenantId":"acme","scope":"all"}`)
			if status != c.status || reads != c.reads {
				t.Fatalf("= %d %s after %d page reads; want %d after %d", status, body, reads, c.status, c.reads)
			}
		})
	}
}

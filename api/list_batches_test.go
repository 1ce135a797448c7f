package api_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// listOfKnown serves reservations.list with n items IAM knows (each with an
// authorization row in acme), plus what extra adds on each page read.
func listOfKnown(t *testing.T, e *env, n int, extra func(read int) []api.TestItem) (ids []string, reads *int) {
	t.Helper()
	ctx := context.Background()
	typ := e.catalog.FullName("reservation")
	err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		for range n {
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
	reads = new(int)
	api.ServeTestList(e.server, "reservations.list", func(context.Context, *api.Call, store.Tx) ([]api.TestItem, error) {
		*reads++
		items := make([]api.TestItem, 0, n)
		for _, id := range ids {
			items = append(items, api.TestItem{Resource: iam.Resource{Type: typ, ID: id}, Value: id})
		}
		return append(items, extra(*reads)...), nil
	})
	return ids, reads
}

// The batches of a page are sent concurrently, and the answer keeps the
// page's order.
func TestListConcurrentBatchesAnswerInOrder(t *testing.T) {
	e := newEnv(t)
	ids, _ := listOfKnown(t, e, 230, func(int) []api.TestItem { return nil })
	e.cache.DropDecisions()
	e.outer.reset()
	status, body := e.call(e.boot.UserToken, "reservations.list", `{"tenantId":"acme","scope":"all","limit":500}`)
	var got []string
	if status != 200 || json.Unmarshal([]byte(body), &got) != nil {
		t.Fatalf("= %d %.300s", status, body)
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("listed %d items out of the page's order", len(got))
	}
	if n := e.outer.batches.Load(); n != 5 {
		t.Fatalf("%d batches, want 5", n)
	}
}

// One failing batch fails the whole list with its error: no partial page.
func TestListOneFailingBatchFailsTheList(t *testing.T) {
	e := newEnv(t)
	ids, reads := listOfKnown(t, e, 180, func(int) []api.TestItem { return nil })
	bad := ids[160] // in the fourth batch
	fail := func(rs []iam.Request) error {
		for _, r := range rs {
			if r.Resource.ID == bad {
				return core.Errorf(core.CodeUnavailable, "IAM is unreachable")
			}
		}
		return nil
	}
	e.outer.onMany.Store(&fail)
	defer e.outer.onMany.Store(nil)
	e.cache.DropDecisions()
	status, body := e.call(e.boot.UserToken, "reservations.list", `{"tenantId":"acme","scope":"all","limit":500}`)
	if status != 503 || !json.Valid([]byte(body)) || !containsCode(body, core.CodeUnavailable) || *reads != 1 {
		t.Fatalf("= %d %.300s after %d page reads; want 503 UNAVAILABLE after 1", status, body, *reads)
	}
}

// A NOT_FOUND in any batch, not only the first, reloads the page once.
func TestListRetriesWhenALaterBatchDoesNotKnowAnItem(t *testing.T) {
	e := newEnv(t)
	typ := e.catalog.FullName("reservation")
	ids, reads := listOfKnown(t, e, 149, func(read int) []api.TestItem {
		if read > 1 {
			return nil
		}
		return []api.TestItem{{Resource: iam.Resource{Type: typ, ID: core.NewID("rsv")}, Value: "ghost"}}
	})
	e.cache.DropDecisions()
	status, body := e.call(e.boot.UserToken, "reservations.list", `{"tenantId":"acme","scope":"all","limit":500}`)
	var got []string
	if status != 200 || json.Unmarshal([]byte(body), &got) != nil || !slices.Equal(got, ids) || *reads != 2 {
		t.Fatalf("= %d %.200s after %d page reads; want the %d known items after 2", status, body, *reads, len(ids))
	}
}

// containsCode reports whether body is the error body of code.
func containsCode(body string, code core.Code) bool {
	var b struct {
		Error struct {
			Code core.Code `json:"code"`
		} `json:"error"`
	}
	return json.Unmarshal([]byte(body), &b) == nil && b.Error.Code == code
}

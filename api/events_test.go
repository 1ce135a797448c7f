package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api/events"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// publishEvents writes events straight to the outbox, one transaction each.
func (e *env) publishEvents(events ...store.Event) {
	e.t.Helper()
	ctx := context.Background()
	for _, ev := range events {
		if err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return store.PublishEvent(ctx, tx, ev) }); err != nil {
			e.t.Fatal(err)
		}
	}
}

func reservationEvent(tenant, rsv, project, from, to string) store.Event {
	return store.Event{TenantID: tenant, Type: "reservation." + to, ResourceType: "reservation", ResourceID: rsv,
		ProjectID: project, Data: map[string]any{"from": from, "to": to, "poolId": "pool_1"}}
}

func TestEventsList(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, g := e.client(e.boot.UserToken), e.client(e.globex)
	e.publishEvents(
		reservationEvent("acme", "rsv_a", "prj_1", "draft", "pending"),
		reservationEvent("globex", "rsv_g", "", "draft", "pending"),
		reservationEvent("acme", "rsv_a", "prj_1", "pending", "placed"),
		reservationEvent("acme", "rsv_b", "", "draft", "pending"),
		reservationEvent("acme", "rsv_a", "prj_1", "placed", "binding"),
		reservationEvent("globex", "rsv_g", "", "pending", "placed"),
		reservationEvent("acme", "rsv_a", "prj_1", "binding", "active"),
	)
	all, err := events.List.Call(ctx, a, events.ListInput{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != 5 || all.NextCursor == "" {
		t.Fatalf("acme's events = %+v", all)
	}
	first := all.Items[0]
	if !core.ValidID("evt", first.ID) || first.Type != "reservation.pending" || first.ResourceType != "reservation" ||
		first.ResourceID != "rsv_a" || first.ProjectID != "prj_1" || first.Data["from"] != "draft" || first.Data["poolId"] != "pool_1" ||
		first.CreatedAt <= 0 {
		t.Fatalf("first event = %+v", first)
	}
	for i, it := range all.Items {
		if strings.HasPrefix(it.ResourceID, "rsv_g") || (i > 0 && it.Seq <= all.Items[i-1].Seq) {
			t.Fatalf("acme's list: item %d = %+v (another tenant's, or out of order)", i, it)
		}
	}
	// The project is left out when there is none.
	if _, body := e.call(e.boot.UserToken, "events.list", `{"tenantId":"acme","resourceId":"rsv_b"}`); strings.Contains(body, "projectId") {
		t.Fatalf("an event without a project names one: %s", body)
	}

	// Globex sees its own, and may not ask for acme's; acme's stranger has no policy.
	if own, err := events.List.Call(ctx, g, events.ListInput{TenantID: "globex"}); err != nil || len(own.Items) != 2 || own.Items[0].ResourceID != "rsv_g" {
		t.Fatalf("globex's events = %+v, %v", own, err)
	}
	if _, err := events.List.Call(ctx, g, events.ListInput{TenantID: "acme"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex listing acme's events = %v, want ACCESS_DENIED", err)
	}
	if _, err := events.List.Call(ctx, e.client(e.stranger), events.ListInput{TenantID: "acme"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("acme's stranger listing events = %v, want ACCESS_DENIED", err)
	}

	// Paging by cursor: pages of two give the same events; the empty page
	// at the end has no nextCursor, and the reader keeps its own.
	var paged []events.Event
	cursor := ""
	for range 10 {
		page, err := events.List.Call(ctx, a, events.ListInput{TenantID: "acme", ListInput: rpc.ListInput{Cursor: cursor, Limit: 2}})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) > 2 {
			t.Fatalf("page of %d items, limit 2", len(page.Items))
		}
		if len(page.Items) == 0 {
			if page.NextCursor != "" {
				t.Fatalf("empty page's nextCursor = %q, want none", page.NextCursor)
			}
			break
		}
		paged = append(paged, page.Items...)
		cursor = page.NextCursor
	}
	if len(paged) != len(all.Items) {
		t.Fatalf("paged %d events, want %d", len(paged), len(all.Items))
	}
	for i := range paged {
		if paged[i].ID != all.Items[i].ID {
			t.Fatalf("page item %d = %s, want %s", i, paged[i].ID, all.Items[i].ID)
		}
	}
	// New events arrive after the cursor.
	e.publishEvents(reservationEvent("acme", "rsv_b", "", "pending", "failed"))
	if page, err := events.List.Call(ctx, a, events.ListInput{TenantID: "acme", ListInput: rpc.ListInput{Cursor: cursor}}); err != nil || len(page.Items) != 1 ||
		page.Items[0].Type != "reservation.failed" || page.NextCursor == "" {
		t.Fatalf("after the cursor = %+v, %v", page, err)
	}

	// Filters: exact types, and one resource.
	typed, err := events.List.Call(ctx, a, events.ListInput{TenantID: "acme", Types: []string{"reservation.pending", "reservation.active", "reservation"}})
	if err != nil || len(typed.Items) != 3 {
		t.Fatalf("typed = %+v, %v", typed, err)
	}
	for _, it := range typed.Items {
		if it.Type != "reservation.pending" && it.Type != "reservation.active" {
			t.Fatalf("typed filter kept %s", it.Type)
		}
	}
	if byRes, err := events.List.Call(ctx, a, events.ListInput{TenantID: "acme", ResourceID: "rsv_b"}); err != nil || len(byRes.Items) != 2 {
		t.Fatalf("rsv_b's events = %+v, %v", byRes, err)
	}
	if byRes, err := events.List.Call(ctx, a, events.ListInput{TenantID: "acme", ResourceID: "rsv_g"}); err != nil || len(byRes.Items) != 0 {
		t.Fatalf("acme filtering on globex's reservation = %+v, %v", byRes, err)
	}
}

func TestEventsListInvalidInput(t *testing.T) {
	e := newEnv(t)
	many := make([]string, 33)
	for i := range many {
		many[i] = fmt.Sprintf(`"t%d"`, i)
	}
	e.wantInvalid(e.boot.UserToken, "events.list", map[string]string{
		`{}`:                               "tenantId",
		`{"tenantId":"acme","limit":0}`:    "limit",
		`{"tenantId":"acme","limit":501}`:  "limit",
		`{"tenantId":"acme","limit":"5"}`:  "limit",
		`{"tenantId":"acme","cursor":""}`:  "cursor",
		`{"tenantId":"acme","cursor":"%"}`: "cursor",
		`{"tenantId":"acme","after":1}`:    "after", // the seq cursor gave way to cursor
		`{"tenantId":"acme","types":"a"}`:  "types",
		`{"tenantId":"acme","types":[1]}`:  "types.0",
		`{"tenantId":"acme","types":[""]}`: "types.0",
		`{"tenantId":"acme","types":["a","` + strings.Repeat("t", 129) + `"]}`: "types.1",
		`{"tenantId":"acme","resourceId":""}`:                                  "resourceId",
		`{"tenantId":"acme","projectId":"x"}`:                                  "projectId",
		`{"tenantId":"acme","types":[` + strings.Join(many, ",") + `]}`:        "types",
	})
	// 32 types are fine.
	if status, body := e.call(e.boot.UserToken, "events.list", `{"tenantId":"acme","types":[`+strings.Join(many[:32], ",")+`]}`); status != 200 {
		t.Fatalf("32 types = %d %s", status, body)
	}
}

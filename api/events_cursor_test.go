package api_test

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/api/events"
	"github.com/better-compute/better-compute/api/rpc"
)

// events.list's cursor counts the tenant's own events: interleaved with
// another tenant's, each tenant's events are numbered 1, 2, 3… so the gaps
// of a cursor say nothing of anyone else's volume.
func TestEventsListCursorHasNoGapsFromOtherTenants(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.publishEvents(
		reservationEvent("acme", "rsv_a", "", "draft", "pending"),
		reservationEvent("globex", "rsv_g", "", "draft", "pending"),
		reservationEvent("globex", "rsv_g", "", "pending", "placed"),
		reservationEvent("acme", "rsv_a", "", "pending", "placed"),
		reservationEvent("globex", "rsv_g", "", "placed", "binding"),
		reservationEvent("acme", "rsv_a", "", "placed", "binding"),
	)
	for token, tenant := range map[string]string{e.boot.UserToken: "acme", e.globex: "globex"} {
		cursor := ""
		for want := int64(1); want <= 3; want++ {
			page, err := events.List.Call(ctx, e.client(token), events.ListInput{TenantID: tenant, ListInput: rpc.ListInput{Cursor: cursor, Limit: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Items) != 1 || page.Items[0].Seq != want || page.NextCursor == "" {
				t.Fatalf("%s's page after %q = %+v, want its event %d", tenant, cursor, page, want)
			}
			cursor = page.NextCursor
		}
	}
}

package api_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// A get of another tenant's row in one's own tenant sends the database the
// very queries a get of a missing id sends, so neither the answer nor the
// time it takes tells a caller that the row exists elsewhere.
func TestForeignRowAndMissingIDSendTheSameQueries(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, c := range []struct{ method, typ, field, prefix string }{
		{"projects.get", "project", "projectId", "prj"},
		{"sites.get", "site", "siteId", "site"},
		{"pools.get", "pool", "poolId", "pool"},
		{"nodes.get", "node", "nodeId", "node"},
		{"reservations.get", "reservation", "reservationId", "rsv"},
	} {
		// acme's row, held in the projection's memory.
		r := iam.Resource{Type: e.catalog.FullName(c.typ), ID: core.NewID(c.prefix)}
		if err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			return store.PutAuthzResource(ctx, tx, store.AuthzResource{Type: r.Type, ID: r.ID, TenantID: "acme"})
		}); err != nil {
			t.Fatal(err)
		}
		if err := e.outer.RefreshResource(ctx, "acme", r); err != nil {
			t.Fatal(err)
		}
		var bodies []string
		var queries [][]string
		for _, id := range []string{r.ID, core.NewID(c.prefix)} {
			// Warm every cache that is not about the id (authentication,
			// policies) with a first call, then record a second one.
			body := fmt.Sprintf(`{"tenantId":"globex",%q:%q}`, c.field, id)
			e.call(e.globex, c.method, body)
			e.queries.take()
			status, out := e.call(e.globex, c.method, body)
			if status != 404 || !strings.Contains(out, "NOT_FOUND") {
				t.Fatalf("%s of %s in globex = %d %s", c.method, id, status, out)
			}
			bodies = append(bodies, strings.ReplaceAll(out, id, "ID"))
			queries = append(queries, e.queries.take())
		}
		if bodies[0] != bodies[1] {
			t.Errorf("%s: a foreign row and a missing id answer differently:\n%s\n%s", c.method, bodies[0], bodies[1])
		}
		if !slices.Equal(queries[0], queries[1]) {
			t.Errorf("%s: a foreign row sent %d queries %q; a missing id %d %q", c.method,
				len(queries[0]), queries[0], len(queries[1]), queries[1])
		}
	}
}

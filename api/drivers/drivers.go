// Package drivers describes the drivers.* methods: the BMC drivers the
// site agents run, their versions and the concerns each serves.
package drivers

import (
	"context"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	domain "github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/store"
)

// Info is one driver: its name (what a node's driver bindings name), its
// protocol, the library and version it is built on, and its concerns.
type Info = domain.Info

// ListOutput is drivers.list's answer: a page of the catalog, by name.
type ListOutput struct {
	Items      []Info `json:"items"`
	NextCursor string `json:"nextCursor,omitempty"`
}

// The methods.
const (
	List rpc.Ref[rpc.TenantListInput, ListOutput] = "drivers.list"
)

// Methods describes the drivers.* methods.
func Methods(rpc.Deps) []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[rpc.TenantListInput, ListOutput]{Name: List, Action: "compute:drivers:read", DecidedOn: "compute-tenant",
			Phase: "v0.2", Kind: core.KindRead,
			// The catalog is the build's, the same for every tenant: a
			// tenant's bindings choose among these names.
			Run: func(_ context.Context, _ *rpc.Call, _ store.Tx, in rpc.TenantListInput) (ListOutput, error) {
				q, err := in.Page()
				if err != nil {
					return ListOutput{}, err
				}
				all := domain.Catalog()
				slices.SortFunc(all, func(a, b Info) int { return strings.Compare(a.Name, b.Name) })
				var rows []Info
				for _, d := range all {
					if q.After == nil || d.Name > q.After.ID {
						rows = append(rows, d)
					}
				}
				var out ListOutput
				out.Items, out.NextCursor = rpc.Paged(rows, q, func(d Info) store.Key { return store.Key{ID: d.Name} })
				return out, nil
			}},
	}
}

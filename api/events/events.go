// Package events describes the events.* methods.
package events

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/events"
)

// Event is one domain event as events.list answers it.
type Event = domain.Event

// Page is events.list's answer: the events and the next page's cursor.
type Page = domain.Page

// ListInput is events.list's input; zero fields are left out. Types are
// exact event types (none means all).
type ListInput struct {
	TenantID   string   `json:"tenantId" jsonschema:"required" id:"tenant"`
	Types      []string `json:"types,omitempty" jsonschema:"maxItems=32,minLength=1,maxLength=128" maxBytes:"8192"`
	ResourceID string   `json:"resourceId,omitempty" jsonschema:"minLength=1,maxLength=200"`
	rpc.ListInput
}

// The methods.
const (
	List rpc.Ref[ListInput, Page] = "events.list"
)

// Methods describes the events.* methods.
func Methods(rpc.Deps) []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[ListInput, Page]{Name: List, Action: "compute:events:read", DecidedOn: "compute-tenant",
			Phase: "v0.1", Kind: core.KindRead,
			// By the tenant's own event sequence (seq), ascending.
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (Page, error) {
				q, err := in.Page()
				if err != nil {
					return Page{}, err
				}
				return domain.List(ctx, tx, domain.Query{TenantID: c.TenantID, After: q.AfterKey().Seq, Types: in.Types,
					ResourceID: in.ResourceID, Limit: q.Limit})
			}},
	}
}

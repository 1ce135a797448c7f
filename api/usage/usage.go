// Package usage describes the usage.* methods.
package usage

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/usage"
)

// Item is one group's usage of one (class, gpuModel).
type Item = domain.Item

// Report is usage.list's answer: the items and their total GPU-hours.
type Report = domain.Report

// ListInput is usage.list's input. From and To are epoch milliseconds, To
// after From and at most 366 days later (the domain checks the window);
// GroupBy defaults to "tenant". With a project, the call is decided on it.
type ListInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	From      int64  `json:"from" jsonschema:"required,minimum=0,maximum=9007199254740992" unit:"epoch-ms"`
	To        int64  `json:"to" jsonschema:"required" unit:"epoch-ms"`
	ProjectID string `json:"projectId,omitempty" id:"prj"`
	GroupBy   string `json:"groupBy,omitempty" jsonschema:"enum=tenant,enum=project,enum=reservation"`
	rpc.ListInput
}

// The groupings usage.list's groupBy names.
const (
	ByTenant      = domain.ByTenant
	ByProject     = domain.ByProject
	ByReservation = domain.ByReservation
)

// The methods.
const (
	List rpc.Ref[ListInput, Report] = "usage.list"
)

// Methods describes the usage.* methods.
func Methods(rpc.Deps) []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[ListInput, Report]{Name: List, Action: "compute:usage:read", DecidedOn: "compute-tenant or compute-project",
			Phase: "v0.1", Kind: core.KindRead,
			// By group: project, reservation, class, gpuModel, ascending.
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (Report, error) {
				q, err := in.Page()
				if err != nil {
					return Report{}, err
				}
				r, err := domain.List(ctx, tx, c.TenantID, in.ProjectID, in.From, in.To, in.GroupBy, q)
				r.Items, r.NextCursor = rpc.Paged(r.Items, q, Item.GroupKey)
				return r, err
			}},
	}
}

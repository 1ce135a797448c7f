// Package flavors describes the flavors.* methods: a pool's instance
// shapes, decided on the pool. Its owner manages them; whoever may read
// the pool's flavors (its owner, the tenants it is offered to) lists them.
package flavors

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/flavors"
)

// Flavor is a flavor as the methods answer it.
type Flavor = domain.Flavor

// FlavorList is flavors.list's answer.
type FlavorList struct {
	Items      []Flavor `json:"items"`
	NextCursor string   `json:"nextCursor,omitempty"`
}

// ListInput is flavors.list's input: the live flavors of a pool, oldest
// first.
type ListInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
	rpc.ListInput
}

// CreateInput is flavors.create's input. On a vps-host pool: the shape and
// the runtime; on a provider pool: the provider's size and its shape, as
// providerAccounts.offers answers it (offers flags a flavor whose shape is
// not its size's).
type CreateInput struct {
	TenantID     string  `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID       string  `json:"poolId" jsonschema:"required" id:"pool"`
	Name         string  `json:"name" jsonschema:"required,maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	VCPU         int     `json:"vcpu" jsonschema:"required,minimum=1,maximum=256"`
	MemoryGiB    float64 `json:"memoryGiB" jsonschema:"required,minimum=0.0625,maximum=4096" jsonschema_description:"Memory in GiB, a whole number of MiB (a multiple of 1/1024)."`
	DiskGiB      int     `json:"diskGiB,omitempty" jsonschema:"minimum=0,maximum=65536"`
	GPUs         int     `json:"gpus,omitempty" jsonschema:"minimum=0,maximum=16" jsonschema_description:"GPUs per instance, booked as the pool's sharing offers them (whole GPUs, MIG instances or slots)."`
	Runtime      string  `json:"runtime,omitempty" jsonschema:"enum=container,enum=vm" jsonschema_description:"container or vm; required on vps-host pools, refused on provider pools."`
	ProviderSize string  `json:"providerSize,omitempty" jsonschema:"maxLength=64,pattern=^[a-z0-9][a-z0-9.-]{0\\,63}$" jsonschema_description:"The provider's size slug; required on provider pools, refused on vps-host pools."`
}

// UpdateInput is flavors.update's input: a new name or shape (running
// instances keep theirs until resized); fields left out are kept. The
// runtime never changes.
type UpdateInput struct {
	TenantID     string   `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID       string   `json:"poolId" jsonschema:"required" id:"pool"`
	FlavorID     string   `json:"flavorId" jsonschema:"required" id:"flv"`
	Name         *string  `json:"name,omitempty" jsonschema:"maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	VCPU         *int     `json:"vcpu,omitempty" jsonschema:"minimum=1,maximum=256"`
	MemoryGiB    *float64 `json:"memoryGiB,omitempty" jsonschema:"minimum=0.0625,maximum=4096"`
	DiskGiB      *int     `json:"diskGiB,omitempty" jsonschema:"minimum=0,maximum=65536"`
	GPUs         *int     `json:"gpus,omitempty" jsonschema:"minimum=0,maximum=16"`
	ProviderSize *string  `json:"providerSize,omitempty" jsonschema:"maxLength=64,pattern=^[a-z0-9][a-z0-9.-]{0\\,63}$"`
}

// FlavorInput names one flavor of a pool.
type FlavorInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
	FlavorID string `json:"flavorId" jsonschema:"required" id:"flv"`
}

// The methods.
const (
	List   rpc.Ref[ListInput, FlavorList] = "flavors.list"
	Create rpc.Ref[CreateInput, Flavor]   = "flavors.create"
	Update rpc.Ref[UpdateInput, Flavor]   = "flavors.update"
	Delete rpc.Ref[FlavorInput, Flavor]   = "flavors.delete"
)

// Methods describes the flavors.* methods.
func Methods(rpc.Deps) []rpc.Descriptor {
	return []rpc.Descriptor{
		// Oldest first: creation millisecond, then id. The decision on the
		// pool covers every item: flavors have no resource of their own.
		&rpc.Method[ListInput, FlavorList]{Name: List, Action: "compute:flavors:read", DecidedOn: "compute-pool",
			Phase: "v0.3", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (FlavorList, error) {
				q, err := in.Page()
				if err != nil {
					return FlavorList{}, err
				}
				rows, err := domain.List(ctx, tx, c.TenantID, in.PoolID, q)
				if err != nil {
					return FlavorList{}, err
				}
				items, next := rpc.Paged(rows, q, func(f Flavor) store.Key { return store.Key{At: f.CreatedAt, ID: f.ID} })
				return FlavorList{Items: items, NextCursor: next}, nil
			}},
		&rpc.Method[CreateInput, Flavor]{Name: Create, Action: "compute:flavors:manage", DecidedOn: "compute-pool",
			Phase: "v0.3", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateInput) (Flavor, error) {
				mib, err := domain.MemoryMiBOf(in.MemoryGiB)
				if err != nil {
					return Flavor{}, err
				}
				return domain.Create(ctx, tx, c.TenantID, domain.New{PoolID: in.PoolID, Name: in.Name,
					Shape:   domain.Shape{VCPU: in.VCPU, MemoryMiB: mib, DiskGiB: in.DiskGiB, GPUs: in.GPUs},
					Runtime: in.Runtime, ProviderSize: in.ProviderSize})
			}},
		&rpc.Method[UpdateInput, Flavor]{Name: Update, Action: "compute:flavors:manage", DecidedOn: "compute-pool",
			Phase: "v0.3", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in UpdateInput) (Flavor, error) {
				ch := domain.Change{Name: in.Name, VCPU: in.VCPU, DiskGiB: in.DiskGiB, GPUs: in.GPUs, ProviderSize: in.ProviderSize}
				if in.MemoryGiB != nil {
					mib, err := domain.MemoryMiBOf(*in.MemoryGiB)
					if err != nil {
						return Flavor{}, err
					}
					ch.MemoryMiB = &mib
				}
				return domain.Update(ctx, tx, c.TenantID, in.PoolID, in.FlavorID, ch)
			}},
		&rpc.Method[FlavorInput, Flavor]{Name: Delete, Action: "compute:flavors:manage", DecidedOn: "compute-pool",
			Phase: "v0.3", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in FlavorInput) (Flavor, error) {
				return domain.Delete(ctx, tx, c.TenantID, in.PoolID, in.FlavorID)
			}},
	}
}

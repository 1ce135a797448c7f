// Package pools describes the pools.* methods (but pools.capacity, which
// is the capacity domain's) and the quotas.* methods: a tenant's quotas
// are the offers of pools to it.
package pools

import (
	"context"
	"errors"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	policy "github.com/better-compute/better-compute/core/pools"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/store/sites"
)

// Pool is a pool as the methods answer it.
type Pool = domain.Pool

// PoolOffer is an offer of a pool to a tenant, with its quota.
type PoolOffer = domain.Offer

// Policy is a pool's policy.
type Policy = policy.Policy

// Quota maps resources to the amounts an offer grants.
type Quota = policy.Quota

// PoolList is pools.list's answer.
type PoolList struct {
	Items      []Pool `json:"items"`
	NextCursor string `json:"nextCursor,omitempty"`
}

// QuotaList is quotas.get's answer: the tenant's quota on each live pool
// offered to it. A resource missing from a quota grants zero.
type QuotaList struct {
	Items      []PoolOffer `json:"items"`
	NextCursor string      `json:"nextCursor,omitempty"`
}

// Names are DNS labels: they name agents' task queues and CLI arguments.
// gpuModel is one model family of the GPU catalog (H100, L40S, MI300X):
// its form here, its membership by the handler.

// CreateInput is pools.create's input. Sharing defaults to exclusive, agent
// to bcd (none for provider pools).
type CreateInput struct {
	TenantID          string  `json:"tenantId" jsonschema:"required" id:"tenant"`
	SiteID            string  `json:"siteId" jsonschema:"required" id:"site"`
	Name              string  `json:"name" jsonschema:"required,maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	Class             string  `json:"class" jsonschema:"required,enum=metal-host,enum=metal-dedicated,enum=vps-host,enum=provider"`
	GPUModel          string  `json:"gpuModel" jsonschema:"required,maxLength=16,pattern=^[A-Z][A-Z0-9]{1\\,15}$"`
	GPUMemoryGb       int     `json:"gpuMemoryGb" jsonschema:"required,minimum=1,maximum=4096"`
	Sharing           string  `json:"sharing,omitempty" jsonschema:"enum=exclusive,enum=mig,enum=timeslice,enum=mps"`
	Agent             string  `json:"agent,omitempty" jsonschema:"enum=bcd,enum=none"`
	Policy            *Policy `json:"policy,omitempty" maxBytes:"16384"`
	ProviderAccountID string  `json:"providerAccountId,omitempty" id:"pacct"`
	BillingMode       string  `json:"billingMode,omitempty" jsonschema:"enum=metered,enum=platform-fee,enum=none" jsonschema_description:"What the pool's tenants are billed: metered (the default), platform-fee, or none (and no budget check)."`
}

// PoolInput names one pool.
type PoolInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
}

// ListInput is pools.list's input; siteId and class filter when set.
type ListInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	SiteID   string `json:"siteId,omitempty" id:"site"`
	Class    string `json:"class,omitempty" jsonschema:"enum=metal-host,enum=metal-dedicated,enum=vps-host,enum=provider"`
	rpc.ListInput
}

// UpdateInput is pools.update's input; nil fields are kept, and a policy
// replaces the whole policy. A pool's site, class and gpuModel never change.
type UpdateInput struct {
	TenantID          string  `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID            string  `json:"poolId" jsonschema:"required" id:"pool"`
	Name              *string `json:"name,omitempty" jsonschema:"maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	GPUMemoryGb       *int    `json:"gpuMemoryGb,omitempty" jsonschema:"minimum=1,maximum=4096"`
	Sharing           *string `json:"sharing,omitempty" jsonschema:"enum=exclusive,enum=mig,enum=timeslice,enum=mps"`
	Agent             *string `json:"agent,omitempty" jsonschema:"enum=bcd,enum=none"`
	Policy            *Policy `json:"policy,omitempty" maxBytes:"16384"`
	ProviderAccountID *string `json:"providerAccountId,omitempty" id:"pacct"`
	BillingMode       *string `json:"billingMode,omitempty" jsonschema:"enum=metered,enum=platform-fee,enum=none"`
}

// OfferInput is pools.offer's input: TenantID owns the pool, ToTenantID
// receives it. Offering again replaces the offer's terms.
type OfferInput struct {
	TenantID           string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID             string `json:"poolId" jsonschema:"required" id:"pool"`
	ToTenantID         string `json:"toTenantId" jsonschema:"required" id:"tenant"`
	Quota              Quota  `json:"quota,omitempty" maxBytes:"4096"`
	Priority           *int   `json:"priority,omitempty" jsonschema:"nullable,minimum=-1000000,maximum=1000000"`
	IncludeDescendants bool   `json:"includeDescendants,omitempty"`
	// Suspended offers admit nothing new; ExcludedRegions are regions
	// nothing new is made in (pools.CheckOffer).
	Suspended       bool     `json:"suspended,omitempty"`
	ExcludedRegions []string `json:"excludedRegions,omitempty" jsonschema:"maxItems=64,uniqueItems=true" jsonschema_description:"Region slugs (lower-case letters, digits and dashes, at most 32)."`
}

// UnofferInput is pools.unoffer's input.
type UnofferInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID     string `json:"poolId" jsonschema:"required" id:"pool"`
	ToTenantID string `json:"toTenantId" jsonschema:"required" id:"tenant"`
}

// QuotasGetInput is quotas.get's input; poolId "" answers every pool
// offered to the tenant.
type QuotasGetInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId,omitempty" id:"pool"`
	rpc.ListInput
}

// QuotasSetInput is quotas.set's input: tenantId's quota on a pool offered
// to it, replaced whole.
type QuotasSetInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
	Quota    Quota  `json:"quota" jsonschema:"required" maxBytes:"4096"`
}

// The methods.
const (
	Create    rpc.Ref[CreateInput, Pool]         = "pools.create"
	Get       rpc.Ref[PoolInput, Pool]           = "pools.get"
	List      rpc.Ref[ListInput, PoolList]       = "pools.list"
	Update    rpc.Ref[UpdateInput, Pool]         = "pools.update"
	Archive   rpc.Ref[PoolInput, Pool]           = "pools.archive"
	Offer     rpc.Ref[OfferInput, PoolOffer]     = "pools.offer"
	Unoffer   rpc.Ref[UnofferInput, PoolOffer]   = "pools.unoffer"
	QuotasGet rpc.Ref[QuotasGetInput, QuotaList] = "quotas.get"
	QuotasSet rpc.Ref[QuotasSetInput, PoolOffer] = "quotas.set"
)

// decideOnSite is pools.create's choice, as sites.create's: a pool on a
// shared or dedicated site adds to the platform's hardware and is decided on
// compute-fleet; a pool on a tenant's custom site on compute-tenant. A site
// the tenant does not have is decided on compute-tenant too, and the handler
// then answers NOT_FOUND: the read is in the call's tenant only, so the
// choice tells nothing of other tenants' sites.
func decideOnSite(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateInput) (string, error) {
	st, err := sites.Load(ctx, tx, c.TenantID, in.SiteID, false)
	switch {
	case errors.Is(err, core.ErrNotFound):
		return "tenant", nil
	case err != nil:
		return "", err
	case st.Kind == sites.KindShared || st.Kind == sites.KindDedicated:
		return "fleet", nil
	}
	return "tenant", nil
}

// Methods describes the pools.* and quotas.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	typ := func() string { return d.Catalog.FullName(domain.ResourceType) }
	return []rpc.Descriptor{
		&rpc.Method[CreateInput, Pool]{Name: Create, Action: "compute:pools:create", DecidedOn: "compute-fleet or compute-tenant",
			Phase: "v0.1", Kind: core.KindMutation, DecideOn: decideOnSite,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateInput) (Pool, error) {
				n, err := newPool(in)
				if err != nil {
					return Pool{}, err
				}
				return domain.Create(ctx, tx, typ(), c.TenantID, c.Caller.IdentityID, n)
			}},
		&rpc.Method[PoolInput, Pool]{Name: Get, Action: "compute:pools:read", DecidedOn: "compute-pool",
			Phase: "v0.1", Kind: core.KindRead,
			Read: func(c *rpc.Call, b *store.Batch, in PoolInput) func() (Pool, error) {
				return domain.QueueView(b, c.TenantID, in.PoolID)
			}},
		// Oldest first: creation millisecond, then id.
		&rpc.Method[ListInput, PoolList]{Name: List, Action: "compute:pools:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.1", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				rows, err := domain.List(ctx, tx, typ(), c.TenantID, in.SiteID, in.Class, q)
				return rpc.PageOf(rows, q, func(p Pool) store.Key { return store.Key{At: p.CreatedAt, ID: p.ID} },
					func(p Pool) iam.Resource { return d.Resource(domain.ResourceType, p.ID) },
					func(kept []Pool, next string) any { return PoolList{Items: kept, NextCursor: next} }), err
			}},
		&rpc.Method[UpdateInput, Pool]{Name: Update, Action: "compute:pools:manage", DecidedOn: "compute-pool",
			Phase: "v0.2", Kind: core.KindMutation, Refresh: true,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in UpdateInput) (Pool, error) {
				return domain.Update(ctx, tx, typ(), c.TenantID, in.PoolID, domain.Change{Name: in.Name, GPUMemoryGb: in.GPUMemoryGb,
					Sharing: in.Sharing, Agent: in.Agent, Policy: in.Policy, ProviderAccountID: in.ProviderAccountID,
					BillingMode: in.BillingMode})
			}},
		&rpc.Method[PoolInput, Pool]{Name: Archive, Action: "compute:pools:manage", DecidedOn: "compute-pool",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in PoolInput) (Pool, error) {
				return domain.Archive(ctx, tx, c.TenantID, in.PoolID)
			}},
		&rpc.Method[OfferInput, PoolOffer]{Name: Offer, Action: "compute:pools:share", DecidedOn: "compute-pool",
			Phase: "v0.1", Kind: core.KindMutation, Refresh: true,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in OfferInput) (PoolOffer, error) {
				return domain.PutOffer(ctx, tx, typ(), c.TenantID, in.PoolID, in.ToTenantID, c.Caller.IdentityID,
					domain.OfferTerms{Quota: in.Quota, Priority: in.Priority, IncludeDescendants: in.IncludeDescendants,
						Suspended: in.Suspended, ExcludedRegions: in.ExcludedRegions})
			}},
		&rpc.Method[UnofferInput, PoolOffer]{Name: Unoffer, Action: "compute:pools:share", DecidedOn: "compute-pool",
			Phase: "v0.1", Kind: core.KindMutation, Refresh: true,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in UnofferInput) (PoolOffer, error) {
				return domain.Unoffer(ctx, tx, typ(), c.TenantID, in.PoolID, in.ToTenantID)
			}},
		&rpc.Method[QuotasGetInput, QuotaList]{Name: QuotasGet, Action: "compute:quotas:read", DecidedOn: "compute-tenant",
			Phase: "v0.1", Kind: core.KindRead,
			// By pool id.
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in QuotasGetInput) (QuotaList, error) {
				q, err := in.Page()
				if err != nil {
					return QuotaList{}, err
				}
				read, err := domain.Quotas(ctx, tx, c.TenantID, in.PoolID, q)
				items, next := rpc.Paged(read, q, func(o PoolOffer) store.Key { return store.Key{ID: o.PoolID} })
				return QuotaList{Items: items, NextCursor: next}, err
			}},
		// Decided on compute-fleet (root tenant only), so it reaches any pool.
		&rpc.Method[QuotasSetInput, PoolOffer]{Name: QuotasSet, Action: "compute:quotas:manage", DecidedOn: "compute-fleet",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in QuotasSetInput) (PoolOffer, error) {
				return domain.SetQuota(ctx, tx, c.TenantID, in.PoolID, in.Quota)
			}},
	}
}

// newPool fills pools.create's defaults and checks what the schema cannot
// say: the class's fields, the GPU catalog, the policy for the sharing.
func newPool(in CreateInput) (domain.New, error) {
	if in.Sharing == "" {
		in.Sharing = "exclusive"
	}
	if in.Agent == "" {
		in.Agent = "bcd"
		if in.Class == "provider" {
			in.Agent = "none"
		}
	}
	if err := policy.CheckClass(in.Class, in.ProviderAccountID); err != nil {
		return domain.New{}, err
	}
	if err := policy.CheckGPUModel(in.GPUModel); err != nil {
		return domain.New{}, err
	}
	p, err := policy.Validate(in.Policy, in.Sharing)
	if err != nil {
		return domain.New{}, err
	}
	return domain.New{SiteID: in.SiteID, Name: in.Name, Class: in.Class, GPUModel: in.GPUModel, GPUMemoryGb: in.GPUMemoryGb,
		Sharing: in.Sharing, Agent: in.Agent, Policy: p, ProviderAccountID: in.ProviderAccountID, BillingMode: in.BillingMode}, nil
}

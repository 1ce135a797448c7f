// Package sites describes the sites.* methods and the siteTokens.*
// methods: a site token is a site's, so its group is the sites domain's.
package sites

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	pooldomain "github.com/better-compute/better-compute/store/pools"
	domain "github.com/better-compute/better-compute/store/sites"
)

// Site is a site as the methods answer it.
type Site = domain.Site

// Token is a site token as the methods answer it.
type Token = domain.Token

// SiteList is sites.list's answer.
type SiteList struct {
	Items      []Site `json:"items"`
	NextCursor string `json:"nextCursor,omitempty"`
}

// Names are DNS labels: they name agents' task queues and CLI arguments.
// iamRegion follows Better IAM's region-name grammar; the spec does not
// write the grammar down, so this is a conservative one (a 2-4 letter area
// and one to three lower-case parts: eu-central-1).

// CreateInput is sites.create's input. Shared and dedicated sites are the
// platform's own, created in the root tenant; custom is a tenant's own.
type CreateInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	Kind      string `json:"kind" jsonschema:"required,enum=shared,enum=dedicated,enum=custom"`
	Name      string `json:"name" jsonschema:"required,maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	Region    string `json:"region" jsonschema:"required,maxLength=64,pattern=^[a-z0-9]+(-[a-z0-9]+)*$"`
	IAMRegion string `json:"iamRegion" jsonschema:"required,maxLength=64,pattern=^[a-z]{2\\,4}(-[a-z0-9]+){1\\,3}$"`
}

// SiteInput names one site.
type SiteInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	SiteID   string `json:"siteId" jsonschema:"required" id:"site"`
}

// UpdateInput is sites.update's input; nil fields are kept. A site's kind
// never changes.
type UpdateInput struct {
	TenantID  string  `json:"tenantId" jsonschema:"required" id:"tenant"`
	SiteID    string  `json:"siteId" jsonschema:"required" id:"site"`
	Name      *string `json:"name,omitempty" jsonschema:"maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	Region    *string `json:"region,omitempty" jsonschema:"maxLength=64,pattern=^[a-z0-9]+(-[a-z0-9]+)*$"`
	IAMRegion *string `json:"iamRegion,omitempty" jsonschema:"maxLength=64,pattern=^[a-z]{2\\,4}(-[a-z0-9]+){1\\,3}$"`
}

// CreateTokenInput is siteTokens.create's input.
type CreateTokenInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	SiteID   string `json:"siteId" jsonschema:"required" id:"site"`
	Name     string `json:"name,omitempty" jsonschema:"maxLength=128"`
}

// RevokeTokenInput is siteTokens.revoke's input.
type RevokeTokenInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	SiteID   string `json:"siteId" jsonschema:"required" id:"site"`
	TokenID  string `json:"tokenId" jsonschema:"required" id:"stok"`
}

// The methods.
const (
	Create      rpc.Ref[CreateInput, Site]             = "sites.create"
	Get         rpc.Ref[SiteInput, Site]               = "sites.get"
	List        rpc.Ref[rpc.TenantListInput, SiteList] = "sites.list"
	Update      rpc.Ref[UpdateInput, Site]             = "sites.update"
	Delete      rpc.Ref[SiteInput, Site]               = "sites.delete"
	CreateToken rpc.Ref[CreateTokenInput, Token]       = "siteTokens.create"
	RevokeToken rpc.Ref[RevokeTokenInput, Token]       = "siteTokens.revoke"
)

// Methods describes the sites.* and siteTokens.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	typ := func() string { return d.Catalog.FullName(domain.ResourceType) }
	return []rpc.Descriptor{
		&rpc.Method[CreateInput, Site]{Name: Create, Action: "compute:sites:manage", DecidedOn: "compute-fleet or compute-tenant",
			Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateInput) (Site, error) {
				return domain.Create(ctx, tx, typ(), d.RootTenant, c.TenantID, c.Caller.IdentityID,
					domain.New{Name: in.Name, Region: in.Region, IAMRegion: in.IAMRegion, Kind: in.Kind})
			}},
		&rpc.Method[SiteInput, Site]{Name: Get, Action: "compute:sites:read", DecidedOn: "compute-site",
			Phase: "v0.1", Kind: core.KindRead,
			Read: func(c *rpc.Call, b *store.Batch, in SiteInput) func() (Site, error) {
				return domain.QueueLoad(b, c.TenantID, in.SiteID)
			}},
		// Oldest first: creation millisecond, then id.
		&rpc.Method[rpc.TenantListInput, SiteList]{Name: List, Action: "compute:sites:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.1", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in rpc.TenantListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				rows, err := domain.List(ctx, tx, typ(), c.TenantID, q)
				return rpc.PageOf(rows, q, func(s Site) store.Key { return store.Key{At: s.CreatedAt, ID: s.ID} },
					func(s Site) iam.Resource { return d.Resource(domain.ResourceType, s.ID) },
					func(kept []Site, next string) any { return SiteList{Items: kept, NextCursor: next} }), err
			}},
		// A new region is also the region of the site's pools: their
		// projection rows are rewritten in the same transaction.
		&rpc.Method[UpdateInput, Site]{Name: Update, Action: "compute:sites:manage", DecidedOn: "compute-site",
			Phase: "v0.2", Kind: core.KindMutation, Refresh: true,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in UpdateInput) (Site, error) {
				st, err := domain.Update(ctx, tx, typ(), c.TenantID, in.SiteID,
					domain.Change{Name: in.Name, Region: in.Region, IAMRegion: in.IAMRegion})
				if err != nil || in.Region == nil {
					return st, err
				}
				return st, pooldomain.PutSiteAuthz(ctx, tx, d.Catalog.FullName(pooldomain.ResourceType), st.ID)
			}},
		&rpc.Method[SiteInput, Site]{Name: Delete, Action: "compute:sites:manage", DecidedOn: "compute-site",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in SiteInput) (Site, error) {
				return domain.Delete(ctx, tx, c.TenantID, in.SiteID)
			}},
		&rpc.Method[CreateTokenInput, Token]{Name: CreateToken, Action: "compute:sites:manage", DecidedOn: "compute-site",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateTokenInput) (Token, error) {
				return domain.CreateToken(ctx, tx, c.TenantID, in.SiteID, in.Name, c.Caller.IdentityID)
			}},
		&rpc.Method[RevokeTokenInput, Token]{Name: RevokeToken, Action: "compute:sites:manage", DecidedOn: "compute-site",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in RevokeTokenInput) (Token, error) {
				return domain.RevokeToken(ctx, tx, c.TenantID, in.SiteID, in.TokenID)
			}},
	}
}

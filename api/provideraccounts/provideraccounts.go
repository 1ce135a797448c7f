// Package provideraccounts describes the providerAccounts.* methods: a
// tenant's accounts with capacity providers (the credential a secret://
// reference, never the token), and offers, the provider's sizes and
// images mapped to flavors.
package provideraccounts

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/provideraccounts"
)

// Account is an account as the methods answer it.
type Account = domain.Account

// AccountList is providerAccounts.list's answer.
type AccountList struct {
	Items      []Account `json:"items"`
	NextCursor string    `json:"nextCursor,omitempty"`
}

// Names are DNS labels, as pools' and profiles'. Regions are provider
// region slugs; none allows every region the provider has.

// CreateInput is providerAccounts.create's input. An account of the root
// tenant (the fleet's, backing its provider pools) is decided on
// compute-fleet, any other on compute-tenant.
type CreateInput struct {
	TenantID      string   `json:"tenantId" jsonschema:"required" id:"tenant"`
	Provider      string   `json:"provider" jsonschema:"required,enum=digitalocean"`
	Name          string   `json:"name" jsonschema:"required,maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	CredentialRef string   `json:"credentialRef" jsonschema:"required,maxLength=256,pattern=^secret://" jsonschema_description:"The secret:// reference of the API token, a secret of this tenant (secrets.put); never the token itself."`
	Regions       []string `json:"regions,omitempty" jsonschema:"maxItems=64,minLength=1,maxLength=32,pattern=^[a-z0-9][a-z0-9-]{0\\,31}$" jsonschema_description:"The provider regions the account may use; none: all of them."`
	Previews      bool     `json:"previews,omitempty" jsonschema_description:"Whether the account has the provider's preview features on."`
	BaseURL       string   `json:"baseUrl,omitempty" jsonschema:"maxLength=2048,pattern=^https?://" jsonschema_description:"Overrides the provider's API address (a test or dev-stack fake). The root tenant's accounts only: it sends the credential to that address."`
}

// AccountInput names one account.
type AccountInput struct {
	TenantID          string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ProviderAccountID string `json:"providerAccountId" jsonschema:"required" id:"pacct"`
}

// UpdateInput is providerAccounts.update's input; fields left out are kept.
type UpdateInput struct {
	TenantID          string    `json:"tenantId" jsonschema:"required" id:"tenant"`
	ProviderAccountID string    `json:"providerAccountId" jsonschema:"required" id:"pacct"`
	Name              *string   `json:"name,omitempty" jsonschema:"maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	CredentialRef     *string   `json:"credentialRef,omitempty" jsonschema:"maxLength=256,pattern=^secret://"`
	Regions           *[]string `json:"regions,omitempty" jsonschema:"maxItems=64,minLength=1,maxLength=32,pattern=^[a-z0-9][a-z0-9-]{0\\,31}$" jsonschema_description:"Replaces the regions; an empty list allows all of them."`
	Previews          *bool     `json:"previews,omitempty"`
	BaseURL           *string   `json:"baseUrl,omitempty" jsonschema:"maxLength=2048" jsonschema_description:"Replaces the API address override; empty removes it. The root tenant's accounts only."`
}

// The methods.
const (
	Create rpc.Ref[CreateInput, Account]             = "providerAccounts.create"
	List   rpc.Ref[rpc.TenantListInput, AccountList] = "providerAccounts.list"
	Get    rpc.Ref[AccountInput, Account]            = "providerAccounts.get"
	Offers rpc.Ref[AccountInput, OffersAnswer]       = "providerAccounts.offers"
	Update rpc.Ref[UpdateInput, Account]             = "providerAccounts.update"
	Delete rpc.Ref[AccountInput, Account]            = "providerAccounts.delete"
)

// accounts is the domain's writes over the deployment's vault (made per
// call: the registry builds descriptors from empty Deps).
func accounts(d rpc.Deps) *domain.Accounts {
	typ := domain.AuthzType
	if d.Catalog != nil {
		typ = d.Catalog.FullName(domain.ResourceType)
	}
	return domain.NewAccounts(d.Secrets, d.RootTenant, typ)
}

// Methods describes the providerAccounts.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	typ := func() string { return d.Catalog.FullName(domain.ResourceType) }
	return []rpc.Descriptor{
		// The root tenant's accounts are the fleet's: decided on
		// compute-fleet in the root tenant; a tenant's own on its tenant.
		&rpc.Method[CreateInput, Account]{Name: Create, Action: "compute:providers:manage", DecidedOn: "compute-fleet or compute-tenant",
			Phase: "v0.3", Kind: core.KindMutation,
			DecideOn: func(_ context.Context, c *rpc.Call, _ store.Tx, _ CreateInput) (string, error) {
				if c.TenantID == d.RootTenant {
					return "fleet", nil
				}
				return "tenant", nil
			},
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateInput) (Account, error) {
				return accounts(d).Create(ctx, tx, domain.New{TenantID: c.TenantID, Provider: in.Provider, Name: in.Name,
					CredentialRef: in.CredentialRef, BaseURL: in.BaseURL, Regions: in.Regions, Previews: in.Previews,
					CreatedBy: c.Caller.IdentityID})
			}},
		// Oldest first: creation millisecond, then id.
		&rpc.Method[rpc.TenantListInput, AccountList]{Name: List, Action: "compute:providers:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.3", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in rpc.TenantListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				rows, err := domain.List(ctx, tx, typ(), c.TenantID, q)
				return rpc.PageOf(rows, q, func(a Account) store.Key { return store.Key{At: a.CreatedAt, ID: a.ID} },
					func(a Account) iam.Resource { return d.Resource(domain.ResourceType, a.ID) },
					func(kept []Account, next string) any { return AccountList{Items: kept, NextCursor: next} }), err
			}},
		&rpc.Method[AccountInput, Account]{Name: Get, Action: "compute:providers:read", DecidedOn: "compute-provider-account",
			Phase: "v0.3", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in AccountInput) (Account, error) {
				return domain.Load(ctx, tx, c.TenantID, in.ProviderAccountID, false)
			}},
		// offers calls the provider, which never happens inside a
		// transaction: Direct resolves the token in a read-write
		// transaction of its own (the resolution is recorded), commits,
		// then asks the provider (offers.go).
		&rpc.Method[AccountInput, OffersAnswer]{Name: Offers, Action: "compute:providers:read", DecidedOn: "compute-provider-account",
			Phase: "v0.3", Kind: core.KindRead,
			Direct: func(ctx context.Context, c *rpc.Call, in AccountInput) (OffersAnswer, error) {
				return offers(ctx, d, c, in)
			}},
		&rpc.Method[UpdateInput, Account]{Name: Update, Action: "compute:providers:manage", DecidedOn: "compute-provider-account",
			Phase: "v0.3", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in UpdateInput) (Account, error) {
				ch := domain.Change{Name: in.Name, CredentialRef: in.CredentialRef, BaseURL: in.BaseURL, Previews: in.Previews}
				if in.Regions != nil {
					ch.Regions = append([]string{}, *in.Regions...)
				}
				return accounts(d).Update(ctx, tx, c.TenantID, in.ProviderAccountID, ch)
			}},
		&rpc.Method[AccountInput, Account]{Name: Delete, Action: "compute:providers:manage", DecidedOn: "compute-provider-account",
			Phase: "v0.3", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in AccountInput) (Account, error) {
				return accounts(d).Delete(ctx, tx, c.TenantID, in.ProviderAccountID)
			}},
	}
}

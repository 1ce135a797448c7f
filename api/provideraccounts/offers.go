package provideraccounts

import (
	"context"
	"errors"
	"slices"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/flavors"
	domain "github.com/better-compute/better-compute/store/provideraccounts"
	"github.com/better-compute/better-compute/store/secrets"
)

// OffersAnswer is providerAccounts.offers' answer: what the provider
// offers in the account's regions, each size with the flavor shape it
// maps to and the flavors of the account's pools that use it.
type OffersAnswer struct {
	ProviderAccountID string             `json:"providerAccountId"`
	Provider          string             `json:"provider"`
	Regions           []providers.Region `json:"regions"`
	Sizes             []SizeOffer        `json:"sizes"`
	Images            []providers.Image  `json:"images"`
	// UnmatchedFlavors are flavors of the account's pools whose
	// providerSize the provider does not offer in the account's regions
	// (a typo, a retired size): instances of them cannot be created.
	UnmatchedFlavors []FlavorUse `json:"unmatchedFlavors"`
}

// SizeOffer is one provider size, its regions narrowed to the account's.
type SizeOffer struct {
	providers.Size
	// Shape is the flavor a provider pool declares for the size.
	Shape Shape `json:"shape"`
	// Flavors are the account's pools' flavors of this size.
	Flavors []FlavorUse `json:"flavors"`
}

// Shape is a flavor's shape, in flavors.create's units.
type Shape struct {
	VCPU      int     `json:"vcpu"`
	MemoryGiB float64 `json:"memoryGiB"`
	DiskGiB   int     `json:"diskGiB"`
	GPUs      int     `json:"gpus"`
}

// FlavorUse is a flavor of one of the account's pools; Matches says
// whether its declared shape is the size's.
type FlavorUse struct {
	FlavorID string `json:"flavorId"`
	PoolID   string `json:"poolId"`
	Name     string `json:"name"`
	Size     string `json:"providerSize"`
	Matches  bool   `json:"matches"`
}

// OffersPurpose is the resolution's recorded purpose.
const OffersPurpose = "provider-offers"

// offers resolves the account's token in a read-write transaction of its
// own (Token records the resolution), and only once it has committed asks
// the provider: no transaction is held across a provider call. Provider
// failures are UNAVAILABLE; the token is never part of an answer or a log.
func offers(ctx context.Context, d rpc.Deps, c *rpc.Call, in AccountInput) (OffersAnswer, error) {
	switch {
	case d.Store == nil:
		return OffersAnswer{}, core.Errorf(core.CodeUnavailable, "no database configured")
	case d.Providers == nil:
		return OffersAnswer{}, core.Errorf(core.CodeUnavailable, "no provider drivers are configured")
	case !d.Secrets.Configured():
		return OffersAnswer{}, core.Errorf(core.CodeUnavailable, "no secret store is configured")
	}
	var a domain.Account
	var token string
	var used []flavors.Flavor
	err := d.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		if a, err = domain.Load(ctx, tx, c.TenantID, in.ProviderAccountID, false); err != nil {
			return err
		}
		if used, err = flavors.OfAccount(ctx, tx, a.TenantID, a.ID); err != nil {
			return err
		}
		token, err = domain.Token(ctx, tx, d.Secrets, a, secrets.Use{Purpose: OffersPurpose,
			IdentityKind: c.Caller.IdentityKind, IdentityID: c.Caller.IdentityID, RequestID: c.Cred.RequestID})
		return err
	})
	if err != nil {
		return OffersAnswer{}, err
	}
	p, err := d.Providers.Open(ctx, providers.Credential{Kind: a.Provider, Token: token, BaseURL: a.BaseURL})
	token = ""
	if err != nil {
		return OffersAnswer{}, ProviderError(err)
	}
	regions, err := p.Regions(ctx)
	if err != nil {
		return OffersAnswer{}, ProviderError(err)
	}
	sizes, err := p.Sizes(ctx)
	if err != nil {
		return OffersAnswer{}, ProviderError(err)
	}
	images, err := p.Images(ctx)
	if err != nil {
		return OffersAnswer{}, ProviderError(err)
	}
	return MapOffers(a, regions, sizes, images, used), nil
}

// ProviderError is a provider's failure as the caller sees it:
// UNAVAILABLE, with details.retryAt (epoch ms) when it is a rate limit.
// The cause is kept for the log only.
func ProviderError(err error) error {
	if ce := (*core.Error)(nil); errors.As(err, &ce) && ce.Code != "" && ce.Code != core.CodeInternal {
		return err
	}
	var limited *providers.RateLimited
	switch {
	case errors.As(err, &limited):
		return core.Wrap(core.CodeUnavailable, err, "the provider is rate limiting this account's credential").
			WithDetails(map[string]any{"reason": "rateLimited", "retryAt": limited.RetryAt.UnixMilli()})
	case errors.Is(err, providers.ErrRefused):
		return core.Wrap(core.CodeUnavailable, err, "the provider refused the account's request (is its credential valid?)").
			WithDetails(map[string]any{"reason": "providerRefused"})
	default:
		return core.Wrap(core.CodeUnavailable, err, "the provider is unavailable").
			WithDetails(map[string]any{"reason": "providerUnavailable"})
	}
}

// MapOffers narrows what the provider answered to the account's regions
// (all of them when it lists none) and maps each size onto the flavors of
// the account's pools: a size offered in none of the account's regions is
// left out, and a flavor whose size is left out is unmatched.
func MapOffers(a domain.Account, regions []providers.Region, sizes []providers.Size, images []providers.Image,
	used []flavors.Flavor) OffersAnswer {
	allowed := func(slug string) bool { return len(a.Regions) == 0 || slices.Contains(a.Regions, slug) }
	narrow := func(in []string) []string {
		out := []string{}
		for _, r := range in {
			if allowed(r) {
				out = append(out, r)
			}
		}
		return out
	}
	out := OffersAnswer{ProviderAccountID: a.ID, Provider: a.Provider, Regions: []providers.Region{}, Sizes: []SizeOffer{},
		Images: []providers.Image{}, UnmatchedFlavors: []FlavorUse{}}
	for _, r := range regions {
		if allowed(r.Slug) {
			out.Regions = append(out.Regions, r)
		}
	}
	offered := map[string]int{}
	for _, s := range sizes {
		if s.Regions = narrow(s.Regions); len(s.Regions) == 0 {
			continue
		}
		shape := Shape{VCPU: s.VCPU, MemoryGiB: float64(s.MemoryMiB) / 1024, DiskGiB: s.DiskGiB, GPUs: s.GPUs}
		offered[s.Slug] = len(out.Sizes)
		out.Sizes = append(out.Sizes, SizeOffer{Size: s, Shape: shape, Flavors: []FlavorUse{}})
	}
	for _, im := range images {
		// An image that names no region is offered wherever its sizes are.
		if len(im.Regions) > 0 {
			if im.Regions = narrow(im.Regions); len(im.Regions) == 0 {
				continue
			}
		}
		out.Images = append(out.Images, im)
	}
	for _, f := range used {
		use := FlavorUse{FlavorID: f.ID, PoolID: f.PoolID, Name: f.Name, Size: f.ProviderSize}
		i, ok := offered[f.ProviderSize]
		if !ok {
			out.UnmatchedFlavors = append(out.UnmatchedFlavors, use)
			continue
		}
		s := out.Sizes[i]
		use.Matches = f.VCPU == s.VCPU && f.MemoryMiB == s.MemoryMiB && f.DiskGiB == s.DiskGiB && f.GPUs == s.GPUs
		out.Sizes[i].Flavors = append(out.Sizes[i].Flavors, use)
	}
	return out
}

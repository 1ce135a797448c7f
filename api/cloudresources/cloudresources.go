// Package cloudresources describes the cloudResources.* methods
// (cloud-resources-api.md). Served so far: kinds, which answers the kind
// manifests of the pool's provider (drivers/cloudresources); the other
// methods answer UNSUPPORTED (planned) until their slices land.
package cloudresources

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	rules "github.com/better-compute/better-compute/core/cloudresources"
	drivers "github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/drivers/cloudresources/digitalocean"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/store/provideraccounts"
)

// KindsInput is cloudResources.kinds' input.
type KindsInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
}

// Kind is one kind the pool's provider serves: its manifest, whether it
// is available on the pool's account (a preview needs previews on the
// account) and the tenant's quota of it.
type Kind struct {
	*drivers.Manifest
	Available bool `json:"available"`
	Quota     int  `json:"quota"`
}

// KindsAnswer is cloudResources.kinds' answer.
type KindsAnswer struct {
	PoolID   string `json:"poolId"`
	Provider string `json:"provider"`
	Kinds    []Kind `json:"kinds"`
}

// Kinds is cloudResources.kinds.
const Kinds rpc.Ref[KindsInput, KindsAnswer] = "cloudResources.kinds"

// kindsOf are the kinds a provider serves (nil: none).
func kindsOf(provider string) *drivers.KindSet {
	switch provider {
	case "digitalocean":
		return digitalocean.Kinds()
	}
	return nil
}

// Methods describes the served cloudResources.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[KindsInput, KindsAnswer]{Name: Kinds, Action: "compute:cloud-resources:read", DecidedOn: "compute-tenant",
			Phase: "v1.0", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in KindsInput) (KindsAnswer, error) {
				return kinds(ctx, tx, c.TenantID, in.PoolID, rules.Quotas{})
			}},
	}
}

// kinds answers the kinds of the pool's provider: a pool the tenant
// cannot see is NOT_FOUND; one that is not a provider pool, or whose
// provider serves no cloud resources, is UNSUPPORTED.
func kinds(ctx context.Context, tx store.Tx, tenantID, poolID string, quotas rules.Quotas) (KindsAnswer, error) {
	p, err := pools.View(ctx, tx, tenantID, poolID)
	if err != nil {
		return KindsAnswer{}, err
	}
	if p.Class != "provider" || p.ProviderAccountID == "" {
		return KindsAnswer{}, core.Errorf(core.CodeUnsupported, "pool %s is a %s pool; cloud resources live in provider pools", p.ID, p.Class).
			WithDetails(map[string]any{"reason": "notProviderPool"})
	}
	acct, err := provideraccounts.Get(ctx, tx, p.ProviderAccountID)
	if err != nil {
		return KindsAnswer{}, err
	}
	set := kindsOf(acct.Provider)
	if set == nil {
		return KindsAnswer{}, core.Errorf(core.CodeUnsupported, "provider %s serves no cloud resources", acct.Provider).
			WithDetails(map[string]any{"reason": "noCloudResources", "provider": acct.Provider})
	}
	out := KindsAnswer{PoolID: p.ID, Provider: acct.Provider, Kinds: []Kind{}}
	for _, m := range set.All() {
		out.Kinds = append(out.Kinds, Kind{Manifest: m, Available: !m.Preview || acct.Previews, Quota: quotas.Of(m.Kind)})
	}
	return out, nil
}

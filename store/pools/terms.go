package pools

import (
	"regexp"
	"slices"

	"github.com/better-compute/better-compute/core"
)

// Billing modes of a pool: what its tenants are billed for what runs on it.
const (
	// BillingMetered bills usage at the pool's prices (the default).
	BillingMetered = "metered"
	// BillingPlatformFee bills a platform fee on the provider's price.
	BillingPlatformFee = "platform-fee"
	// BillingNone bills nothing: no budget is checked.
	BillingNone = "none"
)

// BillingModes are every billing mode, as the column's CHECK lists them.
var BillingModes = []string{BillingMetered, BillingPlatformFee, BillingNone}

// regionSlug is what an offer's excluded region looks like.
var regionSlug = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// CheckOffer refuses something new on a pool offered to the tenant when
// the offer is suspended (INVALID_STATE reason offerSuspended) or excludes
// region (INVALID_INPUT field region reason regionExcluded). The pool's
// own tenant and region "" are not checked against regions. It runs after
// the decision, so a caller who may not act learns nothing of the offer.
func CheckOffer(p Pool, region string) error {
	if p.Offer == nil {
		return nil
	}
	if p.Offer.Suspended {
		return core.Errorf(core.CodeInvalidState, "the offer of pool %s is suspended: nothing new is made on it", p.ID).
			WithDetails(map[string]any{"reason": "offerSuspended", "poolId": p.ID})
	}
	if region != "" && slices.Contains(p.Offer.ExcludedRegions, region) {
		return core.Errorf(core.CodeInvalidInput, "the offer of pool %s excludes region %s", p.ID, region).
			WithDetails(map[string]any{"field": "region", "reason": "regionExcluded", "region": region, "poolId": p.ID})
	}
	return nil
}

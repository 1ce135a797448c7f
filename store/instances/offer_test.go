package instances_test

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/core"
	policy "github.com/better-compute/better-compute/core/pools"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
)

// A suspended offer, or one excluding the pool's region, admits no new
// instance and books nothing; the refusal is not final, so the same
// create goes through once the offer is restored. What runs stays.
func TestOfferTermsRefuseNewInstances(t *testing.T) {
	f := newFixture(t, `{}`, 1)
	flavor := f.flavor(1, 1024, 0)
	quota := policy.Quota{"vcpu": 8, "memoryGiB": 8}
	image := f.offerTo("ten_guest", quota)
	running, err := f.createAs("ten_guest", image, flavor)
	if err != nil {
		t.Fatal(err)
	}
	var region string
	if err := f.st.Pool.QueryRow(context.Background(), `SELECT s.region FROM pools p JOIN sites s ON s.id = p.site_id WHERE p.id = $1`,
		f.poolID).Scan(&region); err != nil {
		t.Fatal(err)
	}
	offer := func(terms pools.OfferTerms) pools.Offer {
		t.Helper()
		terms.Quota = quota
		var o pools.Offer
		f.tx(func(tx store.Tx) (err error) {
			o, err = pools.PutOffer(context.Background(), tx, f.types.Pool, tenant, f.poolID, "ten_guest", "idn_x", terms)
			return err
		})
		return o
	}
	for _, tc := range []struct {
		name   string
		terms  pools.OfferTerms
		code   core.Code
		reason string
	}{
		{"suspended", pools.OfferTerms{Suspended: true}, core.CodeInvalidState, "offerSuspended"},
		{"region excluded", pools.OfferTerms{ExcludedRegions: []string{"nowhere-1", region}}, core.CodeInvalidInput, "regionExcluded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := offer(tc.terms)
			if o.Suspended != tc.terms.Suspended || (o.SuspendedAt != nil) != tc.terms.Suspended || len(o.ExcludedRegions) != len(tc.terms.ExcludedRegions) {
				t.Fatalf("offer = %+v", o)
			}
			before := f.count(`SELECT count(*) FROM allocations WHERE tenant_id = 'ten_guest'`)
			_, err := f.createAs("ten_guest", image, flavor)
			if ce := core.AsError(err); ce.Code != tc.code || ce.Details["reason"] != tc.reason {
				t.Fatalf("create = %v %+v; want %s %s", err, ce.Details, tc.code, tc.reason)
			}
			if after := f.count(`SELECT count(*) FROM allocations WHERE tenant_id = 'ten_guest'`); after != before {
				t.Fatalf("allocations %d → %d", before, after)
			}
			if n := f.count(`SELECT count(*) FROM instances WHERE id = $1 AND state = 'creating'`, running.ID); n != 1 {
				t.Fatal("the running instance changed")
			}
		})
	}
	offer(pools.OfferTerms{})
	if _, err := f.createAs("ten_guest", image, flavor); err != nil {
		t.Fatalf("after the offer is restored: %v", err)
	}
	f.tx(func(tx store.Tx) error {
		_, err := pools.PutOffer(context.Background(), tx, f.types.Pool, tenant, f.poolID, "ten_guest", "idn_x",
			pools.OfferTerms{ExcludedRegions: []string{"Not A Region"}})
		if core.AsError(err).Details["reason"] != "regionSlug" {
			t.Errorf("a bad region = %v", err)
		}
		return nil
	})
}

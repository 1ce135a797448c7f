package instances_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/core"
	policy "github.com/better-compute/better-compute/core/pools"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/instances"
	"github.com/better-compute/better-compute/store/pools"
)

// offerTo offers the fixture's pool to tenantID with quota and gives the
// tenant an image of its own; it answers the image.
func (f *fixture) offerTo(tenantID string, quota policy.Quota) string {
	f.t.Helper()
	f.tx(func(tx store.Tx) error {
		_, err := pools.PutOffer(context.Background(), tx, f.types.Pool, tenant, f.poolID, tenantID, "idn_x", pools.OfferTerms{Quota: quota})
		return err
	})
	image := core.NewID("img")
	f.exec(`INSERT INTO images (id, tenant_id, name, version, format, sha256, size_bytes, state, verified, signer_fingerprint, created_by)
		VALUES ($1, $2, 'debian', '12', 'raw', $3, 1024, 'available', true, 'SHA256:test', 'idn_x')`, image, tenantID, strings.Repeat("ab", 32))
	return image
}

// createAs drafts and places one instance of tenantID with its image.
func (f *fixture) createAs(tenantID, image, flavorID string) (domain.Instance, error) {
	return f.createWith(tenantID, image, flavorID, "")
}

// booked is what tenantID holds in the fixture's pool: instance
// allocations and GPU bookings.
func (f *fixture) booked(tenantID string) (allocations, bookings int) {
	f.t.Helper()
	return f.count(`SELECT count(*) FROM allocations WHERE tenant_id = $1`, tenantID),
		f.count(`SELECT count(*) FROM device_bookings WHERE tenant_id = $1`, tenantID)
}

// quotaRefusal checks err is QUOTA_EXCEEDED on resource with these details.
func quotaRefusal(t *testing.T, err error, resource string, limit int64, inUse, requested any) {
	t.Helper()
	ce := core.AsError(err)
	if ce.Code != core.CodeQuotaExceeded || ce.Details["resource"] != resource || ce.Details["limit"] != limit ||
		ce.Details["inUse"] != inUse || ce.Details["requested"] != requested {
		t.Fatalf("refusal = %v %+v; want QUOTA_EXCEEDED on %s (limit %d, inUse %v, requested %v)", err, ce.Details, resource, limit, inUse, requested)
	}
}

func TestInstanceQuotaOnOfferedPool(t *testing.T) {
	f := newFixture(t, `{}`, 2) // 16 GPUs: every case's fit
	c2, c4, g2 := f.flavor(2, 2048, 0), f.flavor(4, 4096, 0), f.flavor(1, 1024, 2)
	// Another tenant's instances on the pool (8 vCPU, 8 GiB, 2 GPUs): no
	// case below counts them.
	otherImage := f.offerTo("ten_other", policy.Quota{"vcpu": 100, "memoryGiB": 100, "gpu": 8})
	for _, flv := range []string{c4, c2, g2} {
		if _, err := f.createAs("ten_other", otherImage, flv); err != nil {
			t.Fatal(err)
		}
	}
	scalars := func(vcpu, memoryGiB int64) policy.Quota { return policy.Quota{"vcpu": vcpu, "memoryGiB": memoryGiB} }
	withGPUs := func(gpus int64) policy.Quota { return policy.Quota{"vcpu": 100, "memoryGiB": 100, "gpu": gpus} }
	type refusal struct {
		resource         string
		limit            int64
		inUse, requested any
	}
	cases := []struct {
		name    string
		quota   policy.Quota
		holds   []string // the tenant's instances first
		reserve bool     // a reservation's GPU atom booked in the future
		ask     string
		refused *refusal
	}{
		{"vcpu at exactly the quota", scalars(8, 100), []string{c4}, false, c4, nil},
		{"vcpu over the quota", scalars(8, 100), []string{c4, c2}, false, c4, &refusal{"vcpu", 8, int64(6), int64(4)}},
		{"memory at exactly the quota", scalars(100, 6), []string{c4}, false, c2, nil},
		{"memory over the quota", scalars(100, 6), []string{c4}, false, c4, &refusal{"memoryGiB", 6, 4.0, 4.0}},
		{"vcpu not named grants none", policy.Quota{"memoryGiB": 100}, nil, false, c2, &refusal{"vcpu", 0, int64(0), int64(2)}},
		{"memory not named grants none", policy.Quota{"vcpu": 100}, nil, false, c2, &refusal{"memoryGiB", 0, 0.0, 2.0}},
		{"gpus at exactly the quota", withGPUs(2), nil, false, g2, nil},
		{"gpus over the quota", withGPUs(3), []string{g2}, false, g2, &refusal{"gpu", 3, int64(2), int64(2)}},
		{"a reservation's atoms count", withGPUs(2), nil, true, g2, &refusal{"gpu", 2, int64(1), int64(2)}},
		{"gpus not named grant none", scalars(100, 100), nil, false, g2, &refusal{"gpu", 0, int64(0), int64(2)}},
		{"another tenant's instances are not counted", policy.Quota{"vcpu": 4, "memoryGiB": 4, "gpu": 2}, nil, false, c4, nil},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tenantID := "ten_q" + string(rune('a'+i))
			image := f.offerTo(tenantID, tc.quota)
			for _, flv := range tc.holds {
				if _, err := f.createAs(tenantID, image, flv); err != nil {
					t.Fatal(err)
				}
			}
			if tc.reserve {
				f.exec(`INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
					SELECT node_id, device_id, $1, $2, $3, tstzrange(now() + interval '1 day', now() + interval '2 days'), 'hold'
					FROM devices WHERE node_id IN (SELECT id FROM nodes WHERE pool_id = $3) AND class = 'gpu'
						AND NOT EXISTS (SELECT 1 FROM device_bookings b WHERE b.device_node_id = node_id AND b.device_id = devices.device_id)
					ORDER BY device_id LIMIT 1`, core.NewID("alloc"), tenantID, f.poolID)
			}
			allocations, bookings := f.booked(tenantID)
			in, err := f.createAs(tenantID, image, tc.ask)
			if tc.refused == nil {
				if err != nil || in.NodeID == "" {
					t.Fatalf("create = %+v, %v", in, err)
				}
				return
			}
			quotaRefusal(t, err, tc.refused.resource, tc.refused.limit, tc.refused.inUse, tc.refused.requested)
			if a, b := f.booked(tenantID); a != allocations || b != bookings {
				t.Fatalf("after the refusal: %d allocations, %d bookings; want %d, %d", a, b, allocations, bookings)
			}
			// The refusal is final, as noCapacity is: the draft fails, and a
			// replay answers the same refusal.
			id, _ := core.AsError(err).Details["instanceId"].(string)
			f.tx(func(tx store.Tx) error { return domain.Fail(context.Background(), tx, tenantID, id, err) })
			err = f.st.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
				_, err := domain.Place(context.Background(), tx, tenantID, id)
				return err
			})
			if ce := core.AsError(err); ce.Code != core.CodeQuotaExceeded || ce.Details["resource"] != tc.refused.resource {
				t.Fatalf("replay of the failed draft = %v", err)
			}
		})
	}
	// The pool owner's own instances have no quota.
	for range 3 {
		if _, err := f.create(c4); err != nil {
			t.Fatalf("the owner's create = %v", err)
		}
	}
}

func TestInstanceQuotaOnResize(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, `{}`, 1)
	c2, c4, c8 := f.flavor(2, 2048, 0), f.flavor(4, 4096, 0), f.flavor(8, 8192, 0)
	image := f.offerTo("ten_r", policy.Quota{"vcpu": 8, "memoryGiB": 100})
	stopped := func(flv string) domain.Instance {
		in, err := f.createAs("ten_r", image, flv)
		if err != nil {
			t.Fatal(err)
		}
		f.exec(`UPDATE instances SET state = 'stopped', desired_state = 'stopped' WHERE id = $1`, in.ID)
		return in
	}
	resize := func(id, flv string) (out domain.Instance, err error) {
		err = f.st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			out, err = domain.Resize(ctx, tx, "ten_r", id, flv)
			return err
		})
		if err == nil {
			f.exec(`UPDATE instances SET state = 'stopped' WHERE id = $1`, id)
		}
		return out, err
	}
	big, small := stopped(c4), stopped(c2)
	// 4 + 2 → 4 + 4: exactly the quota.
	if out, err := resize(small.ID, c4); err != nil || out.VCPU != 4 {
		t.Fatalf("resize to the quota = %+v, %v", out, err)
	}
	// 4 + 4 → 8 + 4: over it; the allocation and the flavor stay.
	_, err := resize(big.ID, c8)
	quotaRefusal(t, err, "vcpu", 8, int64(8), int64(4))
	if n := f.count(`SELECT vcpu FROM allocations WHERE instance_id = $1 AND released_at IS NULL`, big.ID); n != 4 {
		t.Fatalf("allocation vcpu after the refusal = %d", n)
	}
	if n := f.count(`SELECT count(*) FROM instances WHERE id = $1 AND flavor_id = $2`, big.ID, c4); n != 1 {
		t.Fatal("the refused resize changed the flavor")
	}
	// A shrink always passes, even under a quota lowered below what is held
	// (setQuota takes the instance keys).
	f.tx(func(tx store.Tx) error {
		_, err := pools.SetQuota(ctx, tx, "ten_r", f.poolID, policy.Quota{"vcpu": 2, "memoryGiB": 1, "gpu": 0})
		return err
	})
	if out, err := resize(big.ID, c2); err != nil || out.VCPU != 2 {
		t.Fatalf("shrink = %+v, %v", out, err)
	}
}

// Concurrent creates of one tenant count the quota one at a time (the
// quota lock after the booking): exactly what the quota holds is placed.
func TestConcurrentCreatesKeepTheQuota(t *testing.T) {
	f := newFixture(t, `{}`, 2)
	g2 := f.flavor(1, 1024, 2)
	image := f.offerTo("ten_c", policy.Quota{"vcpu": 100, "memoryGiB": 100, "gpu": 4})
	placed := race(t, 8, func() error { _, err := f.createAs("ten_c", image, g2); return err },
		func(ce *core.Error) bool { return ce.Code == core.CodeQuotaExceeded && ce.Details["resource"] == "gpu" })
	if placed != 2 {
		t.Fatalf("placed %d, want 2", placed)
	}
	if got := f.count(`SELECT count(*) FROM device_bookings WHERE tenant_id = 'ten_c'`); got != 4 {
		t.Fatalf("GPU bookings = %d, want 4", got)
	}
}

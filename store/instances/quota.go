package instances

import (
	"context"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/capacity"
	"github.com/better-compute/better-compute/store/flavors"
	"github.com/better-compute/better-compute/store/pools"
)

// The offer's quota keys instances count against (pools.Quota). QuotaGPU
// counts the atoms of the flavor's GPU class: whole GPUs ("gpu", the key
// reservations of whole GPUs count against too), or slices on a mig or
// timeslice pool (whose class names cannot be quota keys).
const (
	QuotaVCPU      = "vcpu"
	QuotaMemoryGiB = "memoryGiB"
	QuotaGPU       = "gpu"
)

// quotaAsk is what an instance adds to its tenant's use of a pool: a
// create's whole flavor, a resize's new flavor minus the old one.
type quotaAsk struct {
	vcpu, memoryMiB, gpus int64
	class                 string
	instanceID            string
}

// askOf is what in on flavor f asks of the quota. An instance on a
// reservation asks no GPUs: they are the reservation's, counted by it.
func askOf(in Instance, f flavors.Flavor) quotaAsk {
	class := f.GPUClass
	if class == "" {
		class = placement.ClassGPU
	}
	gpus := int64(f.GPUs)
	if in.ReservationID != "" {
		gpus = 0
	}
	return quotaAsk{vcpu: int64(f.VCPU), memoryMiB: f.MemoryMiB, gpus: gpus, class: class, instanceID: in.ID}
}

// minus is a resize's ask: what the instance holds now is already counted.
func (a quotaAsk) minus(held Instance) quotaAsk {
	a.vcpu -= int64(held.VCPU)
	a.memoryMiB -= held.MemoryMiB
	a.gpus -= int64(held.GPUs)
	return a
}

// checkQuota keeps the tenant's instances on a pool offered to it within
// the offer's quota. It runs once the ask is booked in this transaction
// (the allocation written or resized), under the per-(tenant, pool) quota
// lock reservations take, held to the commit: a reservation and an
// instance racing for the pool's GPUs are counted one at a time, and the
// lock is taken after the booking everywhere, so no holder of it waits for
// a booking whose transaction waits for it. In READ COMMITTED the counts
// after the lock see the previous holder's commit and this transaction's
// own booking.
//
//   - vcpu and memoryGiB: the live allocations (not released) of the
//     tenant's instances on the pool, this one's included, stay within the
//     key's amount;
//   - gpu: the distinct atoms of the flavor's GPU class the tenant has
//     booked in the pool from now on (its instances' and its
//     reservations', as a reservation counts them over its window; an
//     instance's window has no end) stay within it.
//
// A key the offer does not name grants zero, as for reservations. An
// amount the ask does not grow is not checked (a shrink always
// passes); the pool owner's own instances have no quota. Over it:
// QUOTA_EXCEEDED with resource, limit, inUse (without this ask) and
// requested; the caller's transaction rolls back, so nothing is booked.
func checkQuota(ctx context.Context, tx store.Tx, tenantID string, pool pools.Pool, ask quotaAsk) error {
	if pool.TenantID == tenantID || pool.Offer == nil || (ask.vcpu <= 0 && ask.memoryMiB <= 0 && ask.gpus <= 0) {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "quota:"+tenantID+":"+pool.ID); err != nil {
		return err
	}
	quota := pool.Offer.Quota
	if ask.vcpu > 0 || ask.memoryMiB > 0 {
		var vcpu, memoryMiB int64
		if err := tx.QueryRow(ctx, `SELECT COALESCE(sum(a.vcpu), 0), COALESCE(sum(a.memory_mib), 0)
			FROM allocations a JOIN instances i ON i.id = a.instance_id
			WHERE i.tenant_id = $1 AND i.pool_id = $2 AND a.released_at IS NULL`, tenantID, pool.ID).Scan(&vcpu, &memoryMiB); err != nil {
			return err
		}
		if limit := quota[QuotaVCPU]; ask.vcpu > 0 && vcpu > limit {
			return overQuota(QuotaVCPU, limit, vcpu-ask.vcpu, ask.vcpu, ask.instanceID)
		}
		if limit := quota[QuotaMemoryGiB]; ask.memoryMiB > 0 && memoryMiB > limit*1024 {
			return overQuota(QuotaMemoryGiB, limit, gib(memoryMiB-ask.memoryMiB), gib(ask.memoryMiB), ask.instanceID)
		}
	}
	if ask.gpus > 0 {
		now, err := capacity.Start(ctx, tx, nil)
		if err != nil {
			return err
		}
		booked, err := capacity.BookedInPool(ctx, tx, tenantID, pool.ID, ask.class, now, farFuture)
		if err != nil {
			return err
		}
		if limit := quota[QuotaGPU]; booked > limit {
			return overQuota(QuotaGPU, limit, booked-ask.gpus, ask.gpus, ask.instanceID)
		}
	}
	return nil
}

func gib(mib int64) float64 { return float64(mib) / 1024 }

func overQuota[N int64 | float64](resource string, limit int64, inUse, requested N, instanceID string) error {
	return core.Errorf(core.CodeQuotaExceeded, "%v %s in use plus %v requested exceeds the quota of %d", inUse, resource, requested, limit).
		WithDetails(map[string]any{"resource": resource, "limit": limit, "inUse": inUse, "requested": requested, "instanceId": instanceID})
}

package main

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/capacity"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/store"
)

// capacityTarget is who the capacity scenario asks, for which tenant, and
// the pool whose counts its answer must hold.
type capacityTarget struct {
	caller *api.Client
	tenant string
	pool   string
}

// capacityBulk fills a pool with n schedulable 8-GPU nodes by SQL ($1 the
// pool, $2 its tenant, $3 a name prefix, $4 n), as api/capacity_bench_test.go
// does: a quarter of the GPUs booked now, a quarter later.
var capacityBulk = []string{
	`INSERT INTO nodes (id, tenant_id, pool_id, name, provision_state, role, connectivity, power, observed_generation, gpu_model, gpu_count)
	 SELECT 'node_' || $3 || i, $2, $1, $3 || i, 'adopted', 'host', 'connected', 'on', 1, 'H100', 8
	 FROM generate_series(1, $4::int) AS i`,
	`INSERT INTO devices (node_id, device_id, tenant_id, pool_id, class, bookable, attributes)
	 SELECT 'node_' || $3 || i, 'GPU-' || i || '-' || g, $2, $1, 'gpu', true, '{"gpuProduct":"H100-SXM5-80GB","gpuModel":"H100"}'
	 FROM generate_series(1, $4::int) AS i, generate_series(0, 7) AS g`,
	`INSERT INTO devices (node_id, device_id, tenant_id, pool_id, class, bookable)
	 SELECT 'node_' || $3 || i, 'node/' || i, $2, $1, 'node', true FROM generate_series(1, $4::int) AS i`,
	`INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
	 SELECT 'node_' || $3 || i, 'GPU-' || i || '-' || g, 'alloc_' || $3 || i, $2, $1,
	        CASE WHEN g < 2 THEN tstzrange(now() - interval '1 hour', now() + interval '1 hour')
	             ELSE tstzrange(now() + interval '1 hour', now() + interval '2 hours') END, 'hold'
	 FROM generate_series(1, $4::int) AS i, generate_series(0, 3) AS g`,
}

// capacityPool makes a pool of the root tenant in the demo site, apart
// from the pools create and list use, and bulk-inserts n nodes into it.
func capacityPool(ctx context.Context, admin *api.Client, st *store.Store, root, siteID, runID string, n int) (capacityTarget, error) {
	p, err := pools.Create.Call(ctx, admin, pools.CreateInput{TenantID: root, SiteID: siteID, Name: "bench-capacity-" + runID,
		Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80})
	if err != nil {
		return capacityTarget{}, fmt.Errorf("pool: %w", err)
	}
	prefix := "bench_cap_" + runID + "_"
	for _, sql := range capacityBulk {
		if _, err := st.Pool.Exec(ctx, sql, p.ID, root, prefix, n); err != nil {
			return capacityTarget{}, fmt.Errorf("bulk insert: %.60s…: %w", sql, err)
		}
	}
	// The planner should see the tables as they now are.
	if _, err := st.Pool.Exec(ctx, `ANALYZE nodes, devices, device_bookings`); err != nil {
		return capacityTarget{}, err
	}
	return capacityTarget{caller: admin, tenant: root, pool: p.ID}, nil
}

// capacityScenario calls capacity.summary for the tenant owning the bulk
// pool, after checking its answer counts that pool exactly.
func capacityScenario(ctx context.Context, t *target, cfg config, prof *profiler, progress func(string, ...any)) (result, error) {
	res := result{Scenario: "capacity", Clients: cfg.capacityClients}
	progress("bulk-inserting %d 8-GPU nodes into a pool of their own", cfg.capacityNodes)
	ct, err := t.capacity(ctx, cfg.capacityNodes)
	if err != nil {
		return res, fmt.Errorf("capacity pool: %w", err)
	}
	in := rpc.TenantInput{TenantID: ct.tenant}
	sum, err := capacity.Summary.Call(ctx, ct.caller, in)
	if err != nil {
		return res, fmt.Errorf("probe: %w", err)
	}
	res.Note = fmt.Sprintf("capacity.summary of tenant %s: %d pools, one of %d bulk-inserted 8-GPU nodes", ct.tenant, len(sum.Pools), cfg.capacityNodes)
	if v := checkCapacity(sum, ct.pool, int64(cfg.capacityNodes)); v != "" {
		res.Violation = v
	}
	prof.begin(res.Scenario)
	run := drive(ctx, cfg.capacityClients, cfg.duration, cfg.requests, func(ctx context.Context, _ int) error {
		_, err := capacity.Summary.Call(ctx, ct.caller, in)
		return err
	}, nil)
	prof.end()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.fill(run)
	return res, nil
}

// checkCapacity says what is wrong with the bulk pool's GPU counts in sum
// (empty: nothing): n nodes of 8, a quarter booked now and a quarter later.
func checkCapacity(sum capacity.CapacitySummary, poolID string, n int64) string {
	for _, p := range sum.Pools {
		if p.PoolID != poolID {
			continue
		}
		for _, r := range p.Resources {
			if r.Resource != "gpu" {
				continue
			}
			if r.Allocatable != 8*n || r.Allocated != 2*n || r.Reserved != 2*n {
				return fmt.Sprintf("pool %s: gpu allocatable %d, allocated %d, reserved %d; want %d, %d, %d",
					poolID, r.Allocatable, r.Allocated, r.Reserved, 8*n, 2*n, 2*n)
			}
			return ""
		}
		return fmt.Sprintf("pool %s: no gpu resource in the summary", poolID)
	}
	return fmt.Sprintf("pool %s: not in the summary", poolID)
}

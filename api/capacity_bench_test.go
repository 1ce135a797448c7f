package api_test

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/api/capacity"
	"github.com/better-compute/better-compute/api/rpc"
)

// BenchmarkCapacitySummary: one pool of 2,000 schedulable nodes × 8 GPUs
// (bulk-inserted), a quarter of the GPUs booked now and a quarter later.
func BenchmarkCapacitySummary(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{}`)
	for _, sql := range []string{
		`INSERT INTO nodes (id, tenant_id, pool_id, name, provision_state, role, connectivity, power, observed_generation, gpu_model, gpu_count)
		 SELECT 'node_bench' || i, 'acme', $1, 'bench-' || i, 'adopted', 'host', 'connected', 'on', 1, 'H100', 8
		 FROM generate_series(1, 2000) AS i`,
		`INSERT INTO devices (node_id, device_id, tenant_id, pool_id, class, bookable, attributes)
		 SELECT 'node_bench' || i, 'GPU-' || i || '-' || g, 'acme', $1, 'gpu', true, '{"gpuProduct":"H100-SXM5-80GB","gpuModel":"H100"}'
		 FROM generate_series(1, 2000) AS i, generate_series(0, 7) AS g`,
		`INSERT INTO devices (node_id, device_id, tenant_id, pool_id, class, bookable)
		 SELECT 'node_bench' || i, 'node/' || i, 'acme', $1, 'node', true FROM generate_series(1, 2000) AS i`,
		`INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
		 SELECT 'node_bench' || i, 'GPU-' || i || '-' || g, 'alloc_bench' || i, 'acme', $1,
		        CASE WHEN g < 2 THEN tstzrange(now() - interval '1 hour', now() + interval '1 hour')
		             ELSE tstzrange(now() + interval '1 hour', now() + interval '2 hours') END, 'hold'
		 FROM generate_series(1, 2000) AS i, generate_series(0, 3) AS g`,
	} {
		if _, err := e.store.Pool.Exec(ctx, sql, p.ID); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := e.store.Pool.Exec(ctx, `ANALYZE nodes, devices, device_bookings`); err != nil {
		b.Fatal(err)
	}
	c := e.client(e.boot.UserToken)
	sum, err := capacity.Summary.Call(ctx, c, rpc.TenantInput{TenantID: "acme"})
	if err != nil || len(sum.Pools) != 1 {
		b.Fatalf("summary = %+v, %v", sum, err)
	}
	gpu := resourceOf(b, sum.Pools[0].Resources, "gpu")
	if gpu.Allocatable != 16000 || gpu.Allocated != 4000 || gpu.Reserved != 4000 {
		b.Fatalf("gpu = %+v", gpu)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := capacity.Summary.Call(ctx, c, rpc.TenantInput{TenantID: "acme"}); err != nil {
			b.Fatal(err)
		}
	}
}

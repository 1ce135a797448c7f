package api_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/api/capacity"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/capacity"
)

// benchFleet is one pool of 2,000 schedulable nodes × 8 GPUs (bulk-inserted),
// a quarter of the GPUs booked now and a quarter later: the fleet every
// capacity benchmark reads. It returns the pool's id.
func benchFleet(b *testing.B, e *env) string {
	b.Helper()
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
	return p.ID
}

// BenchmarkCapacitySummary: capacity.summary over benchFleet.
func BenchmarkCapacitySummary(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	benchFleet(b, e)
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

// BenchmarkCapacityPreview: capacity.preview of 8 GPUs for 30 minutes from
// now over benchFleet (half of each node's GPUs are free then).
func BenchmarkCapacityPreview(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	pool := benchFleet(b, e)
	c := e.client(e.boot.UserToken)
	in := capacity.PreviewInput{TenantID: "acme", PoolID: pool, Devices: placement.Request{Class: "gpu", Count: 8}, Duration: 1800}
	got, err := capacity.Preview.Call(ctx, c, in)
	if err != nil || !got.Fits {
		b.Fatalf("preview = %+v, %v", got, err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := capacity.Preview.Call(ctx, c, in); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFreeNodes: placement's read of free GPU atoms over the next 30
// minutes on benchFleet, in a read-only transaction as capacity.preview
// and reservations.create call it.
func BenchmarkFreeNodes(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	pool := benchFleet(b, e)
	var now int64
	if err := e.store.Pool.QueryRow(ctx, `SELECT (extract(epoch FROM now()) * 1000)::bigint`).Scan(&now); err != nil {
		b.Fatal(err)
	}
	free := func() int {
		var atoms int
		err := e.store.InTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx store.Tx) error {
			nodes, err := domain.FreeNodes(ctx, tx, pool, "gpu", now, now+1800_000, false)
			for _, n := range nodes {
				atoms += len(n.Atoms)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		return atoms
	}
	if got := free(); got != 12000 {
		b.Fatalf("%d free GPU atoms, want 12000", got)
	}
	b.ResetTimer()
	for b.Loop() {
		free()
	}
}

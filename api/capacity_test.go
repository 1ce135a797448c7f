package api_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/api/capacity"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
)

// resourceOf finds a resource's row (gpu rows of the pool's model).
func resourceOf(t testing.TB, rs []capacity.Resource, name string) capacity.Resource {
	t.Helper()
	for _, r := range rs {
		if r.Resource == name && r.GPUProduct == "" {
			return r
		}
	}
	t.Fatalf("no %s row in %+v", name, rs)
	return capacity.Resource{}
}

func wantCounts(t testing.TB, what string, r capacity.Resource, allocatable, allocated, reserved int64) {
	t.Helper()
	if r.Allocatable != allocatable || r.Allocated != allocated || r.Reserved != reserved || r.Available != allocatable-allocated {
		t.Fatalf("%s = %+v, want allocatable %d allocated %d reserved %d", what, r, allocatable, allocated, reserved)
	}
}

// gpuAtoms lists a node's GPU atoms.
func (e *env) gpuAtoms(nodeID string) []string {
	e.t.Helper()
	ids, err := collect(e, `SELECT device_id FROM devices WHERE node_id = $1 AND class = 'gpu' AND bookable ORDER BY device_id`, nodeID)
	if err != nil || len(ids) == 0 {
		e.t.Fatalf("gpu atoms of %s: %v %v", nodeID, ids, err)
	}
	return ids
}

func collect(e *env, sql string, args ...any) ([]string, error) {
	rows, err := e.store.Pool.Query(context.Background(), sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// book writes a booking of one atom over [lower, upper), SQL expressions.
func (e *env) book(nodeID, deviceID, poolID, lower, upper string) error {
	_, err := e.store.Pool.Exec(context.Background(), fmt.Sprintf(`INSERT INTO device_bookings
		(device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
		VALUES ($1, $2, $3, 'acme', $4, tstzrange(%s, %s), 'hold')`, lower, upper), nodeID, deviceID, core.NewID("alloc"), poolID)
	return err
}

func sqlState(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

func TestCapacity(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, g := e.client(e.boot.UserToken), e.client(e.globex)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{}`)
	q := e.poolWith("acme", s.ID, "h200", "H200", "", `{}`)
	n1 := e.node(schedulableNode(p.ID, "gpu-a01"), fixture(t, "h100-8x-sxm.json"))
	n2 := e.node(schedulableNode(q.ID, "gpu-b01"), fixture(t, "h200-8x.json"))
	if !n1.Schedulable || !n2.Schedulable {
		t.Fatalf("nodes not schedulable: %+v %+v", n1, n2)
	}

	got, err := capacity.Pool.Call(ctx, a, capacity.PoolInput{TenantID: "acme", PoolID: p.ID})
	if err != nil || got.PoolID != p.ID || got.GPUModel != "H100" || got.Offered || got.Quota != nil || got.At == 0 {
		t.Fatalf("pools.capacity = %+v, %v", got, err)
	}
	if gpu := resourceOf(t, got.Resources, "gpu"); gpu.GPUModel != "H100" {
		t.Fatalf("gpu row = %+v", gpu)
	}
	wantCounts(t, "gpu", resourceOf(t, got.Resources, "gpu"), 8, 0, 0)
	wantCounts(t, "node", resourceOf(t, got.Resources, "node"), 1, 0, 0)

	// A cordoned node's atoms are not allocatable; uncordoned, they are again.
	if _, err := nodes.Cordon.Call(ctx, a, nodes.NodeInput{TenantID: "acme", NodeID: n1.ID}); err != nil {
		t.Fatal(err)
	}
	got, _ = capacity.Pool.Call(ctx, a, capacity.PoolInput{TenantID: "acme", PoolID: p.ID})
	wantCounts(t, "gpu cordoned", resourceOf(t, got.Resources, "gpu"), 0, 0, 0)
	wantCounts(t, "node cordoned", resourceOf(t, got.Resources, "node"), 0, 0, 0)
	if _, err := nodes.Uncordon.Call(ctx, a, nodes.NodeInput{TenantID: "acme", NodeID: n1.ID}); err != nil {
		t.Fatal(err)
	}

	// Bookings: one atom now, one in the future, one both (allocated only).
	gpus := e.gpuAtoms(n1.ID)
	for _, b := range [][3]string{
		{gpus[0], "now() - interval '1 hour'", "now() + interval '1 hour'"},
		{gpus[1], "now() + interval '1 hour'", "now() + interval '2 hours'"},
		{gpus[2], "now() - interval '1 hour'", "now() + interval '1 hour'"},
		{gpus[2], "now() + interval '3 hours'", "now() + interval '4 hours'"},
		{gpus[3], "now() - interval '3 hours'", "now() - interval '2 hours'"}, // past: counts nowhere
	} {
		if err := e.book(n1.ID, b[0], p.ID, b[1], b[2]); err != nil {
			t.Fatal(err)
		}
	}
	got, _ = capacity.Pool.Call(ctx, a, capacity.PoolInput{TenantID: "acme", PoolID: p.ID})
	wantCounts(t, "gpu booked", resourceOf(t, got.Resources, "gpu"), 8, 2, 1)

	// The database refuses a double booking; an adjacent one is fine.
	if err := e.book(n1.ID, gpus[1], p.ID, "now() + interval '90 minutes'", "now() + interval '5 hours'"); sqlState(err) != "23P01" {
		t.Fatalf("overlapping booking = %v, want 23P01", err)
	}
	if err := e.book(n1.ID, gpus[1], p.ID, "now() + interval '2 hours'", "now() + interval '5 hours'"); err != nil {
		t.Fatalf("adjacent booking: %v", err)
	}

	// The summary: both pools, their totals.
	sum, err := capacity.Summary.Call(ctx, a, rpc.TenantInput{TenantID: "acme"})
	if err != nil || sum.TenantID != "acme" || len(sum.Pools) != 2 || sum.Pools[0].PoolID != p.ID || sum.Pools[1].PoolID != q.ID {
		t.Fatalf("summary = %+v, %v", sum, err)
	}
	wantCounts(t, "h200 gpu", resourceOf(t, sum.Pools[1].Resources, "gpu"), 8, 0, 0)
	wantCounts(t, "total nodes", resourceOf(t, sum.Totals, "node"), 2, 0, 0)
	gpuModels := map[string]capacity.Resource{}
	for _, r := range sum.Totals {
		if r.Resource == "gpu" {
			gpuModels[r.GPUModel] = r
		}
	}
	if len(gpuModels) != 2 || gpuModels["H100"].Allocated != 2 || gpuModels["H200"].Available != 8 {
		t.Fatalf("gpu totals = %+v", sum.Totals)
	}

	// byPool: the breakdown per gpuProduct.
	bp, err := capacity.ByPool.Call(ctx, a, capacity.PoolInput{TenantID: "acme", PoolID: p.ID})
	if err != nil || len(bp.Breakdown) == 0 {
		t.Fatalf("byPool = %+v, %v", bp, err)
	}
	var gpuRows int
	for _, r := range bp.Breakdown {
		if r.Resource == "gpu" {
			gpuRows++
			if r.GPUProduct == "" || r.Allocatable != 8 || r.Allocated != 2 {
				t.Fatalf("breakdown gpu row = %+v", r)
			}
		}
	}
	if gpuRows != 1 {
		t.Fatalf("breakdown = %+v", bp.Breakdown)
	}

	// An offered pool shows in the receiving tenant's summary with its quota;
	// the other stays out of its view.
	if _, err := pools.Offer.Call(ctx, a, pools.OfferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex", Quota: map[string]int64{"gpu": 4}}); err != nil {
		t.Fatal(err)
	}
	gs, err := capacity.Summary.Call(ctx, g, rpc.TenantInput{TenantID: "globex"})
	if err != nil || len(gs.Pools) != 1 || gs.Pools[0].PoolID != p.ID || !gs.Pools[0].Offered || gs.Pools[0].Quota["gpu"] != 4 ||
		gs.Pools[0].TenantID != "acme" {
		t.Fatalf("globex summary = %+v, %v", gs, err)
	}
	wantCounts(t, "globex gpu", resourceOf(t, gs.Pools[0].Resources, "gpu"), 8, 2, 1)
	if gp, err := capacity.Pool.Call(ctx, g, capacity.PoolInput{TenantID: "globex", PoolID: p.ID}); err != nil || !gp.Offered || gp.Quota["gpu"] != 4 {
		t.Fatalf("globex pools.capacity = %+v, %v", gp, err)
	}
	if _, err := capacity.Pool.Call(ctx, g, capacity.PoolInput{TenantID: "globex", PoolID: q.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex on acme's unoffered pool = %v, want NOT_FOUND", err)
	}
	if _, err := capacity.Timeline.Call(ctx, g, capacity.TimelineInput{TenantID: "globex", PoolID: q.ID, From: 0, To: 1000}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex timeline on acme's unoffered pool = %v, want NOT_FOUND", err)
	}
	if _, err := capacity.Summary.Call(ctx, g, rpc.TenantInput{TenantID: "acme"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex summary of acme = %v, want ACCESS_DENIED", err)
	}
	if _, err := capacity.Pool.Call(ctx, g, capacity.PoolInput{TenantID: "acme", PoolID: p.ID}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex pools.capacity in acme = %v, want ACCESS_DENIED", err)
	}
	if _, err := capacity.Pool.Call(ctx, a, capacity.PoolInput{TenantID: "acme", PoolID: core.NewID("pool")}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("unknown pool = %v, want NOT_FOUND", err)
	}
	if _, err := capacity.ByPool.Call(ctx, a, capacity.PoolInput{TenantID: "acme", PoolID: core.NewID("pool")}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("byPool unknown pool = %v, want NOT_FOUND", err)
	}

	tok := e.boot.UserToken
	e.wantInvalid(tok, "pools.capacity", map[string]string{
		`{"tenantId":"acme"}`:                               "poolId",
		`{"tenantId":"acme","poolId":"nope"}`:               "poolId",
		`{"tenantId":"acme","poolId":"` + p.ID + `","x":1}`: "x",
	})
	e.wantInvalid(tok, "capacity.byPool", map[string]string{`{"tenantId":"acme"}`: "poolId"})
	e.wantInvalid(tok, "capacity.summary", map[string]string{`{"tenantId":"acme","poolId":"` + p.ID + `"}`: "poolId"})
	e.wantInvalid(tok, "capacity.timeline", map[string]string{
		`{"tenantId":"acme","poolId":"` + p.ID + `","to":1}`:                         "from",
		`{"tenantId":"acme","poolId":"` + p.ID + `","from":"0","to":1}`:              "from",
		`{"tenantId":"acme","poolId":"` + p.ID + `","from":10,"to":10}`:              "to",
		`{"tenantId":"acme","poolId":"` + p.ID + `","from":-1,"to":10}`:              "from",
		`{"tenantId":"acme","poolId":"` + p.ID + `","from":0,"to":10,"buckets":501}`: "buckets",
		`{"tenantId":"acme","poolId":"` + p.ID + `","from":0,"to":10,"buckets":0}`:   "buckets",
	})
}

// The timeline counts atoms booked in each bucket, over fixed instants:
// allocated, reserved and available.
func TestCapacityTimeline(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{}`)
	n := e.node(schedulableNode(p.ID, "gpu-a01"), fixture(t, "h100-8x-sxm.json"))
	gpus := e.gpuAtoms(n.ID)
	t0 := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(h int) string {
		return fmt.Sprintf("'%s'::timestamptz", t0.Add(time.Duration(h)*time.Hour).Format(time.RFC3339))
	}
	for _, b := range []struct {
		gpu        string
		from, upto int
	}{{gpus[0], 1, 3}, {gpus[1], 2, 3}, {gpus[0], 3, 4}} {
		if err := e.book(n.ID, b.gpu, p.ID, at(b.from), at(b.upto)); err != nil {
			t.Fatal(err)
		}
	}
	from := t0.UnixMilli()
	tl, err := capacity.Timeline.Call(ctx, a, capacity.TimelineInput{TenantID: "acme", PoolID: p.ID, From: from,
		To: t0.Add(5 * time.Hour).UnixMilli(), Buckets: 5})
	if err != nil || len(tl.Buckets) != 5 || tl.BucketMs != 3600_000 || tl.Allocatable["gpu"] != 8 || tl.Allocatable["node"] != 1 {
		t.Fatalf("timeline = %+v, %v", tl, err)
	}
	for i, want := range []int64{0, 1, 2, 1, 0} {
		if b := tl.Buckets[i]; b.Booked["gpu"] != want || b.Start != from+int64(i)*3600_000 || b.End != b.Start+3600_000 ||
			b.Allocated["gpu"] != want || b.Reserved["gpu"] != 0 || b.Available["gpu"] != 8-want {
			t.Errorf("bucket %d = %+v, want %d gpus", i, b, want)
		}
	}
	// A booking of a reservation not bound yet is reserved, not allocated.
	e.exec(`INSERT INTO reservations (id, tenant_id, owner_identity_id, pool_id, state, devices, starts_at, ends_at)
		VALUES ('rsv_tl', 'acme', 'idn_x', $1, 'placed', '{"gpu":1}', `+at(2)+`, `+at(3)+`)`, p.ID)
	e.exec(`INSERT INTO allocations (id, tenant_id, reservation_id, node_id, atoms) VALUES ('alloc_tl', 'acme', 'rsv_tl', $1, $2)`,
		n.ID, []string{gpus[2]})
	e.exec(`INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
		VALUES ($1, $2, 'alloc_tl', 'acme', $3, tstzrange(`+at(2)+`, `+at(3)+`), 'reservation')`, n.ID, gpus[2], p.ID)
	tl, err = capacity.Timeline.Call(ctx, a, capacity.TimelineInput{TenantID: "acme", PoolID: p.ID, From: from,
		To: t0.Add(5 * time.Hour).UnixMilli(), Buckets: 5})
	if b := tl.Buckets[2]; err != nil || b.Booked["gpu"] != 3 || b.Allocated["gpu"] != 2 || b.Reserved["gpu"] != 1 || b.Available["gpu"] != 5 {
		t.Fatalf("bucket 2 with a placed reservation = %+v, %v", b, err)
	}
	// A default bucket count, and a window shorter than the buckets.
	if tl, err := capacity.Timeline.Call(ctx, a, capacity.TimelineInput{TenantID: "acme", PoolID: p.ID, From: from, To: from + 10}); err != nil ||
		len(tl.Buckets) != 10 || tl.BucketMs != 1 {
		t.Fatalf("short timeline = %d buckets of %d, %v", len(tl.Buckets), tl.BucketMs, err)
	}
	// The reserved atoms: booked only in the future (three distinct GPUs).
	got, _ := capacity.Pool.Call(ctx, a, capacity.PoolInput{TenantID: "acme", PoolID: p.ID})
	wantCounts(t, "gpu", resourceOf(t, got.Resources, "gpu"), 8, 0, 3)
}

// The SQL predicate allocatable counts by agrees with core/nodes.Schedulable
// on every clause: nodes made to fail one clause each, with one node atom.
func TestCapacitySchedulableMatchesPredicate(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{}`)
	variants := map[string]func(*nodesdomain.NewNode){
		"ok":                func(*nodesdomain.NewNode) {},
		"deployed":          func(n *nodesdomain.NewNode) { n.ProvisionState = nodestate.Deployed },
		"ready":             func(n *nodesdomain.NewNode) { n.ProvisionState = nodestate.Ready },
		"unassigned":        func(n *nodesdomain.NewNode) { n.Role = nodestate.RoleUnassigned },
		"disconnected":      func(n *nodesdomain.NewNode) { n.Connectivity = nodestate.Disconnected },
		"generation0":       func(n *nodesdomain.NewNode) { n.ObservedGeneration = 0 },
		"owned-by-owner":    func(n *nodesdomain.NewNode) { n.Trust, n.OwnerTenantID = nodestate.TrustTenantOwned, "acme" },
		"owned-by-other":    func(n *nodesdomain.NewNode) { n.Trust, n.OwnerTenantID = nodestate.TrustTenantOwned, "globex" },
		"tenant-controlled": func(n *nodesdomain.NewNode) { n.Trust, n.OwnerTenantID = nodestate.TrustTenantControlled, "acme" },
		"maintenance":       func(*nodesdomain.NewNode) {},
		"no-schedule":       func(*nodesdomain.NewNode) {},
		"cordoned":          func(*nodesdomain.NewNode) {},
	}
	var ids []string
	for name, f := range variants {
		in := schedulableNode(p.ID, name)
		f(&in)
		n := e.node(in, nil)
		ids = append(ids, n.ID)
		if _, err := e.store.Pool.Exec(ctx, `INSERT INTO devices (node_id, device_id, tenant_id, pool_id, class, bookable)
			VALUES ($1, 'node/' || $1, 'acme', $2, 'node', true)`, n.ID, p.ID); err != nil {
			t.Fatal(err)
		}
		var set string
		switch name {
		case "maintenance":
			set = `maintenance = true`
		case "no-schedule":
			set = `no_schedule_reasons = '{GpuCountMismatch}'`
		case "cordoned":
			set = `cordoned = true`
		}
		if set != "" {
			if _, err := e.store.Pool.Exec(ctx, `UPDATE nodes SET `+set+` WHERE id = $1`, n.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	var want int64
	for _, id := range ids {
		n, err := nodes.Get.Call(ctx, a, nodes.NodeInput{TenantID: "acme", NodeID: id})
		if err != nil {
			t.Fatal(err)
		}
		if n.Schedulable {
			want++
		}
	}
	if want != 3 {
		t.Fatalf("%d schedulable variants, want 3 (ok, deployed, owned-by-owner)", want)
	}
	got, err := capacity.Pool.Call(ctx, a, capacity.PoolInput{TenantID: "acme", PoolID: p.ID})
	if err != nil {
		t.Fatal(err)
	}
	wantCounts(t, "node", resourceOf(t, got.Resources, "node"), want, 0, 0)
}

package api_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/api/capacity"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/capacity"
)

// exactFleet is a generated fleet and its bookings, the brute-force side of
// TestCapacityCountsMatchBruteForce: what the test wrote, counted in Go.
type exactFleet struct {
	nodes []exactNode
	// slots[atom] are the hours h booked for the atom, each [now+h, now+h+1)
	// relative to the moment the test started.
	slots map[exactAtom]map[int]bool
}

type exactNode struct {
	id, pool    string
	schedulable bool
	deleted     bool
	atoms       []exactAtom
}

type exactAtom struct {
	node, device, class, product string
	// allocatable: bookable and not removed (on a schedulable node: see
	// the node).
	allocatable bool
}

// The hours a booking may start at, relative to the test's start.
const exactFirstHour, exactLastHour = -3, 4

// counts is the brute force of capacity's counts for the pool: per class
// (and per class and product) allocatable, allocated, reserved.
func (f *exactFleet) counts(pool string, byProduct bool) map[string][3]int64 {
	out := map[string][3]int64{}
	for _, n := range f.nodes {
		if n.pool != pool || n.deleted || !n.schedulable {
			continue
		}
		for _, a := range n.atoms {
			if !a.allocatable {
				continue
			}
			key := a.class
			if byProduct {
				key += "/" + a.product
			}
			c := out[key]
			c[0]++
			switch {
			case f.slots[a][0]:
				c[1]++
			default:
				for h := 1; h <= exactLastHour; h++ {
					if f.slots[a][h] {
						c[2]++
						break
					}
				}
			}
			out[key] = c
		}
	}
	return out
}

// free is the brute force of FreeNodes: per live node of the pool, whether
// it is schedulable and how many of its atoms of class are free over the
// hours [from, to).
func (f *exactFleet) free(pool, class string, from, to int) map[string]int {
	out := map[string]int{}
	for _, n := range f.nodes {
		if n.pool != pool || n.deleted {
			continue
		}
		key := fmt.Sprintf("%s/%v", n.id, n.schedulable)
		out[key] += 0
		if !n.schedulable {
			continue
		}
		booked := func(a exactAtom) bool {
			for h := from; h < to; h++ {
				if f.slots[a][h] {
					return true
				}
			}
			return false
		}
		var nodeBooked, anyBooked bool
		for _, a := range n.atoms {
			if booked(a) {
				anyBooked = true
				nodeBooked = nodeBooked || a.class == "node"
			}
		}
		for _, a := range n.atoms {
			if a.class != class || !a.allocatable || booked(a) || nodeBooked || (a.class == "node" && anyBooked) {
				continue
			}
			out[key]++
		}
	}
	return out
}

// generate writes nodes of the pools in every schedulability, each with 8
// GPUs of two products and a node atom, some not bookable or removed.
func (f *exactFleet) generate(t *testing.T, e *env, rng *rand.Rand, pools ...string) {
	t.Helper()
	ctx := context.Background()
	variants := []struct {
		name, set   string
		schedulable bool
		deleted     bool
	}{
		{"ok", "", true, false},
		{"ok2", "", true, false},
		{"deployed", "provision_state = 'deployed'", true, false},
		{"cordoned", "cordoned = true", false, false},
		{"maintenance", "maintenance = true", false, false},
		{"disconnected", "connectivity = 'disconnected'", false, false},
		{"no-schedule", "no_schedule_reasons = '{GpuCountMismatch}'", false, false},
		{"unassigned", "role = 'unassigned'", false, false},
		{"deleted", "deleted_at = now()", false, true},
	}
	batch := &pgx.Batch{}
	for _, pool := range pools {
		for i := range 3 {
			for _, v := range variants {
				n := exactNode{id: fmt.Sprintf("node_%s_%s_%d", pool, v.name, i), pool: pool, schedulable: v.schedulable, deleted: v.deleted}
				batch.Queue(`INSERT INTO nodes (id, tenant_id, pool_id, name, provision_state, role, connectivity, power, observed_generation)
					VALUES ($1, 'acme', $2, $1, 'adopted', 'host', 'connected', 'on', 1)`, n.id, pool)
				if v.set != "" {
					batch.Queue(`UPDATE nodes SET `+v.set+` WHERE id = $1`, n.id)
				}
				for g := range 8 {
					a := exactAtom{node: n.id, device: fmt.Sprintf("GPU-%s-%d", n.id, g), class: "gpu", product: "H100-SXM5-80GB", allocatable: true}
					if g%2 == 1 {
						a.product = "H100-PCIE-80GB"
					}
					bookable, removed := rng.IntN(10) > 0, rng.IntN(10) == 0
					a.allocatable = bookable && !removed
					n.atoms = append(n.atoms, a)
					batch.Queue(`INSERT INTO devices (node_id, device_id, tenant_id, pool_id, class, bookable, attributes, removed_at)
						VALUES ($1, $2, 'acme', $3, 'gpu', $4, jsonb_build_object('gpuProduct', $5::text),
							CASE WHEN $6 THEN now() END)`, n.id, a.device, pool, bookable, a.product, removed)
				}
				a := exactAtom{node: n.id, device: "node/" + n.id, class: "node", allocatable: true}
				n.atoms = append(n.atoms, a)
				batch.Queue(`INSERT INTO devices (node_id, device_id, tenant_id, pool_id, class, bookable) VALUES ($1, $2, 'acme', $3, 'node', true)`,
					n.id, a.device, pool)
				f.nodes = append(f.nodes, n)
			}
		}
	}
	if err := e.store.Pool.SendBatch(ctx, batch).Close(); err != nil {
		t.Fatal(err)
	}
}

// book books random free hours of random atoms (whole-node atoms rarely).
func (f *exactFleet) book(t *testing.T, e *env, rng *rand.Rand, start string, bookings int) {
	t.Helper()
	batch := &pgx.Batch{}
	for range bookings {
		n := f.nodes[rng.IntN(len(f.nodes))]
		a := n.atoms[rng.IntN(len(n.atoms)-1)]
		if rng.IntN(20) == 0 {
			a = n.atoms[len(n.atoms)-1]
		}
		h := exactFirstHour + rng.IntN(exactLastHour-exactFirstHour+1)
		if f.slots[a][h] {
			continue
		}
		if f.slots[a] == nil {
			f.slots[a] = map[int]bool{}
		}
		f.slots[a][h] = true
		batch.Queue(`INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
			VALUES ($1, $2, $3, 'acme', $4, tstzrange($5::timestamptz + $6 * interval '1 hour', $5::timestamptz + ($6 + 1) * interval '1 hour'), 'hold')`,
			a.node, a.device, fmt.Sprintf("alloc_%s_%d", a.device, h), n.pool, start, h)
	}
	if err := e.store.Pool.SendBatch(context.Background(), batch).Close(); err != nil {
		t.Fatal(err)
	}
}

// The capacity counts, the per-product breakdown and placement's free
// atoms agree with a brute-force count of what was written, over nodes in
// every schedulability, unbookable and removed devices, and random
// bookings in the past, now and later, added round by round. Bookings are
// whole hours from the test's start, so now stays inside hour 0.
func TestCapacityCountsMatchBruteForce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{}`)
	q := e.poolWith("acme", s.ID, "h100b", "H100", "", `{}`)
	var start string
	var startMs int64
	if err := e.store.Pool.QueryRow(ctx, `SELECT now()::text, (extract(epoch FROM now()) * 1000)::bigint`).Scan(&start, &startMs); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(13, 5))
	f := &exactFleet{slots: map[exactAtom]map[int]bool{}}
	f.generate(t, e, rng, p.ID, q.ID)

	for round := range 4 {
		if round > 0 {
			f.book(t, e, rng, start, 150)
		}
		sum, err := capacity.Summary.Call(ctx, c, rpc.TenantInput{TenantID: "acme"})
		if err != nil || len(sum.Pools) != 2 {
			t.Fatalf("round %d: summary = %+v, %v", round, sum, err)
		}
		var totals [2][3]int64
		for _, pc := range sum.Pools {
			want := f.counts(pc.PoolID, false)
			for i, class := range []string{"gpu", "node"} {
				r := resourceOf(t, pc.Resources, class)
				w := want[class]
				wantCounts(t, fmt.Sprintf("round %d pool %s %s", round, pc.PoolID, class), r, w[0], w[1], w[2])
				for j := range w {
					totals[i][j] += w[j]
				}
			}
			bp, err := capacity.ByPool.Call(ctx, c, capacity.PoolInput{TenantID: "acme", PoolID: pc.PoolID})
			if err != nil {
				t.Fatal(err)
			}
			wantProducts := f.counts(pc.PoolID, true)
			for _, r := range bp.Breakdown {
				w := wantProducts[r.Resource+"/"+r.GPUProduct]
				wantCounts(t, fmt.Sprintf("round %d pool %s breakdown %s %s", round, pc.PoolID, r.Resource, r.GPUProduct), r, w[0], w[1], w[2])
				delete(wantProducts, r.Resource+"/"+r.GPUProduct)
			}
			for key, w := range wantProducts {
				if w[0] > 0 {
					t.Fatalf("round %d pool %s: no breakdown row %s, want %v", round, pc.PoolID, key, w)
				}
			}
		}
		for i, class := range []string{"gpu", "node"} {
			w := totals[i]
			wantCounts(t, fmt.Sprintf("round %d total %s", round, class), resourceOf(t, sum.Totals, class), w[0], w[1], w[2])
		}

		for _, window := range [][2]int{{0, 1}, {-1, 2}, {1, 3}, {exactLastHour, exactLastHour + 1}} {
			for _, class := range []string{"gpu", "node"} {
				var nodes []placement.Node
				err := e.store.InTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx store.Tx) (err error) {
					// The window's edges are inside their hours, so a booking
					// of hour h overlaps [from, to) when from <= h < to.
					from, to := startMs+int64(window[0])*3600_000+1000, startMs+int64(window[1]-1)*3600_000+3599_000
					nodes, err = domain.FreeNodes(ctx, tx, p.ID, class, from, to, false)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				got := map[string]int{}
				for _, n := range nodes {
					got[fmt.Sprintf("%s/%v", n.ID, n.Schedulable)] = len(n.Atoms)
				}
				want := f.free(p.ID, class, window[0], window[1])
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("round %d: free %s atoms over hours %v =\n%v, want\n%v", round, class, window, got, want)
				}
			}
		}
	}
}

package instances

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/capacity"
	"github.com/better-compute/better-compute/store/flavors"
	"github.com/better-compute/better-compute/store/pools"
)

// Overcommit resources of a pool's policy.overcommit that instances count
// against: vCPU and memory. A ratio not given is 1.
const (
	OvercommitVCPU   = "vcpu"
	OvercommitMemory = "memory"
)

// farFuture is the end of the window an instance's GPU atoms must be
// free over (9999-12-31, epoch ms): its booking has no end.
const farFuture = 253402300799999

// NodeScalars is a node's vCPU and memory as instances see them: its
// capacity (the latest inventory's logical CPUs and memory, times the
// pool's overcommit) and what live instance allocations hold.
type NodeScalars struct {
	NodeID                string
	VCPU, UsedVCPU        int64
	MemoryMiB, UsedMemory int64
}

// Fits says whether vcpu and memoryMiB more fit.
func (n NodeScalars) Fits(vcpu, memoryMiB int64) bool {
	return n.UsedVCPU+vcpu <= n.VCPU && n.UsedMemory+memoryMiB <= n.MemoryMiB
}

func ratio(p pools.Pool, resource string) float64 {
	if r, ok := p.Policy.Overcommit[resource]; ok && r >= 1 {
		return r
	}
	return 1
}

// nodeScalars reads the scalars of the given nodes of the pool (all of
// them when ids is nil). In READ COMMITTED, a read after the node's lock
// sees what the lock's previous holder committed.
func nodeScalars(ctx context.Context, tx store.Tx, pool pools.Pool, ids []string) (map[string]NodeScalars, error) {
	rows, err := tx.Query(ctx, `SELECT n.id,
			COALESCE((SELECT (i.document->'cpu'->>'logicalCpus')::bigint FROM node_inventories i
				WHERE i.node_id = n.id ORDER BY i.seq DESC LIMIT 1), 0),
			COALESCE((SELECT (i.document->'memory'->>'totalBytes')::bigint / 1048576 FROM node_inventories i
				WHERE i.node_id = n.id ORDER BY i.seq DESC LIMIT 1), 0),
			COALESCE((SELECT sum(a.vcpu) FROM allocations a WHERE a.node_id = n.id AND a.instance_id IS NOT NULL AND a.released_at IS NULL), 0),
			COALESCE((SELECT sum(a.memory_mib) FROM allocations a WHERE a.node_id = n.id AND a.instance_id IS NOT NULL AND a.released_at IS NULL), 0)
		FROM nodes n WHERE n.pool_id = $1 AND n.deleted_at IS NULL AND ($2::text[] IS NULL OR n.id = ANY($2))`, pool.ID, ids)
	if err != nil {
		return nil, err
	}
	out := map[string]NodeScalars{}
	var s NodeScalars
	var cpus, mem int64
	_, err = pgx.ForEachRow(rows, []any{&s.NodeID, &cpus, &mem, &s.UsedVCPU, &s.UsedMemory}, func() error {
		s.VCPU = int64(math.Floor(float64(cpus) * ratio(pool, OvercommitVCPU)))
		s.MemoryMiB = int64(math.Floor(float64(mem) * ratio(pool, OvercommitMemory)))
		out[s.NodeID] = s
		return nil
	})
	return out, err
}

// lockNode takes the node's instance-placement lock, held to the commit:
// placements and resizes on one node count its free scalars one at a
// time.
func lockNode(ctx context.Context, tx store.Tx, nodeID string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "instance-node:"+nodeID)
	return err
}

// maxPlaceAttempts bounds the placements that concurrent GPU bookings
// refuse.
const maxPlaceAttempts = 8

// placeOnNode books the instance's allocation on a node of the pool: a
// schedulable node (core/nodes.Schedulable, as capacity reads it) whose
// free vCPU and memory (its capacity times the pool's overcommit, minus
// live instance allocations, counted under the node's lock) take the
// flavor's, and whose free GPU atoms of the flavor's class core/placement
// places the flavor's count on. Candidates are tried busiest first
// (packing), ties by the instance's seed; onNode, when set, is the only
// candidate. Nothing fits: INVALID_STATE, reason noCapacity, with each
// node's reason and the placement reasons.
func placeOnNode(ctx context.Context, tx store.Tx, pool pools.Pool, f flavors.Flavor, in Instance, onNode string) (string, error) {
	class := f.GPUClass
	if class == "" {
		class = placement.ClassGPU
	}
	seed := placement.Seed(in.ID)
	for attempt := 0; attempt < maxPlaceAttempts; attempt++ {
		now, err := capacity.Start(ctx, tx, nil)
		if err != nil {
			return "", err
		}
		free, err := capacity.FreeNodes(ctx, tx, pool.ID, class, now, farFuture, false)
		if err != nil {
			return "", err
		}
		scalars, err := nodeScalars(ctx, tx, pool, nil)
		if err != nil {
			return "", err
		}
		var nodeReasons []map[string]any
		var gpuReasons []placement.Reason
		lost := false
		for _, n := range orderCandidates(free, scalars, seed) {
			s := scalars[n.ID]
			switch {
			case onNode != "" && n.ID != onNode:
				continue
			case !n.Schedulable:
				nodeReasons = append(nodeReasons, map[string]any{"nodeId": n.ID, "reason": "notSchedulable"})
				continue
			case !s.Fits(int64(f.VCPU), f.MemoryMiB):
				nodeReasons = append(nodeReasons, scalarReason(s, f))
				continue
			}
			var atoms []string
			if f.GPUs > 0 {
				plan, reasons := placement.PlaceSpread(placement.Request{Class: class, Count: f.GPUs,
					Topology: placement.Topology{Type: placement.TopologyAny}}, []placement.Node{n}, seed)
				if len(reasons) > 0 {
					gpuReasons = append(gpuReasons, reasons...)
					nodeReasons = append(nodeReasons, map[string]any{"nodeId": n.ID, "reason": "gpus"})
					continue
				}
				atoms = plan.Allocations[0].Atoms
			}
			if err := lockNode(ctx, tx, n.ID); err != nil {
				return "", err
			}
			again, err := nodeScalars(ctx, tx, pool, []string{n.ID})
			if err != nil {
				return "", err
			}
			if s := again[n.ID]; !s.Fits(int64(f.VCPU), f.MemoryMiB) {
				nodeReasons = append(nodeReasons, scalarReason(s, f))
				continue
			}
			err = bookInSavepoint(ctx, tx, in, pool.ID, n.ID, int64(f.VCPU), f.MemoryMiB, atoms)
			if errors.Is(err, errLostRace) {
				lost = true
				break
			}
			if err != nil {
				return "", err
			}
			return n.ID, nil
		}
		if lost {
			continue // a concurrent booking took the atoms: read again
		}
		details := map[string]any{"reason": "noCapacity", "nodes": nodeReasons, "instanceId": in.ID}
		if onNode != "" {
			details["nodeId"] = onNode // the host of the volumes it mounts
		}
		if len(gpuReasons) > 0 {
			details["reasons"] = gpuReasons
		}
		if len(free) == 0 {
			details["reasons"] = []placement.Reason{{Code: "noSchedulableNodes", Message: "the pool has no nodes"}}
		}
		return "", core.Errorf(core.CodeInvalidState, "flavor %s fits no node of pool %s", f.ID, pool.ID).WithDetails(details)
	}
	return "", core.Errorf(core.CodeUnavailable, "concurrent bookings kept taking the atoms; retry with the same idempotencyKey").
		WithDetails(map[string]any{"reason": "contention", "instanceId": in.ID})
}

func scalarReason(s NodeScalars, f flavors.Flavor) map[string]any {
	r := map[string]any{"nodeId": s.NodeID, "freeVcpu": s.VCPU - s.UsedVCPU, "freeMemoryMiB": s.MemoryMiB - s.UsedMemory}
	if s.UsedVCPU+int64(f.VCPU) > s.VCPU {
		r["reason"] = "vcpu"
	} else {
		r["reason"] = "memory"
	}
	return r
}

// orderCandidates orders the pool's nodes busiest first (the most vCPU
// held by instances, so instances pack and whole nodes stay free), ties
// broken by the seed.
func orderCandidates(nodes []placement.Node, scalars map[string]NodeScalars, seed uint64) []placement.Node {
	out := append([]placement.Node(nil), nodes...)
	key := func(n placement.Node) uint64 { return placement.Seed(fmt.Sprint(seed, n.ID)) }
	for i := 1; i < len(out); i++ {
		for j := i; j > 0; j-- {
			a, b := out[j-1], out[j]
			ua, ub := scalars[a.ID].UsedVCPU, scalars[b.ID].UsedVCPU
			if ua > ub || (ua == ub && key(a) <= key(b)) {
				break
			}
			out[j-1], out[j] = b, a
		}
	}
	return out
}

var errLostRace = errors.New("a concurrent booking took the atoms")

// bookInSavepoint inserts the instance's allocation and its atoms'
// bookings ([now, ∞)) in a savepoint; the exclusion constraint refusing
// an atom (23P01) rolls it back and answers errLostRace.
func bookInSavepoint(ctx context.Context, tx store.Tx, in Instance, poolID, nodeID string, vcpu, memoryMiB int64, atoms []string) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	err = book(ctx, sp, in, poolID, nodeID, vcpu, memoryMiB, atoms)
	if err != nil {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return rerr
		}
		var pg *pgconn.PgError
		if errors.As(err, &pg) && (pg.Code == "23P01" || pg.Code == "40P01") {
			return errLostRace
		}
		return err
	}
	return sp.Commit(ctx)
}

func book(ctx context.Context, tx store.Tx, in Instance, poolID, nodeID string, vcpu, memoryMiB int64, atoms []string) error {
	id, err := insertAllocation(ctx, tx, in, nodeID, vcpu, memoryMiB, atoms)
	if err != nil || len(atoms) == 0 {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
		SELECT $1, atom, $3, $4, $5, tstzrange(now(), NULL), 'instance' FROM unnest($2::text[]) AS atom`,
		nodeID, atoms, id, in.TenantID, poolID)
	return err
}

// insertAllocation inserts the instance's allocation (its scalars and the
// ids of its atoms, nothing booked) and answers its id.
func insertAllocation(ctx context.Context, tx store.Tx, in Instance, nodeID string, vcpu, memoryMiB int64, atoms []string) (string, error) {
	if atoms == nil {
		atoms = []string{}
	}
	id := core.NewID("alloc")
	_, err := tx.Exec(ctx, `INSERT INTO allocations (id, tenant_id, instance_id, node_id, atoms, vcpu, memory_mib)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, id, in.TenantID, in.ID, nodeID, atoms, vcpu, memoryMiB)
	return id, err
}

// release frees the instance's live allocation exactly once: its scalars
// (released_at) and its GPU bookings, cut at now (one not begun is
// deleted). A second call finds nothing live and changes nothing.
func release(ctx context.Context, tx store.Tx, instanceID string) (bool, error) {
	var allocID string
	err := tx.QueryRow(ctx, `UPDATE allocations SET released_at = now()
		WHERE instance_id = $1 AND released_at IS NULL RETURNING id`, instanceID).Scan(&allocID)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM device_bookings WHERE allocation_id = $1 AND lower(during) >= now()`, allocID); err != nil {
		return false, err
	}
	_, err = tx.Exec(ctx, `UPDATE device_bookings SET during = tstzrange(lower(during), now())
		WHERE allocation_id = $1 AND (upper_inf(during) OR upper(during) > now())`, allocID)
	return true, err
}

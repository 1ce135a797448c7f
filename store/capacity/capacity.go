// Package capacity is the capacity domain: what the inventory makes
// bookable, per pool and resource, over time, and whether a request would
// fit (capacity.preview; reservations place their requests with the same
// reads). It only reads: nodes, devices and bookings are other domains'.
package capacity

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
)

// Capacity: what the inventory makes bookable, per pool and resource.
//
//   - allocatable: bookable atoms of live devices on live, schedulable nodes
//     (schedulableSQL is core/nodes.Schedulable, clause by clause);
//   - allocated: those atoms with a booking covering now;
//   - reserved: those atoms booked only in the future;
//   - available = allocatable − allocated.
//
// A resource is an atom's class: "gpu" counts whole GPUs (one unit of the
// pool's gpuModel), "gpu.mig" and "gpu.slot" count MIG instances and
// slots, "node" counts whole nodes; "nic.vf" and "disk" appear when a pool
// has them. Bookings on atoms outside the allocatable set (a cordoned
// node's) are not counted, so available is never negative.
// Everything is counted by SQL aggregates.

// Resource is one resource's counts.
type Resource struct {
	Resource string `json:"resource"`
	// GPUModel is the pool's gpuModel, on gpu rows.
	GPUModel string `json:"gpuModel,omitempty"`
	// GPUProduct, on capacity.byPool's breakdown rows of GPU classes.
	GPUProduct  string `json:"gpuProduct,omitempty"`
	Allocatable int64  `json:"allocatable"`
	Allocated   int64  `json:"allocated"`
	Reserved    int64  `json:"reserved"`
	Available   int64  `json:"available"`
}

// PoolCapacity is one pool's capacity in a tenant's view.
type PoolCapacity struct {
	PoolID   string `json:"poolId"`
	TenantID string `json:"tenantId"` // the pool's owner
	Name     string `json:"name"`
	GPUModel string `json:"gpuModel"`
	Sharing  string `json:"sharing"`
	// Offered: the pool is offered to the viewing tenant, not its own;
	// Quota is then the offer's quota for that tenant.
	Offered   bool             `json:"offered"`
	Quota     map[string]int64 `json:"quota,omitempty"`
	Resources []Resource       `json:"resources"`
	// Breakdown (capacity.byPool only): per resource and gpuProduct.
	Breakdown []Resource `json:"breakdown,omitempty"`
	At        int64      `json:"at"` // epoch ms the counts are of
}

// Summary is capacity.summary's answer.
type Summary struct {
	TenantID string         `json:"tenantId"`
	At       int64          `json:"at"`
	Pools    []PoolCapacity `json:"pools"`
	// Totals sums the pools' resources (gpu rows per gpuModel).
	Totals []Resource `json:"totals"`
}

// schedulableSQL is core/nodes.Schedulable over the nodes row n (whose
// tenant_id is its pool's owner); TestCapacitySchedulableMatchesPredicate
// checks the two agree. "no reasons" is written as equality with the empty
// array, not cardinality() = 0: the planner estimates a column's equality
// from its statistics but guesses 0.5 % for a function's result, and that
// guess (2,000 nodes estimated as 10) made it probe devices node by node
// instead of hashing them once.
var schedulableSQL = fmt.Sprintf(`n.provision_state IN ('%s', '%s') AND n.role = '%s' AND NOT n.maintenance
	AND NOT n.cordoned AND n.connectivity = '%s' AND n.no_schedule_reasons = '{}' AND n.observed_generation >= 1
	AND (n.trust = '%s' OR (n.trust = '%s' AND n.owner_tenant_id <> '' AND n.owner_tenant_id = n.tenant_id))`,
	nodes.Adopted, nodes.Deployed, nodes.RoleHost, nodes.Connected, nodes.TrustPlatform, nodes.TrustTenantOwned)

// capacityPools is the tenant's view ($1): its own pools and those offered
// to it; one pool when $2 is set (archived included), else the live ones.
const capacityPools = `SELECT p.id FROM pools p LEFT JOIN pool_offers o ON o.pool_id = p.id AND o.tenant_id = $1
	WHERE (p.tenant_id = $1 OR o.tenant_id IS NOT NULL) AND (p.id = $2 OR ($2 = '' AND p.archived_at IS NULL))`

// atomsOf is the allocatable atoms of the pools of capacityPools, each with
// product, an expression over the device d: its gpuProduct, or empty when no
// breakdown is asked for, so the wide attributes stay out of the joins.
func atomsOf(product string) string {
	return `SELECT d.pool_id, d.class, d.node_id, d.device_id, ` + product + ` AS product
	FROM devices d JOIN nodes n ON n.id = d.node_id
	WHERE d.pool_id IN (SELECT id FROM ps) AND d.bookable AND d.removed_at IS NULL AND n.deleted_at IS NULL AND ` + schedulableSQL
}

// countsOf counts in one pass: the atoms, each joined with whether a
// booking of it covers now. Bookings overlapping [now, ∞) either cover now
// or start later, so an atom with bookings but none covering now is
// reserved; the exclusion constraint allows one booking per atom at now.
func countsOf(product string) string {
	return `WITH ps AS (` + capacityPools + `),
	atoms AS (` + atomsOf(product) + `),
	bk AS (SELECT device_node_id, device_id, bool_or(during @> now()) AS cur
		FROM device_bookings WHERE pool_id IN (SELECT id FROM ps) AND during && tstzrange(now(), NULL)
		GROUP BY device_node_id, device_id)
	SELECT a.pool_id, a.class, a.product, count(*), count(*) FILTER (WHERE bk.cur),
		count(*) FILTER (WHERE NOT bk.cur)
	FROM atoms a LEFT JOIN bk ON bk.device_node_id = a.node_id AND bk.device_id = a.device_id
	GROUP BY a.pool_id, a.class, a.product`
}

// The counts per pool and class, and per pool, class and gpuProduct.
var (
	capacityQuery  = countsOf(`''::text`)
	byProductQuery = countsOf(`coalesce(d.attributes->>'gpuProduct', '')`)
)

// Pools reads the pools of the tenant's view (one when poolID is set)
// with their counts, as of the transaction's now().
func Pools(ctx context.Context, tx store.Tx, tenantID, poolID string, byProduct bool) ([]PoolCapacity, int64, error) {
	var at time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&at); err != nil {
		return nil, 0, err
	}
	list, err := pools.InView(ctx, tx, tenantID, poolID)
	if err != nil {
		return nil, 0, err
	}
	out := make([]PoolCapacity, len(list))
	index := map[string]int{}
	for i, p := range list {
		out[i] = PoolCapacity{PoolID: p.ID, TenantID: p.TenantID, Name: p.Name, GPUModel: p.GPUModel, Sharing: p.Sharing,
			Offered: p.TenantID != tenantID, At: at.UnixMilli(),
			Resources: []Resource{{Resource: "gpu", GPUModel: p.GPUModel}, {Resource: "node"}}}
		if p.Offer != nil && out[i].Offered {
			out[i].Quota = p.Offer.Quota
		}
		index[p.ID] = i
	}
	if len(list) == 0 {
		return out, at.UnixMilli(), nil
	}
	query := capacityQuery
	if byProduct {
		query = byProductQuery
	}
	rows, err := tx.Query(ctx, query, tenantID, poolID)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var pool string
		var r Resource
		if err := rows.Scan(&pool, &r.Resource, &r.GPUProduct, &r.Allocatable, &r.Allocated, &r.Reserved); err != nil {
			return nil, 0, err
		}
		i, ok := index[pool]
		if !ok {
			continue
		}
		r.Available = r.Allocatable - r.Allocated
		if r.Resource == "gpu" {
			r.GPUModel = out[i].GPUModel
		}
		if byProduct {
			out[i].Breakdown = append(out[i].Breakdown, r)
		}
		r.GPUProduct = ""
		out[i].Resources = addResource(out[i].Resources, r)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	for i := range out {
		sortResources(out[i].Resources)
		sortResources(out[i].Breakdown)
	}
	return out, at.UnixMilli(), nil
}

// addResource adds r's counts to the row of its resource and gpuModel.
func addResource(rs []Resource, r Resource) []Resource {
	for i := range rs {
		if rs[i].Resource == r.Resource && rs[i].GPUModel == r.GPUModel && rs[i].GPUProduct == r.GPUProduct {
			rs[i].Allocatable += r.Allocatable
			rs[i].Allocated += r.Allocated
			rs[i].Reserved += r.Reserved
			rs[i].Available += r.Available
			return rs
		}
	}
	return append(rs, r)
}

func sortResources(rs []Resource) {
	slices.SortFunc(rs, func(a, b Resource) int {
		if a.Resource != b.Resource {
			if a.Resource < b.Resource {
				return -1
			}
			return 1
		}
		if a.GPUModel != b.GPUModel {
			if a.GPUModel < b.GPUModel {
				return -1
			}
			return 1
		}
		if a.GPUProduct < b.GPUProduct {
			return -1
		}
		if a.GPUProduct > b.GPUProduct {
			return 1
		}
		return 0
	})
}

// Summarize is the capacity of the pools of the tenant's view, and their
// totals.
func Summarize(ctx context.Context, tx store.Tx, tenantID string) (Summary, error) {
	list, at, err := Pools(ctx, tx, tenantID, "", false)
	if err != nil {
		return Summary{}, err
	}
	out := Summary{TenantID: tenantID, At: at, Pools: list, Totals: []Resource{}}
	for _, p := range list {
		for _, r := range p.Resources {
			out.Totals = addResource(out.Totals, r)
		}
	}
	sortResources(out.Totals)
	return out, nil
}

// OnePool is one pool of the tenant's view, or NOT_FOUND; byProduct adds
// its breakdown per gpuProduct (never nil then).
func OnePool(ctx context.Context, tx store.Tx, tenantID, poolID string, byProduct bool) (PoolCapacity, error) {
	list, _, err := Pools(ctx, tx, tenantID, poolID, byProduct)
	if err != nil {
		return PoolCapacity{}, err
	}
	if len(list) != 1 {
		return PoolCapacity{}, pools.NotFound(poolID)
	}
	p := list[0]
	if byProduct && p.Breakdown == nil {
		p.Breakdown = []Resource{}
	}
	return p, nil
}

// MaxTimelineBuckets bounds capacity.timeline's buckets.
const MaxTimelineBuckets = 500

// DefaultTimelineBuckets is capacity.timeline's bucket count when not given.
const DefaultTimelineBuckets = 48

// Timeline is capacity.timeline's answer: the pool's allocatable
// atoms now, and per bucket [start, end), per resource, the atoms booked
// at some instant of it, split into allocated (held by a reservation bound
// now, binding or releasing, or by a workload's own booking) and reserved
// (held for a reservation not bound yet), and the atoms available
// (allocatable less booked).
type Timeline struct {
	PoolID      string           `json:"poolId"`
	From        int64            `json:"from"`
	To          int64            `json:"to"`
	BucketMs    int64            `json:"bucketMs"`
	Allocatable map[string]int64 `json:"allocatable"`
	Buckets     []TimelineBucket `json:"buckets"`
}

// TimelineBucket is one bucket of a timeline.
type TimelineBucket struct {
	Start     int64            `json:"start"`
	End       int64            `json:"end"`
	Booked    map[string]int64 `json:"booked"`
	Allocated map[string]int64 `json:"allocated"`
	Reserved  map[string]int64 `json:"reserved"`
	Available map[string]int64 `json:"available"`
}

var timelineQuery = `WITH ps AS (` + capacityPools + `),
	atoms AS (` + atomsOf(`''::text`) + `),
	bu AS (SELECT i, tstzrange(timestamptz 'epoch' + ($3::bigint + i * $5::bigint) * interval '1 millisecond',
			timestamptz 'epoch' + LEAST($3::bigint + (i + 1) * $5::bigint, $4::bigint) * interval '1 millisecond') AS r
		FROM generate_series(0, $6::int - 1) AS i),
	bk AS (SELECT b.device_node_id, b.device_id, b.during,
			r.id IS NULL OR r.state IN ('binding', 'active', 'releasing') AS allocated
		FROM device_bookings b LEFT JOIN allocations al ON al.id = b.allocation_id
		LEFT JOIN reservations r ON r.id = al.reservation_id
		WHERE b.pool_id IN (SELECT id FROM ps) AND b.during && tstzrange(timestamptz 'epoch' + $3::bigint * interval '1 millisecond',
			timestamptz 'epoch' + $4::bigint * interval '1 millisecond'))
	SELECT -1, a.class, count(*), 0 FROM atoms a GROUP BY a.class
	UNION ALL
	SELECT bu.i, a.class, count(DISTINCT (a.node_id, a.device_id)),
		count(DISTINCT (a.node_id, a.device_id)) FILTER (WHERE bk.allocated)
	FROM bu JOIN bk ON bk.during && bu.r JOIN atoms a ON a.node_id = bk.device_node_id AND a.device_id = bk.device_id
	GROUP BY bu.i, a.class`

// TimelineOf is the pool's timeline over [from, to) in n buckets of equal
// width (no empty trailing buckets). to must be after from.
func TimelineOf(ctx context.Context, tx store.Tx, tenantID, poolID string, from, to int64, n int) (Timeline, error) {
	if to <= from {
		return Timeline{}, badField("to", "range", "to must be after from")
	}
	width := (to - from + int64(n) - 1) / int64(n)
	n = int((to - from + width - 1) / width)
	if _, err := pools.View(ctx, tx, tenantID, poolID); err != nil {
		return Timeline{}, err
	}
	out := Timeline{PoolID: poolID, From: from, To: to, BucketMs: width, Allocatable: map[string]int64{},
		Buckets: make([]TimelineBucket, n)}
	for i := range out.Buckets {
		out.Buckets[i] = TimelineBucket{Start: from + int64(i)*width, End: min(from+int64(i+1)*width, to), Booked: map[string]int64{},
			Allocated: map[string]int64{}, Reserved: map[string]int64{}, Available: map[string]int64{}}
	}
	rows, err := tx.Query(ctx, timelineQuery, tenantID, poolID, from, to, width, n)
	if err != nil {
		return Timeline{}, err
	}
	defer rows.Close()
	for rows.Next() {
		var i int
		var class string
		var booked, allocated int64
		if err := rows.Scan(&i, &class, &booked, &allocated); err != nil {
			return Timeline{}, err
		}
		switch {
		case i < 0:
			out.Allocatable[class] = booked
		case i < n:
			b := out.Buckets[i]
			b.Booked[class], b.Allocated[class], b.Reserved[class] = booked, allocated, booked-allocated
		default:
			return Timeline{}, core.Errorf(core.CodeInternal, "timeline bucket %d of %d", i, n)
		}
	}
	if err := rows.Err(); err != nil {
		return Timeline{}, err
	}
	// Available per resource the pool has: what no booking holds (never
	// below zero: a booking may outlive its atom's schedulability).
	for _, b := range out.Buckets {
		for class, total := range out.Allocatable {
			b.Available[class] = max(total-b.Booked[class], 0)
		}
	}
	return out, nil
}

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// capacity.preview: would a reservation's devices fit in a pool over
// [start, start+duration)? PreviewOf reads, in the call's read-only transaction,
// the pool's live nodes with the schedulability predicate (schedulableSQL)
// and, of the schedulable ones, the bookable atoms of the requested class
// free over the whole window, and runs core/placement on them. It books
// nothing. An atom is not free when a booking of it overlaps the window; a
// booking of a node's "node" atom (the whole machine) takes all its atoms,
// and a booking of any atom of a node takes its "node" atom.

// MaxPreviewDurationSeconds bounds capacity.preview's duration: one year.
const MaxPreviewDurationSeconds = 366 * 24 * 3600

// MaxPreviewStart is 9999-12-31T23:59:59.999Z, so start + duration never
// overflows and stays a timestamptz.
const MaxPreviewStart = 253402300799999

// Preview is capacity.preview's answer.
type Preview struct {
	PoolID   string             `json:"poolId"`
	Start    int64              `json:"start"` // epoch ms
	End      int64              `json:"end"`   // epoch ms, exclusive
	Devices  placement.Request  `json:"devices"`
	Fits     bool               `json:"fits"`
	Plan     placement.Plan     `json:"plan"`
	Reasons  []placement.Reason `json:"reasons"`
	Quota    *PreviewQuota      `json:"quota,omitempty"`
	Offered  bool               `json:"offered"`
	GPUModel string             `json:"gpuModel"`
}

// PreviewQuota is the viewing tenant's quota on an offered pool for the
// requested class: Limit (a resource missing from the offer's quota grants
// zero), InUse (the class's atoms the tenant has booked in the pool over
// the window), Requested, and Exceeds when InUse + Requested > Limit.
// Fits says only whether the devices can be placed; Exceeds says whether a
// reservation would also be over quota.
type PreviewQuota struct {
	Resource  string           `json:"resource"`
	Limit     int64            `json:"limit"`
	InUse     int64            `json:"inUse"`
	Requested int64            `json:"requested"`
	Exceeds   bool             `json:"exceeds"`
	All       map[string]int64 `json:"all"` // the offer's whole quota
}

// previewNodes is the pool's live nodes and whether each is schedulable.
var previewNodes = `SELECT n.id, (` + schedulableSQL + `) AS schedulable, n.trust
	FROM nodes n WHERE n.pool_id = $1 AND n.deleted_at IS NULL ORDER BY n.id`

// previewAtoms is the bookable atoms of class $2 on the pool's schedulable
// nodes that are free over [$3, $4) (epoch ms).
var previewAtoms = `WITH w AS (SELECT tstzrange(timestamptz 'epoch' + $3::bigint * interval '1 millisecond',
		timestamptz 'epoch' + $4::bigint * interval '1 millisecond') AS r)
	SELECT d.node_id, d.device_id, d.class, d.attributes
	FROM devices d JOIN nodes n ON n.id = d.node_id, w
	WHERE d.pool_id = $1 AND d.class = $2 AND d.bookable AND d.removed_at IS NULL AND n.pool_id = $1 AND n.deleted_at IS NULL
		AND ` + schedulableSQL + `
		AND NOT EXISTS (SELECT 1 FROM device_bookings b WHERE b.device_node_id = d.node_id AND b.device_id = d.device_id AND b.during && w.r
			AND NOT ($5 AND ` + spotBooking + `))
		AND NOT EXISTS (SELECT 1 FROM device_bookings b JOIN devices nd ON nd.node_id = b.device_node_id AND nd.device_id = b.device_id
			WHERE b.device_node_id = d.node_id AND b.during && w.r AND (d.class = 'node' OR nd.class = 'node')
			AND NOT ($5 AND ` + spotBooking + `))
	ORDER BY d.node_id, d.device_id`

// spotBooking holds for a booking b of a spot reservation.
const spotBooking = `EXISTS (SELECT 1 FROM allocations sa JOIN reservations sr ON sr.id = sa.reservation_id
	WHERE sa.id = b.allocation_id AND sr.spot)`

// bookedInPool is the atoms of class $3 tenant $1 has booked in pool $2
// over [$4, $5).
const bookedInPool = `SELECT count(DISTINCT (b.device_node_id, b.device_id)) FROM device_bookings b
	JOIN devices d ON d.node_id = b.device_node_id AND d.device_id = b.device_id
	WHERE b.tenant_id = $1 AND b.pool_id = $2 AND d.class = $3
		AND b.during && tstzrange(timestamptz 'epoch' + $4::bigint * interval '1 millisecond', timestamptz 'epoch' + $5::bigint * interval '1 millisecond')`

// Start is a request's start: start when given, else the transaction's
// now(), in epoch milliseconds.
func Start(ctx context.Context, tx store.Tx, start *int64) (int64, error) {
	if start != nil {
		return *start, nil
	}
	var now time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return 0, err
	}
	return now.UnixMilli(), nil
}

// BookedInPool is the atoms of class the tenant has booked in the pool
// over [from, to) (epoch ms).
func BookedInPool(ctx context.Context, tx store.Tx, tenantID, poolID, class string, from, to int64) (int64, error) {
	var n int64
	err := tx.QueryRow(ctx, bookedInPool, tenantID, poolID, class, from, to).Scan(&n)
	return n, err
}

// PreviewOf says whether the devices would fit in the pool of the
// tenant's view over [start, start + duration seconds) (start nil: now),
// and, on an offered pool, how the request stands against the quota.
func PreviewOf(ctx context.Context, tx store.Tx, tenantID, poolID string, devices placement.Request, start *int64, duration int64) (Preview, error) {
	req, verr := placement.Normalize(devices, "devices.")
	if verr != nil {
		return Preview{}, verr
	}
	pool, err := pools.View(ctx, tx, tenantID, poolID)
	if err != nil {
		return Preview{}, err
	}
	from, err := Start(ctx, tx, start)
	if err != nil {
		return Preview{}, err
	}
	end := from + duration*1000
	nodes, err := FreeNodes(ctx, tx, pool.ID, req.Class, from, end, false)
	if err != nil {
		return Preview{}, err
	}
	plan, reasons := placement.Place(req, nodes)
	out := Preview{PoolID: pool.ID, Start: from, End: end, Devices: req, Fits: len(reasons) == 0,
		Plan: plan, Reasons: reasons, Offered: pool.TenantID != tenantID, GPUModel: pool.GPUModel}
	if out.Plan.Allocations == nil {
		out.Plan.Allocations = []placement.Allocation{}
	}
	if out.Reasons == nil {
		out.Reasons = []placement.Reason{}
	}
	if out.Offered && pool.Offer != nil {
		q := &PreviewQuota{Resource: req.Class, Limit: pool.Offer.Quota[req.Class], Requested: int64(req.Count), All: pool.Offer.Quota}
		if q.All == nil {
			q.All = map[string]int64{}
		}
		if q.InUse, err = BookedInPool(ctx, tx, tenantID, pool.ID, req.Class, from, end); err != nil {
			return Preview{}, err
		}
		q.Exceeds = q.InUse+q.Requested > q.Limit
		out.Quota = q
	}
	return out, nil
}

// FreeNodes reads the pool's nodes with their atoms of class free over
// [start, end), for capacity.preview and reservations.create; with
// preemptSpot, atoms held only by spot reservations count as free. Both
// reads go in one round trip.
func FreeNodes(ctx context.Context, tx store.Tx, poolID, class string, start, end int64, preemptSpot bool) ([]placement.Node, error) {
	batch := &pgx.Batch{}
	batch.Queue(previewNodes, poolID)
	batch.Queue(previewAtoms, poolID, class, start, end, preemptSpot)
	results := tx.SendBatch(ctx, batch)
	defer results.Close()
	rows, err := results.Query()
	if err != nil {
		return nil, err
	}
	nodes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (placement.Node, error) {
		var n placement.Node
		return n, r.Scan(&n.ID, &n.Schedulable, &n.Trust)
	})
	if err != nil {
		return nil, err
	}
	index := make(map[string]int, len(nodes))
	for i, n := range nodes {
		index[n.ID] = i
	}
	if rows, err = results.Query(); err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var nodeID string
		var a placement.Atom
		if err := rows.Scan(&nodeID, &a.ID, &a.Class, &a.Attributes); err != nil {
			return nil, err
		}
		if i, ok := index[nodeID]; ok {
			nodes[i].Atoms = append(nodes[i].Atoms, a)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return nodes, results.Close()
}

package api

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
	pooldomain "github.com/better-compute/better-compute/store/pools"
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

// CapacityResource is one resource's counts.
type CapacityResource struct {
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
	Offered   bool               `json:"offered"`
	Quota     map[string]int64   `json:"quota,omitempty"`
	Resources []CapacityResource `json:"resources"`
	// Breakdown (capacity.byPool only): per resource and gpuProduct.
	Breakdown []CapacityResource `json:"breakdown,omitempty"`
	At        int64              `json:"at"` // epoch ms the counts are of
}

// CapacitySummary is capacity.summary's answer.
type CapacitySummary struct {
	TenantID string         `json:"tenantId"`
	At       int64          `json:"at"`
	Pools    []PoolCapacity `json:"pools"`
	// Totals sums the pools' resources (gpu rows per gpuModel).
	Totals []CapacityResource `json:"totals"`
}

// schedulableSQL is core/nodes.Schedulable over the nodes row n (whose
// tenant_id is its pool's owner); TestCapacitySchedulableMatchesPredicate
// checks the two agree.
var schedulableSQL = fmt.Sprintf(`n.provision_state IN ('%s', '%s') AND n.role = '%s' AND NOT n.maintenance
	AND NOT n.cordoned AND n.connectivity = '%s' AND cardinality(n.no_schedule_reasons) = 0 AND n.observed_generation >= 1
	AND (n.trust = '%s' OR (n.trust = '%s' AND n.owner_tenant_id <> '' AND n.owner_tenant_id = n.tenant_id))`,
	nodes.Adopted, nodes.Deployed, nodes.RoleHost, nodes.Connected, nodes.TrustPlatform, nodes.TrustTenantOwned)

// capacityPools is the tenant's view ($1): its own pools and those offered
// to it; one pool when $2 is set (archived included), else the live ones.
const capacityPools = `SELECT p.id FROM pools p LEFT JOIN pool_offers o ON o.pool_id = p.id AND o.tenant_id = $1
	WHERE (p.tenant_id = $1 OR o.tenant_id IS NOT NULL) AND (p.id = $2 OR ($2 = '' AND p.archived_at IS NULL))`

// capacityAtoms is the allocatable atoms of the pools of capacityPools.
var capacityAtoms = `SELECT d.pool_id, d.class, d.node_id, d.device_id,
		CASE WHEN $3 THEN coalesce(d.attributes->>'gpuProduct', '') ELSE '' END AS product
	FROM devices d JOIN nodes n ON n.id = d.node_id
	WHERE d.pool_id IN (SELECT id FROM ps) AND d.bookable AND d.removed_at IS NULL AND n.deleted_at IS NULL AND ` + schedulableSQL

var capacityQuery = `WITH ps AS (` + capacityPools + `),
	atoms AS (` + capacityAtoms + `),
	bk AS (SELECT device_node_id, device_id, bool_or(during @> now()) AS cur, bool_or(lower(during) > now()) AS fut
		FROM device_bookings WHERE pool_id IN (SELECT id FROM ps) AND during && tstzrange(now(), NULL)
		GROUP BY device_node_id, device_id)
	SELECT a.pool_id, a.class, a.product, count(*), count(*) FILTER (WHERE bk.cur),
		count(*) FILTER (WHERE bk.fut AND NOT bk.cur)
	FROM atoms a LEFT JOIN bk ON bk.device_node_id = a.node_id AND bk.device_id = a.device_id
	GROUP BY a.pool_id, a.class, a.product`

// capacity reads the pools of the tenant's view (one when poolID is set)
// with their counts, as of the transaction's now().
func (s *Server) capacity(ctx context.Context, tx store.Tx, tenantID, poolID string, byProduct bool) ([]PoolCapacity, int64, error) {
	var at time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&at); err != nil {
		return nil, 0, err
	}
	pools, err := pooldomain.InView(ctx, tx, tenantID, poolID)
	if err != nil {
		return nil, 0, err
	}
	out := make([]PoolCapacity, len(pools))
	index := map[string]int{}
	for i, p := range pools {
		out[i] = PoolCapacity{PoolID: p.ID, TenantID: p.TenantID, Name: p.Name, GPUModel: p.GPUModel, Sharing: p.Sharing,
			Offered: p.TenantID != tenantID, At: at.UnixMilli(),
			Resources: []CapacityResource{{Resource: "gpu", GPUModel: p.GPUModel}, {Resource: "node"}}}
		if p.Offer != nil && out[i].Offered {
			out[i].Quota = p.Offer.Quota
		}
		index[p.ID] = i
	}
	if len(pools) == 0 {
		return out, at.UnixMilli(), nil
	}
	rows, err := tx.Query(ctx, capacityQuery, tenantID, poolID, byProduct)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var pool string
		var r CapacityResource
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
func addResource(rs []CapacityResource, r CapacityResource) []CapacityResource {
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

func sortResources(rs []CapacityResource) {
	slices.SortFunc(rs, func(a, b CapacityResource) int {
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

func (s *Server) capacitySummary(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	pools, at, err := s.capacity(ctx, tx, c.TenantID, "", false)
	if err != nil {
		return nil, err
	}
	out := CapacitySummary{TenantID: c.TenantID, At: at, Pools: pools, Totals: []CapacityResource{}}
	for _, p := range pools {
		for _, r := range p.Resources {
			out.Totals = addResource(out.Totals, r)
		}
	}
	sortResources(out.Totals)
	return out, nil
}

// onePool answers one pool of the tenant's view, or NOT_FOUND.
func (s *Server) onePool(ctx context.Context, c *Call, tx store.Tx, byProduct bool) (PoolCapacity, error) {
	var in struct {
		PoolID string `json:"poolId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return PoolCapacity{}, err
	}
	pools, _, err := s.capacity(ctx, tx, c.TenantID, in.PoolID, byProduct)
	if err != nil {
		return PoolCapacity{}, err
	}
	if len(pools) != 1 {
		return PoolCapacity{}, pooldomain.NotFound(in.PoolID)
	}
	return pools[0], nil
}

func (s *Server) poolsCapacity(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	return s.onePool(ctx, c, tx, false)
}

func (s *Server) capacityByPool(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	p, err := s.onePool(ctx, c, tx, true)
	if err == nil && p.Breakdown == nil {
		p.Breakdown = []CapacityResource{}
	}
	return p, err
}

// MaxTimelineBuckets bounds capacity.timeline's buckets.
const MaxTimelineBuckets = 500

// DefaultTimelineBuckets is capacity.timeline's bucket count when not given.
const DefaultTimelineBuckets = 48

// CapacityTimeline is capacity.timeline's answer: the pool's allocatable
// atoms now, and per bucket [start, end) the atoms booked at some instant
// of it, per resource.
type CapacityTimeline struct {
	PoolID      string           `json:"poolId"`
	From        int64            `json:"from"`
	To          int64            `json:"to"`
	BucketMs    int64            `json:"bucketMs"`
	Allocatable map[string]int64 `json:"allocatable"`
	Buckets     []TimelineBucket `json:"buckets"`
}

// TimelineBucket is one bucket of a timeline.
type TimelineBucket struct {
	Start  int64            `json:"start"`
	End    int64            `json:"end"`
	Booked map[string]int64 `json:"booked"`
}

var timelineQuery = `WITH ps AS (` + capacityPools + `),
	atoms AS (` + capacityAtoms + `),
	bu AS (SELECT i, tstzrange(timestamptz 'epoch' + ($4::bigint + i * $6::bigint) * interval '1 millisecond',
			timestamptz 'epoch' + LEAST($4::bigint + (i + 1) * $6::bigint, $5::bigint) * interval '1 millisecond') AS r
		FROM generate_series(0, $7::int - 1) AS i),
	bk AS (SELECT device_node_id, device_id, during FROM device_bookings
		WHERE pool_id IN (SELECT id FROM ps) AND during && tstzrange(timestamptz 'epoch' + $4::bigint * interval '1 millisecond',
			timestamptz 'epoch' + $5::bigint * interval '1 millisecond'))
	SELECT -1, a.class, count(*) FROM atoms a GROUP BY a.class
	UNION ALL
	SELECT bu.i, a.class, count(DISTINCT (a.node_id, a.device_id))
	FROM bu JOIN bk ON bk.during && bu.r JOIN atoms a ON a.node_id = bk.device_node_id AND a.device_id = bk.device_id
	GROUP BY bu.i, a.class`

func (s *Server) capacityTimeline(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID  string `json:"poolId"`
		From    int64  `json:"from"`
		To      int64  `json:"to"`
		Buckets *int   `json:"buckets"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	n := DefaultTimelineBuckets
	if in.Buckets != nil {
		n = *in.Buckets
	}
	switch {
	case in.From < 0:
		return nil, badField("from", "range", "from must be epoch milliseconds, at least 0")
	case in.To <= in.From:
		return nil, badField("to", "range", "to must be after from")
	case n < 1 || n > MaxTimelineBuckets:
		return nil, badField("buckets", "range", "buckets must be in [1, %d]", MaxTimelineBuckets)
	}
	width := (in.To - in.From + int64(n) - 1) / int64(n)
	n = int((in.To - in.From + width - 1) / width) // no empty trailing buckets
	if _, err := pooldomain.View(ctx, tx, c.TenantID, in.PoolID); err != nil {
		return nil, err
	}
	out := CapacityTimeline{PoolID: in.PoolID, From: in.From, To: in.To, BucketMs: width, Allocatable: map[string]int64{},
		Buckets: make([]TimelineBucket, n)}
	for i := range out.Buckets {
		out.Buckets[i] = TimelineBucket{Start: in.From + int64(i)*width, End: min(in.From+int64(i+1)*width, in.To), Booked: map[string]int64{}}
	}
	rows, err := tx.Query(ctx, timelineQuery, c.TenantID, in.PoolID, false, in.From, in.To, width, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var i int
		var class string
		var count int64
		if err := rows.Scan(&i, &class, &count); err != nil {
			return nil, err
		}
		switch {
		case i < 0:
			out.Allocatable[class] = count
		case i < n:
			out.Buckets[i].Booked[class] = count
		default:
			return nil, core.Errorf(core.CodeInternal, "timeline bucket %d of %d", i, n)
		}
	}
	return out, rows.Err()
}

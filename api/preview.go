package api

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store"
	pooldomain "github.com/better-compute/better-compute/store/pools"
)

// capacity.preview: would a reservation's devices fit in a pool over
// [start, start+duration)? The handler reads, in its read-only transaction,
// the pool's live nodes with the schedulability predicate (schedulableSQL)
// and, of the schedulable ones, the bookable atoms of the requested class
// free over the whole window, and runs core/placement on them. It books
// nothing. An atom is not free when a booking of it overlaps the window; a
// booking of a node's "node" atom (the whole machine) takes all its atoms,
// and a booking of any atom of a node takes its "node" atom.

// MaxPreviewDurationSeconds bounds capacity.preview's duration: one year.
const MaxPreviewDurationSeconds = 366 * 24 * 3600

// maxPreviewStart is 9999-12-31T23:59:59.999Z, so start + duration never
// overflows and stays a timestamptz.
const maxPreviewStart = 253402300799999

// CapacityPreview is capacity.preview's answer.
type CapacityPreview struct {
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

// previewKeys are the keys devices may have (encoding/json matches names
// case-insensitively, so they are checked exactly).
var previewKeys = map[string]map[string]bool{
	"devices":          {"class": true, "count": true, "selector": true, "topology": true},
	"devices.selector": {"gpuModel": true, "gpuProduct": true, "minMemoryGiB": true, "migProfile": true},
	"devices.topology": {"type": true, "nodes": true, "perNode": true},
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

// previewInUse is the atoms of class $3 tenant $1 has booked in pool $2
// over [$4, $5).
const previewInUse = `SELECT count(DISTINCT (b.device_node_id, b.device_id)) FROM device_bookings b
	JOIN devices d ON d.node_id = b.device_node_id AND d.device_id = b.device_id
	WHERE b.tenant_id = $1 AND b.pool_id = $2 AND d.class = $3
		AND b.during && tstzrange(timestamptz 'epoch' + $4::bigint * interval '1 millisecond', timestamptz 'epoch' + $5::bigint * interval '1 millisecond')`

func (s *Server) capacityPreview(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID   string          `json:"poolId"`
		Devices  json.RawMessage `json:"devices"`
		Start    *int64          `json:"start"`
		Duration int64           `json:"duration"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if err := exactKeys(in.Devices, "devices", previewKeys); err != nil {
		return nil, err
	}
	var req placement.Request
	dec := json.NewDecoder(bytes.NewReader(in.Devices))
	if err := dec.Decode(&req); err != nil {
		return nil, core.Wrap(core.CodeInvalidInput, err, "devices does not match {class, count, selector, topology}").
			WithDetails(map[string]any{"field": "devices", "reason": "type"})
	}
	req, verr := placement.Normalize(req, "devices.")
	if verr != nil {
		return nil, verr
	}
	switch {
	case in.Start != nil && (*in.Start < 0 || *in.Start > maxPreviewStart):
		return nil, badField("start", "range", "start must be epoch milliseconds in [0, %d]", maxPreviewStart)
	case in.Duration <= 0 || in.Duration > MaxPreviewDurationSeconds:
		return nil, badField("duration", "range", "duration must be in [1, %d] seconds", MaxPreviewDurationSeconds)
	}
	pool, err := pooldomain.View(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return nil, err
	}
	start := int64(0)
	if in.Start != nil {
		start = *in.Start
	} else {
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return nil, err
		}
		start = now.UnixMilli()
	}
	end := start + in.Duration*1000

	nodes, err := freeNodes(ctx, tx, pool.ID, req.Class, start, end, false)
	if err != nil {
		return nil, err
	}

	plan, reasons := placement.Place(req, nodes)
	out := CapacityPreview{PoolID: pool.ID, Start: start, End: end, Devices: req, Fits: len(reasons) == 0,
		Plan: plan, Reasons: reasons, Offered: pool.TenantID != c.TenantID, GPUModel: pool.GPUModel}
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
		if err := tx.QueryRow(ctx, previewInUse, c.TenantID, pool.ID, req.Class, start, end).Scan(&q.InUse); err != nil {
			return nil, err
		}
		q.Exceeds = q.InUse+q.Requested > q.Limit
		out.Quota = q
	}
	return out, nil
}

// freeNodes reads the pool's nodes with their atoms of class free over
// [start, end), for capacity.preview and reservations.create; with
// preemptSpot, atoms held only by spot reservations count as free.
func freeNodes(ctx context.Context, tx store.Tx, poolID, class string, start, end int64, preemptSpot bool) ([]placement.Node, error) {
	rows, err := tx.Query(ctx, previewNodes, poolID)
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
	rows, err = tx.Query(ctx, previewAtoms, poolID, class, start, end, preemptSpot)
	if err != nil {
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
	return nodes, rows.Err()
}

package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/gpu"
	"github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
)

// InventorySnapshot is one stored NodeInventory v1 snapshot.
type InventorySnapshot struct {
	NodeID     string            `json:"nodeId"`
	Seq        int64             `json:"seq"`
	Document   json.RawMessage   `json:"document"`
	Hashes     map[string]string `json:"hashes"` // section → "sha256:<hex>"
	Digest     string            `json:"digest"`
	ReceivedAt int64             `json:"receivedAt"`
}

// InventoryHistoryEntry is one inventory.history item.
type InventoryHistoryEntry struct {
	Seq        int64  `json:"seq"`
	Digest     string `json:"digest"`
	ReceivedAt int64  `json:"receivedAt"`
}

// InventoryHistory is inventory.history's answer, newest first.
type InventoryHistory struct {
	NodeID     string                  `json:"nodeId"`
	Items      []InventoryHistoryEntry `json:"items"`
	NextCursor string                  `json:"nextCursor,omitempty"`
}

// InventoryDiffOutput is inventory.diff's answer: core/inventory.Diff from
// FromSeq to ToSeq.
type InventoryDiffOutput struct {
	NodeID  string `json:"nodeId"`
	FromSeq int64  `json:"fromSeq"`
	ToSeq   int64  `json:"toSeq"`
	inventory.InventoryDiff
}

// IngestResult is what Ingest did.
type IngestResult struct {
	NodeID string `json:"nodeId"`
	// Seq is the node's latest snapshot; Appended says whether this
	// document made it (its digest differed from the previous one).
	Seq         int64                 `json:"seq"`
	Appended    bool                  `json:"appended"`
	Digest      string                `json:"digest"`
	HardwareKey inventory.HardwareKey `json:"hardwareKey"`
	Devices     int                   `json:"devices"`
	Atoms       int                   `json:"atoms"`
	Conditions  []Condition           `json:"conditions"`
	Node        Node                  `json:"node"`
}

// inventoryConditions are the condition types ingestion owns: it raises
// and clears them; every other condition (liveness, health) is kept.
var inventoryConditions = []string{inventory.CondGpuModelUnknown, inventory.CondGpuCountMismatch,
	inventory.CondGpuModelMismatch, inventory.CondMigModeMismatch, inventory.CondMigLayoutPending,
	inventory.CondMigLayoutMismatch, inventory.CondMigLayoutInvalid}

// Ingest takes a node's NodeInventory v1 document, in the caller's
// transaction: it appends a snapshot when the digest changed, recomputes the
// hardware key, upserts the devices and atoms core/inventory.Devices yields
// under the pool's partition policy (marking vanished ones removed), sets the
// inventory's conditions and the noScheduleReasons of those that block
// scheduling, writes an event per change and the node's projection row.
// It runs even when the digest is unchanged, so a changed pool policy is
// applied by the next report.
func Ingest(ctx context.Context, tx store.Tx, t Types, nodeID string, doc []byte) (IngestResult, error) {
	inv, err := inventory.Parse(doc)
	if err != nil {
		return IngestResult{}, err
	}
	hashes, err := inventory.Hash(inv)
	if err != nil {
		return IngestResult{}, err
	}
	n, err := lockAny(ctx, tx, nodeID)
	if err != nil {
		return IngestResult{}, err
	}
	pool, err := pools.Get(ctx, tx, n.PoolID)
	if err != nil {
		return IngestResult{}, fmt.Errorf("node %s: pool %s: %w", n.ID, n.PoolID, err)
	}
	res := IngestResult{NodeID: n.ID, Digest: hashes.Digest}

	// The snapshot, when the hardware changed.
	var prevSeq int64
	var prevDoc []byte
	var prevDigest string
	err = tx.QueryRow(ctx, `SELECT seq, document, digest FROM node_inventories WHERE node_id = $1 ORDER BY seq DESC LIMIT 1`, n.ID).
		Scan(&prevSeq, &prevDoc, &prevDigest)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return IngestResult{}, err
	}
	res.Seq = prevSeq
	if prevDigest != hashes.Digest {
		res.Seq, res.Appended = prevSeq+1, true
		hashJSON, err := json.Marshal(hashes.Sections)
		if err != nil {
			return IngestResult{}, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO node_inventories (node_id, seq, document, hashes, digest) VALUES ($1, $2, $3, $4, $5)`,
			n.ID, res.Seq, string(doc), string(hashJSON), hashes.Digest); err != nil {
			return IngestResult{}, err
		}
		details := map[string]any{"seq": res.Seq, "digest": hashes.Digest}
		msg := "first inventory"
		if prevSeq > 0 {
			if old, err := inventory.Parse(prevDoc); err == nil {
				if d, err := inventory.Diff(old, inv); err == nil {
					details["changed"] = d.Changed
					msg = "inventory changed: " + strings.Join(d.Changed, ", ")
				}
			}
		}
		if err := AddEvent(ctx, tx, n.ID, EventInventory, msg, details); err != nil {
			return IngestResult{}, err
		}
	}

	// The hardware key.
	res.HardwareKey = inventory.ComputeHardwareKey(inv)
	if res.HardwareKey.Key != n.HardwareKey || res.HardwareKey.Trusted != n.HardwareKeyTrusted {
		if err := AddEvent(ctx, tx, n.ID, EventHardwareKey, "hardware key recomputed", map[string]any{
			"old": n.HardwareKey, "new": res.HardwareKey.Key, "trusted": res.HardwareKey.Trusted,
			"identifiers": res.HardwareKey.Identifiers}); err != nil {
			return IngestResult{}, err
		}
	}

	// Devices and atoms under the pool's partition policy.
	set, err := inventory.Devices(inv, partitionPolicy(pool, inv))
	if err != nil {
		return IngestResult{}, fmt.Errorf("node %s: devices under pool %s: %w", n.ID, pool.ID, err)
	}
	if err := syncDevices(ctx, tx, n, set); err != nil {
		return IngestResult{}, err
	}
	res.Devices, res.Atoms = len(set.Devices), len(set.Atoms())

	// Conditions and noScheduleReasons.
	conditions, reasons, err := mergeConditions(ctx, tx, n, set.Conditions)
	if err != nil {
		return IngestResult{}, err
	}
	res.Conditions = conditions
	condJSON, err := json.Marshal(conditions)
	if err != nil {
		return IngestResult{}, err
	}
	model, count := gpuSummary(inv, set)
	if _, err := tx.Exec(ctx, `UPDATE nodes SET conditions = $2, no_schedule_reasons = $3, hardware_key = $4,
		hardware_key_trusted = $5, gpu_model = $6, gpu_count = $7, updated_at = now() WHERE id = $1`,
		n.ID, string(condJSON), reasons, res.HardwareKey.Key, res.HardwareKey.Trusted, model, count); err != nil {
		return IngestResult{}, err
	}
	if res.Node, err = Get(ctx, tx, n.TenantID, n.ID, false); err != nil {
		return IngestResult{}, err
	}
	return res, PutAuthz(ctx, tx, t, res.Node)
}

// syncDevices upserts the set's devices and marks the node's other live
// devices removed; one DevicesChanged event says what came and went.
func syncDevices(ctx context.Context, tx store.Tx, n Node, set *inventory.DeviceSet) error {
	before, err := collectStrings(tx.Query(ctx, `SELECT device_id FROM devices WHERE node_id = $1 AND removed_at IS NULL`, n.ID))
	if err != nil {
		return err
	}
	ids := make([]string, len(set.Devices))
	batch := &pgx.Batch{}
	for i, d := range set.Devices {
		ids[i] = d.ID
		attrs, err := json.Marshal(d.Attributes)
		if err != nil {
			return err
		}
		batch.Queue(`INSERT INTO devices AS d (node_id, device_id, tenant_id, pool_id, class, parent, bookable, attributes)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			ON CONFLICT (node_id, device_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id, pool_id = EXCLUDED.pool_id,
				class = EXCLUDED.class, parent = EXCLUDED.parent, bookable = EXCLUDED.bookable, attributes = EXCLUDED.attributes,
				removed_at = NULL,
				updated_at = CASE WHEN (d.class, d.parent, d.bookable, d.attributes, d.pool_id, d.removed_at IS NULL)
					IS NOT DISTINCT FROM (EXCLUDED.class, EXCLUDED.parent, EXCLUDED.bookable, EXCLUDED.attributes, EXCLUDED.pool_id, true)
					THEN d.updated_at ELSE now() END`,
			n.ID, d.ID, n.TenantID, n.PoolID, d.Class, d.Parent, d.Bookable, string(attrs))
	}
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE devices SET removed_at = now(), updated_at = now()
		WHERE node_id = $1 AND removed_at IS NULL AND NOT (device_id = ANY ($2))`, n.ID, ids); err != nil {
		return err
	}
	added := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return slices.Contains(before, id) })
	removed := slices.DeleteFunc(before, func(id string) bool { return slices.Contains(ids, id) })
	slices.Sort(removed)
	if len(added) == 0 && len(removed) == 0 {
		return nil
	}
	return AddEvent(ctx, tx, n.ID, EventDevicesChanged,
		fmt.Sprintf("%d devices added, %d removed", len(added), len(removed)),
		map[string]any{"added": added, "removed": removed, "devices": len(set.Devices), "atoms": len(set.Atoms())})
}

// mergeConditions replaces the node's inventory-owned conditions with the
// set's, keeping the since of one still raised and every other condition;
// noScheduleReasons likewise keeps reasons ingestion does not own and adds
// the type of each raised condition that blocks scheduling.
func mergeConditions(ctx context.Context, tx store.Tx, n Node, raised []inventory.Condition) ([]Condition, []string, error) {
	now := time.Now().UnixMilli()
	key := func(typ, device string) string { return typ + "\x00" + device }
	old := map[string]Condition{}
	out := []Condition{}
	for _, c := range n.Conditions {
		if slices.Contains(inventoryConditions, c.Type) {
			old[key(c.Type, c.Device)] = c
		} else {
			out = append(out, c)
		}
	}
	reasons := slices.DeleteFunc(slices.Clone(n.NoScheduleReasons), func(r string) bool { return slices.Contains(inventoryConditions, r) })
	for _, c := range raised {
		nc := Condition{Type: c.Type, Status: "True", Reason: c.Reason, Message: c.Message, Since: now, Device: c.Device}
		k := key(c.Type, c.Device)
		if prev, ok := old[k]; ok {
			nc.Since = prev.Since
			delete(old, k)
		} else if err := AddEvent(ctx, tx, n.ID, EventConditionRaised, c.Type+": "+c.Message,
			map[string]any{"type": c.Type, "reason": c.Reason, "device": c.Device}); err != nil {
			return nil, nil, err
		}
		out = append(out, nc)
		if inventory.BlocksScheduling(c.Type) && !slices.Contains(reasons, c.Type) {
			reasons = append(reasons, c.Type)
		}
	}
	cleared := make([]Condition, 0, len(old))
	for _, c := range old {
		cleared = append(cleared, c)
	}
	slices.SortFunc(cleared, func(a, b Condition) int { return strings.Compare(a.Type+a.Device, b.Type+b.Device) })
	for _, c := range cleared {
		if err := AddEvent(ctx, tx, n.ID, EventConditionClear, c.Type+" cleared",
			map[string]any{"type": c.Type, "device": c.Device}); err != nil {
			return nil, nil, err
		}
	}
	slices.Sort(reasons)
	return out, reasons, nil
}

// gpuSummary is the node's GPU family (one, "mixed", or "" with no GPU)
// and count, for its projection row.
func gpuSummary(inv *inventory.NodeInventory, set *inventory.DeviceSet) (string, int) {
	var models []string
	for _, d := range set.Devices {
		if m, ok := d.Attributes["gpuModel"].(string); ok && d.Class == inventory.ClassGPU && !slices.Contains(models, m) {
			models = append(models, m)
		}
	}
	switch len(models) {
	case 0:
		return "", len(inv.GPUs.Devices)
	case 1:
		return models[0], len(inv.GPUs.Devices)
	}
	return "mixed", len(inv.GPUs.Devices)
}

// hardwareProfilePattern is the grammar of policy.hardwareProfile that
// ingestion checks: "<gpuCount>x<gpuModel>", such as "8xH100". Any other
// profile name is not checked against the inventory.
var hardwareProfilePattern = regexp.MustCompile(`^([0-9]{1,3})x([A-Z][A-Z0-9]{1,15})$`)

// partitionPolicy maps a pool's sharing and policy onto core/inventory's
// partition policy:
//   - timeslice and mps: policy.sharing.replicas slots per GPU (1 when the
//     policy gives none; mps at most inventory.MaxMPSReplicas);
//   - mig: policy.migLayout, either "all-<profile>" (the profile's maximum
//     instances) or a comma list of "<profile>" and "<n>x<profile>"
//     (e.g. "3g.20gb,2g.10gb,2x1g.5gb"), expanded for the node's GPU
//     product; a missing or unreadable layout yields MigLayoutInvalid;
//   - hardwareProfile "<n>x<MODEL>": GpuCountMismatch and GpuModelMismatch.
func partitionPolicy(p pools.Pool, inv *inventory.NodeInventory) inventory.PartitionPolicy {
	pp := inventory.PartitionPolicy{Sharing: p.Sharing}
	switch p.Sharing {
	case inventory.SharingTimeslice, inventory.SharingMPS:
		pp.Replicas = 1
		if p.Policy.Sharing != nil {
			pp.Replicas = p.Policy.Sharing.Replicas
		}
		if p.Sharing == inventory.SharingMPS {
			pp.Replicas = min(pp.Replicas, inventory.MaxMPSReplicas)
		}
		pp.Replicas = min(max(pp.Replicas, 1), inventory.MaxTimesliceReplicas)
	case inventory.SharingMIG:
		product := ""
		if len(inv.GPUs.Devices) > 0 {
			product = gpu.Default().Normalize(inv.GPUs.Devices[0].Name).Product
		}
		pp.MigLayout = parseMigLayout(p.Policy.MigLayout, product)
	}
	if m := hardwareProfilePattern.FindStringSubmatch(p.Policy.HardwareProfile); m != nil {
		count, _ := strconv.Atoi(m[1])
		pp.Profile = &inventory.HardwareProfile{GPUCount: count, GPUModel: m[2]}
	}
	return pp
}

// parseMigLayout reads a pool's migLayout for a GPU product. A layout it
// cannot read becomes one that names no real profile, so Devices raises
// MigLayoutInvalid on every GPU instead of serving them unpartitioned.
func parseMigLayout(s, product string) gpu.MigLayout {
	invalid := gpu.MigLayout{"invalid:" + s: 1}
	if s == "" {
		return invalid
	}
	if name, ok := strings.CutPrefix(s, "all-"); ok {
		prof, found := gpu.Default().MigProfile(product, name)
		if !found {
			return gpu.MigLayout{name: 1} // Expand names the missing profile
		}
		return gpu.MigLayout{name: prof.MaxInstances}
	}
	out := gpu.MigLayout{}
	for _, part := range strings.Split(s, ",") {
		n, name := 1, part
		if count, rest, ok := strings.Cut(part, "x"); ok {
			if v, err := strconv.Atoi(count); err == nil {
				n, name = v, rest
			}
		}
		if name == "" || n < 1 {
			return invalid
		}
		out[name] += n
	}
	return out
}

// latestSnapshot reads the node's newest snapshot, or the one at seq.
func latestSnapshot(ctx context.Context, tx store.Tx, nodeID string, seq int64) (InventorySnapshot, error) {
	snap := InventorySnapshot{NodeID: nodeID}
	var doc, hashes []byte
	var received time.Time
	err := tx.QueryRow(ctx, `SELECT seq, document, hashes, digest, received_at FROM node_inventories
		WHERE node_id = $1 AND ($2 = 0 OR seq = $2) ORDER BY seq DESC LIMIT 1`, nodeID, seq).
		Scan(&snap.Seq, &doc, &hashes, &snap.Digest, &received)
	if errors.Is(err, pgx.ErrNoRows) {
		if seq != 0 {
			return snap, core.Errorf(core.CodeNotFound, "node %s has no inventory snapshot %d", nodeID, seq)
		}
		return snap, core.Errorf(core.CodeNotFound, "node %s has no inventory yet", nodeID)
	}
	if err != nil {
		return snap, err
	}
	snap.Document, snap.ReceivedAt = doc, received.UnixMilli()
	return snap, json.Unmarshal(hashes, &snap.Hashes)
}

// Snapshot reads the tenant's live node's newest snapshot, or the one at
// seq when seq is not 0.
func Snapshot(ctx context.Context, tx store.Tx, tenantID, nodeID string, seq int64) (InventorySnapshot, error) {
	if _, err := Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return InventorySnapshot{}, err
	}
	return latestSnapshot(ctx, tx, nodeID, seq)
}

// History lists the snapshots of the tenant's live node, newest first (by
// seq): the page's rows below its key's Seq, plus one; the caller cuts the
// page.
func History(ctx context.Context, tx store.Tx, tenantID, nodeID string, page store.PageQuery) (InventoryHistory, error) {
	if _, err := Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return InventoryHistory{}, err
	}
	rows, err := tx.Query(ctx, `SELECT seq, digest, received_at FROM node_inventories
		WHERE node_id = $1 AND ($2 OR seq < $3) ORDER BY seq DESC LIMIT $4`, nodeID, page.First(), page.AfterKey().Seq, page.Fetch())
	if err != nil {
		return InventoryHistory{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InventoryHistoryEntry, error) {
		var e InventoryHistoryEntry
		var at time.Time
		err := r.Scan(&e.Seq, &e.Digest, &at)
		e.ReceivedAt = at.UnixMilli()
		return e, err
	})
	if err != nil {
		return InventoryHistory{}, err
	}
	return InventoryHistory{NodeID: nodeID, Items: items}, nil
}

// Diff diffs two snapshots of the tenant's live node: fromSeq and toSeq,
// by default the last two (toSeq alone: it and the one before it). 0 is
// "not given".
func Diff(ctx context.Context, tx store.Tx, tenantID, nodeID string, from, to int64) (InventoryDiffOutput, error) {
	if from != 0 && to != 0 && from >= to {
		return InventoryDiffOutput{}, badField("fromSeq", "range", "fromSeq must be before toSeq")
	}
	if _, err := Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return InventoryDiffOutput{}, err
	}
	newer, err := latestSnapshot(ctx, tx, nodeID, to)
	if err != nil {
		return InventoryDiffOutput{}, err
	}
	if from == 0 {
		if newer.Seq < 2 {
			return InventoryDiffOutput{}, core.Errorf(core.CodeInvalidState, "node %s has one inventory snapshot; a diff needs two", nodeID)
		}
		from = newer.Seq - 1
	}
	if from >= newer.Seq {
		return InventoryDiffOutput{}, badField("fromSeq", "range", "fromSeq must be before the latest snapshot %d", newer.Seq)
	}
	older, err := latestSnapshot(ctx, tx, nodeID, from)
	if err != nil {
		return InventoryDiffOutput{}, err
	}
	a, err := inventory.Parse(older.Document)
	if err != nil {
		return InventoryDiffOutput{}, err
	}
	b, err := inventory.Parse(newer.Document)
	if err != nil {
		return InventoryDiffOutput{}, err
	}
	d, err := inventory.Diff(a, b)
	if err != nil {
		return InventoryDiffOutput{}, err
	}
	return InventoryDiffOutput{NodeID: nodeID, FromSeq: older.Seq, ToSeq: newer.Seq, InventoryDiff: *d}, nil
}

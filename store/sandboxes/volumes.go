package sandboxes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/capacity"
	"github.com/better-compute/better-compute/store/instances"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
)

// Volumes (docs/sandboxes.md, "Volumes"): a tenant's persistent disk on
// one host of a vps-host pool, chosen at its create, that templates mount
// into their sandboxes. Each change (create, resize, delete) bumps the
// host's NodeSpec generation and records it in spec_generation; the
// change reads as done once the host observed that generation.

// VolumeResourceType is the catalog type a volume is decided on.
const VolumeResourceType = coresandboxes.VolumeResourceType

// Volume is a sandbox volume as the API answers it.
type Volume struct {
	ID              string `json:"id"`
	TenantID        string `json:"tenantId"`
	OwnerIdentityID string `json:"ownerIdentityId"`
	PoolID          string `json:"poolId"`
	// NodeID is the one host it lives on: sandboxes mounting it run there.
	NodeID  string `json:"nodeId,omitempty"`
	SizeGiB int    `json:"sizeGiB"`
	// State is core/sandboxes.VolumeState.
	State     string          `json:"state"`
	Failure   json.RawMessage `json:"failure,omitempty"`
	CreatedAt int64           `json:"createdAt" unit:"epoch-ms"`
	UpdatedAt int64           `json:"updatedAt" unit:"epoch-ms"`
	DeletedAt int64           `json:"deletedAt,omitempty" unit:"epoch-ms"`
}

// TemplateVolume is a volume a template mounts into its sandboxes.
type TemplateVolume struct {
	VolumeID  string `json:"volumeId"`
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
}

// VolumeTypes are the catalog's full names a volume's authorization row
// names.
type VolumeTypes struct{ Volume, Pool string }

type volumeRow struct {
	Volume
	stored string
}

var volumeColumns = `v.id, v.tenant_id, v.owner_identity_id, v.pool_id, COALESCE(v.node_id, ''), v.size_gib, v.state,
	COALESCE(n.observed_generation >= v.spec_generation, false), v.failure,
	` + ms("v.created_at") + `, ` + ms("v.updated_at") + `, COALESCE(` + ms("v.deleted_at") + `, 0)`

const volumeFrom = ` FROM sandbox_volumes v LEFT JOIN nodes n ON n.id = v.node_id`

func scanVolume(r pgx.Row) (volumeRow, error) {
	var v volumeRow
	var observed bool
	var failure []byte
	err := r.Scan(&v.ID, &v.TenantID, &v.OwnerIdentityID, &v.PoolID, &v.NodeID, &v.SizeGiB, &v.stored, &observed, &failure,
		&v.CreatedAt, &v.UpdatedAt, &v.DeletedAt)
	if failure != nil {
		v.Failure = failure
	}
	v.State = string(coresandboxes.AnsweredVolume(v.stored, observed))
	return v, err
}

func volumeNotFound(id string) error {
	return core.Errorf(core.CodeNotFound, "sandbox volume %s not found", id)
}

// loadVolume reads the tenant's volume (locked when lock is set); a draft
// or a denied one is NOT_FOUND.
func loadVolume(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (volumeRow, error) {
	q := `SELECT ` + volumeColumns + volumeFrom + ` WHERE v.id = $1 AND v.tenant_id = $2`
	if lock {
		q += ` FOR UPDATE OF v`
	}
	v, err := scanVolume(tx.QueryRow(ctx, q, id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return volumeRow{}, volumeNotFound(id)
	}
	return v, err
}

// GetVolume reads one of the tenant's volumes.
func GetVolume(ctx context.Context, tx store.Tx, tenantID, id string) (Volume, error) {
	v, err := loadVolume(ctx, tx, tenantID, id, false)
	if err == nil && (v.stored == coresandboxes.VolumeDraft || v.stored == coresandboxes.VolumeDenied) {
		return Volume{}, volumeNotFound(id)
	}
	return v.Volume, err
}

// DraftVolume writes the draft volume draftID and its authorization row,
// which sandboxVolumes.create is decided on: parent the pool, owner the
// caller, attribute sizeGiB. The pool must be a live vps-host pool the
// tenant may see.
func DraftVolume(ctx context.Context, tx store.Tx, types VolumeTypes, tenantID, draftID, ownerID, poolID string, sizeGiB int) (store.AuthzResource, error) {
	pool, err := pools.View(ctx, tx, tenantID, poolID)
	if err != nil {
		return store.AuthzResource{}, err
	}
	if pool.ArchivedAt != nil {
		return store.AuthzResource{}, core.Errorf(core.CodeInvalidState, "pool %s is archived", pool.ID).
			WithDetails(map[string]any{"field": "poolId", "reason": "archived"})
	}
	if pool.Class != instances.ClassVPSHost {
		return store.AuthzResource{}, badField("poolId", "class", "pool %s is a %s pool; sandbox volumes live on vps-host pools", pool.ID, pool.Class)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO sandbox_volumes (id, tenant_id, owner_identity_id, pool_id, size_gib, state)
		VALUES ($1, $2, $3, $4, $5, 'draft')`, draftID, tenantID, ownerID, pool.ID, sizeGiB); err != nil {
		return store.AuthzResource{}, err
	}
	r := store.AuthzResource{Type: types.Volume, ID: draftID, TenantID: tenantID, OwnerID: ownerID,
		ParentType: types.Pool, ParentID: pool.ID, Attributes: map[string]any{"sizeGiB": sizeGiB}}
	return r, store.PutAuthzResource(ctx, tx, r)
}

// CompleteVolume places the admitted draft on one schedulable node of its
// pool, the one holding the fewest GiB of volumes (ties by the volume's
// seed), and bumps that node's NodeSpec generation: draft -> creating. No
// schedulable node is INVALID_STATE reason noCapacity (final: FailVolume).
// A replay answers the volume as it is, or its refusal.
func CompleteVolume(ctx context.Context, tx store.Tx, tenantID, id string) (Volume, error) {
	v, err := loadVolume(ctx, tx, tenantID, id, true)
	if err != nil {
		return Volume{}, err
	}
	if v.stored == coresandboxes.VolumeFailed && v.Failure != nil {
		return Volume{}, failureError(v.Failure)
	}
	if v.stored != coresandboxes.VolumeDraft {
		return v.Volume, nil
	}
	nodeID, err := volumeHost(ctx, tx, v.PoolID, id)
	if err != nil {
		return Volume{}, err
	}
	if err := changeOnNode(ctx, tx, id, nodeID, `node_id = $2, state = 'creating'`); err != nil {
		return Volume{}, err
	}
	if err := publishVolume(ctx, tx, v.Volume, "sandboxVolume.created", map[string]any{"nodeId": nodeID, "sizeGiB": v.SizeGiB}); err != nil {
		return Volume{}, err
	}
	return GetVolume(ctx, tx, tenantID, id)
}

// volumeHost chooses the node of the pool a new volume lives on.
func volumeHost(ctx context.Context, tx store.Tx, poolID, id string) (string, error) {
	now, err := capacity.Start(ctx, tx, nil)
	if err != nil {
		return "", err
	}
	candidates, err := capacity.FreeNodes(ctx, tx, poolID, placement.ClassGPU, now, now+1, false)
	if err != nil {
		return "", err
	}
	used := map[string]int64{}
	rows, err := tx.Query(ctx, `SELECT node_id, sum(size_gib) FROM sandbox_volumes
		WHERE pool_id = $1 AND state IN ('creating', 'resizing', 'ready') GROUP BY node_id`, poolID)
	if err != nil {
		return "", err
	}
	var node string
	var gib int64
	if _, err := pgx.ForEachRow(rows, []any{&node, &gib}, func() error { used[node] = gib; return nil }); err != nil {
		return "", err
	}
	best, bestKey := "", uint64(0)
	for _, n := range candidates {
		if !n.Schedulable {
			continue
		}
		key := placement.Seed(fmt.Sprint(id, n.ID))
		if best == "" || used[n.ID] < used[best] || (used[n.ID] == used[best] && key < bestKey) {
			best, bestKey = n.ID, key
		}
	}
	if best == "" {
		return "", core.Errorf(core.CodeInvalidState, "pool %s has no schedulable node to keep the volume", poolID).
			WithDetails(map[string]any{"reason": "noCapacity", "volumeId": id})
	}
	return best, nil
}

// changeOnNode applies set ($2 is the node, args from $3) to the volume's
// row and bumps its node's NodeSpec generation, recording it as the
// change's.
func changeOnNode(ctx context.Context, tx store.Tx, id, nodeID, set string, args ...any) error {
	if err := nodes.BumpGeneration(ctx, tx, nodeID); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE sandbox_volumes SET `+set+`, updated_at = now(),
			spec_generation = (SELECT generation FROM nodes WHERE id = $2)
		WHERE id = $1`, append([]any{id, nodeID}, args...)...)
	return err
}

func publishVolume(ctx context.Context, tx store.Tx, v Volume, typ string, data map[string]any) error {
	return store.PublishEvent(ctx, tx, store.Event{TenantID: v.TenantID, Type: typ, ResourceType: VolumeResourceType,
		ResourceID: v.ID, Data: data})
}

// DenyVolume records a denial on the draft: draft -> denied.
func DenyVolume(ctx context.Context, tx store.Tx, tenantID, id string) error {
	_, err := tx.Exec(ctx, `UPDATE sandbox_volumes SET state = 'denied', updated_at = now()
		WHERE id = $1 AND tenant_id = $2 AND state = 'draft'`, id, tenantID)
	return err
}

// FailVolume records CompleteVolume's final refusal (no schedulable node):
// draft -> failed with the error a replay answers; any other cause
// changes nothing.
func FailVolume(ctx context.Context, tx store.Tx, tenantID, id string, cause error) error {
	ce := core.AsError(cause)
	if !(ce.Code == core.CodeInvalidState && ce.Details["reason"] == "noCapacity") {
		return nil
	}
	failure, err := json.Marshal(map[string]any{"code": ce.Code, "message": ce.Message, "details": ce.Details})
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE sandbox_volumes SET state = 'failed', failure = $3, updated_at = now()
		WHERE id = $1 AND tenant_id = $2 AND state = 'draft'`, id, tenantID, failure)
	return err
}

// ListVolumes reads the tenant's live volumes (owned by owner when it is
// set) the projection holds a row for, newest first (a page after its
// key, plus one).
func ListVolumes(ctx context.Context, tx store.Tx, typ, tenantID, owner string, page store.PageQuery) ([]Volume, error) {
	created := ms("v.created_at")
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+volumeColumns+volumeFrom+`
		WHERE v.tenant_id = $1 AND v.state IN ('creating', 'resizing', 'ready') AND ($7 = '' OR v.owner_identity_id = $7)
			AND `+store.VisibleIn("v.id", "$1", "$2", false)+`
			AND ($4 OR (`+created+`, v.id) < ($5, $6))
		ORDER BY `+created+` DESC, v.id DESC LIMIT $3`, tenantID, typ, page.Fetch(), page.First(), after.At, after.ID, owner)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Volume, error) {
		v, err := scanVolume(r)
		return v.Volume, err
	})
}

func liveVolume(v volumeRow) error {
	switch v.stored {
	case coresandboxes.VolumeDraft, coresandboxes.VolumeDenied:
		return volumeNotFound(v.ID)
	case coresandboxes.VolumeCreating, coresandboxes.VolumeResizing, coresandboxes.VolumeReady:
		return nil
	}
	return core.Errorf(core.CodeInvalidState, "sandbox volume %s is %s", v.ID, v.State).
		WithDetails(map[string]any{"reason": "state", "state": v.State})
}

// ResizeVolume grows the tenant's volume to sizeGiB (its host grows the
// disk in place, mounted or not) and its authorization row's sizeGiB
// with it; the decision saw the new size as pending. A smaller size is
// INVALID_INPUT (field sizeGiB, reason shrink); the same size changes
// nothing.
func ResizeVolume(ctx context.Context, tx store.Tx, types VolumeTypes, tenantID, id string, sizeGiB int) (Volume, error) {
	v, err := loadVolume(ctx, tx, tenantID, id, true)
	if err != nil {
		return Volume{}, err
	}
	if err := liveVolume(v); err != nil {
		return Volume{}, err
	}
	switch {
	case sizeGiB < v.SizeGiB:
		return Volume{}, core.Errorf(core.CodeInvalidInput, "sizeGiB %d is below volume %s's %d GiB; a volume only grows", sizeGiB, id, v.SizeGiB).
			WithDetails(map[string]any{"field": "sizeGiB", "reason": "shrink", "sizeGiB": v.SizeGiB})
	case sizeGiB == v.SizeGiB:
		return v.Volume, nil
	}
	if err := changeOnNode(ctx, tx, id, v.NodeID, `size_gib = $3, state = 'resizing'`, sizeGiB); err != nil {
		return Volume{}, err
	}
	if err := store.PutAuthzResource(ctx, tx, store.AuthzResource{Type: types.Volume, ID: id, TenantID: tenantID, OwnerID: v.OwnerIdentityID,
		ParentType: types.Pool, ParentID: v.PoolID, Attributes: map[string]any{"sizeGiB": sizeGiB}}); err != nil {
		return Volume{}, err
	}
	if err := publishVolume(ctx, tx, v.Volume, "sandboxVolume.resized", map[string]any{"from": v.SizeGiB, "to": sizeGiB}); err != nil {
		return Volume{}, err
	}
	return GetVolume(ctx, tx, tenantID, id)
}

// DeleteVolume deletes the tenant's volume: its host removes the disk,
// and its authorization row goes. A volume a live template names, or a
// live workload (a sandbox's or a warm one) mounts, is INVALID_STATE
// reason inUse. Deleting one being deleted answers it unchanged.
func DeleteVolume(ctx context.Context, tx store.Tx, typ, tenantID, id string) (Volume, error) {
	v, err := loadVolume(ctx, tx, tenantID, id, true)
	if err != nil {
		return Volume{}, err
	}
	if v.stored == coresandboxes.VolumeDeleting {
		return v.Volume, nil
	}
	if err := liveVolume(v); err != nil {
		return Volume{}, err
	}
	var templates, workloads int
	if err := tx.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM sandbox_template_volumes tv JOIN sandbox_templates t ON t.id = tv.template_id
				WHERE tv.volume_id = $1 AND t.deleted_at IS NULL),
			(SELECT count(*) FROM instances i WHERE i.node_id = $2 AND i.state <> 'deleted'
				AND i.mounts @> jsonb_build_array(jsonb_build_object('volumeId', $1::text)))`, id, v.NodeID).
		Scan(&templates, &workloads); err != nil {
		return Volume{}, err
	}
	if templates > 0 || workloads > 0 {
		return Volume{}, core.Errorf(core.CodeInvalidState, "sandbox volume %s is mounted by %d live templates and %d live workloads", id, templates, workloads).
			WithDetails(map[string]any{"reason": "inUse", "templates": templates, "workloads": workloads})
	}
	if err := changeOnNode(ctx, tx, id, v.NodeID, `state = 'deleting', deleted_at = now()`); err != nil {
		return Volume{}, err
	}
	if err := store.DeleteAuthzResource(ctx, tx, typ, id); err != nil {
		return Volume{}, err
	}
	if err := publishVolume(ctx, tx, v.Volume, "sandboxVolume.deleted", nil); err != nil {
		return Volume{}, err
	}
	return GetVolume(ctx, tx, tenantID, id)
}

// checkVolumes checks a template's volumes (runtime and pool its own):
// distinct live volumes of the tenant in the pool, all on one host, each
// at a distinct mount path the runtime allows, and a container runtime
// (INVALID_INPUT field volumes, with a reason). The volumes are locked
// (FOR SHARE) to the commit, so a concurrent delete waits and then sees
// the template.
func checkVolumes(ctx context.Context, tx store.Tx, tenantID, poolID string, runtime coresandboxes.Runtime, mounts []TemplateVolume) error {
	if len(mounts) == 0 {
		return nil
	}
	if runtime == coresandboxes.RuntimeVM {
		return badField("volumes", "runtime", "volumes are mounted into container runtimes only (gvisor, runc), not vm")
	}
	ids := make([]string, len(mounts))
	paths := map[string]bool{}
	for i, m := range mounts {
		if reason := coresandboxes.MountPathRefused(m.MountPath); reason != "" {
			return badField("volumes", "mountPath", "mountPath %q of volume %s may not be mounted on (%s): an absolute, clean path, not / and not under /proc, /sys or /dev",
				m.MountPath, m.VolumeID, reason)
		}
		if paths[m.MountPath] {
			return badField("volumes", "duplicateMountPath", "mountPath %q is named twice", m.MountPath)
		}
		paths[m.MountPath] = true
		ids[i] = m.VolumeID
	}
	rows, err := tx.Query(ctx, `SELECT id, pool_id, node_id FROM sandbox_volumes
		WHERE id = ANY($1) AND tenant_id = $2 AND state IN ('creating', 'resizing', 'ready') ORDER BY id FOR SHARE`, ids, tenantID)
	if err != nil {
		return err
	}
	type found struct{ pool, node string }
	have := map[string]found{}
	var id string
	var f found
	if _, err := pgx.ForEachRow(rows, []any{&id, &f.pool, &f.node}, func() error { have[id] = f; return nil }); err != nil {
		return err
	}
	host := ""
	seen := map[string]bool{}
	for _, m := range mounts {
		v, ok := have[m.VolumeID]
		switch {
		case seen[m.VolumeID]:
			return badField("volumes", "duplicateVolume", "volume %s is named twice", m.VolumeID)
		case !ok:
			return volumeNotFound(m.VolumeID)
		case v.pool != poolID:
			return badField("volumes", "pool", "volume %s is in pool %s, not the template's pool %s", m.VolumeID, v.pool, poolID)
		case host != "" && v.node != host:
			return badField("volumes", "hosts", "volume %s lives on node %s and another of the template's on node %s; a sandbox runs on one host, so all of a template's volumes must live on one", m.VolumeID, v.node, host)
		}
		seen[m.VolumeID], host = true, v.node
	}
	return nil
}

// putTemplateVolumes replaces the template's volumes.
func putTemplateVolumes(ctx context.Context, tx store.Tx, templateID string, mounts []TemplateVolume) error {
	if _, err := tx.Exec(ctx, `DELETE FROM sandbox_template_volumes WHERE template_id = $1`, templateID); err != nil {
		return err
	}
	for i, m := range mounts {
		if _, err := tx.Exec(ctx, `INSERT INTO sandbox_template_volumes (template_id, volume_id, ord, mount_path, read_only)
			VALUES ($1, $2, $3, $4, $5)`, templateID, m.VolumeID, i, m.MountPath, m.ReadOnly); err != nil {
			return err
		}
	}
	return nil
}

// templateVolumesColumn reads a template's volumes (in `t`) as one JSON
// array.
const templateVolumesColumn = `COALESCE((SELECT jsonb_agg(jsonb_build_object('volumeId', tv.volume_id, 'mountPath', tv.mount_path,
	'readOnly', tv.read_only) ORDER BY tv.ord) FROM sandbox_template_volumes tv WHERE tv.template_id = t.id), '[]'::jsonb)`

// workloadMounts is where a template's workloads run and what they
// mount: the host of its volumes ("" when it names none, any node) and
// its volumes as the NodeSpec hands them to the runtime.
func workloadMounts(ctx context.Context, tx store.Tx, t Template) (string, []nodespec.Mount, error) {
	if len(t.Volumes) == 0 {
		return "", nil, nil
	}
	var host string
	if err := tx.QueryRow(ctx, `SELECT node_id FROM sandbox_volumes WHERE id = $1`, t.Volumes[0].VolumeID).Scan(&host); err != nil {
		return "", nil, err
	}
	mounts := make([]nodespec.Mount, len(t.Volumes))
	for i, m := range t.Volumes {
		mounts[i] = nodespec.Mount{VolumeID: m.VolumeID, Path: m.MountPath, ReadOnly: m.ReadOnly}
	}
	return host, mounts, nil
}

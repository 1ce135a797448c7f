package sandboxes

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/images"
	"github.com/better-compute/better-compute/store/nodes"
)

// SnapshotResourceType is the catalog type a snapshot is decided on.
const SnapshotResourceType = coresandboxes.SnapshotResourceType

// SnapshotTimeout bounds how long a snapshot may stay creating: past it
// (a node that never answers) it fails, and a sandbox waiting on it to end
// goes on ending.
const SnapshotTimeout = 5 * time.Minute

// Snapshot is a sandbox snapshot as the API answers it.
type Snapshot struct {
	ID              string `json:"id"`
	TenantID        string `json:"tenantId"`
	OwnerIdentityID string `json:"ownerIdentityId"`
	SandboxID       string `json:"sandboxId"`
	TemplateID      string `json:"templateId"`
	Runtime         string `json:"runtime"`
	IncludeMemory   bool   `json:"includeMemory"`
	// Reason is requested (sandboxes.snapshot) or ttl (the template's
	// ttlAction).
	Reason    string `json:"reason"`
	State     string `json:"state"`
	SHA256    string `json:"sha256,omitempty"`
	SizeBytes int64  `json:"sizeBytes,omitempty"`
	Failure   string `json:"failure,omitempty"`
	CreatedAt int64  `json:"createdAt" unit:"epoch-ms"`
	ReadyAt   int64  `json:"readyAt,omitempty" unit:"epoch-ms"`
	UpdatedAt int64  `json:"updatedAt" unit:"epoch-ms"`
}

// Snapshot states.
const (
	SnapshotCreating = "creating"
	SnapshotReady    = "ready"
	SnapshotFailed   = "failed"
	SnapshotDeleted  = "deleted"
)

var snapshotColumns = `id, tenant_id, owner_identity_id, sandbox_id, template_id, runtime, include_memory, reason, state,
	COALESCE(sha256, ''), COALESCE(size_bytes, 0), failure, ` + ms("created_at") + `, COALESCE(` + ms("ready_at") + `, 0), ` + ms("updated_at")

func scanSnapshot(r pgx.Row) (Snapshot, error) {
	var s Snapshot
	err := r.Scan(&s.ID, &s.TenantID, &s.OwnerIdentityID, &s.SandboxID, &s.TemplateID, &s.Runtime, &s.IncludeMemory, &s.Reason,
		&s.State, &s.SHA256, &s.SizeBytes, &s.Failure, &s.CreatedAt, &s.ReadyAt, &s.UpdatedAt)
	return s, err
}

func snapshotNotFound(id string) error {
	return core.Errorf(core.CodeNotFound, "sandbox snapshot %s not found", id)
}

// GetSnapshot reads one of the tenant's snapshots that is not deleted.
func GetSnapshot(ctx context.Context, tx store.Tx, tenantID, id string) (Snapshot, error) {
	s, err := scanSnapshot(tx.QueryRow(ctx, `SELECT `+snapshotColumns+` FROM sandbox_snapshots
		WHERE id = $1 AND tenant_id = $2 AND state <> 'deleted'`, id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Snapshot{}, snapshotNotFound(id)
	}
	return s, err
}

// SnapshotFilter narrows ListSnapshots; "" keeps every value.
type SnapshotFilter struct{ SandboxID string }

// ListSnapshots reads the tenant's snapshots that are not deleted and
// that the projection holds a row for (typ: the snapshot type's full
// name), newest first.
func ListSnapshots(ctx context.Context, tx store.Tx, typ, tenantID string, f SnapshotFilter, page store.PageQuery) ([]Snapshot, error) {
	created := ms("created_at")
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+snapshotColumns+` FROM sandbox_snapshots
		WHERE tenant_id = $1 AND state <> 'deleted' AND ($3 = '' OR sandbox_id = $3)
			AND `+store.VisibleIn("id", "$1", "$2", false)+`
			AND ($5 OR (`+created+`, id) < ($6, $7))
		ORDER BY `+created+` DESC, id DESC LIMIT $4`,
		tenantID, typ, f.SandboxID, page.Fetch(), page.First(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Snapshot, error) { return scanSnapshot(r) })
}

// TakeSnapshot asks the node running the tenant's sandbox for a snapshot
// (sandboxes.snapshot): the sandbox must be live and its workload running
// (ExecTarget's conditions); includeMemory needs the gvisor runtime, and
// a vm sandbox has no snapshots yet (INVALID_STATE reason runtime). One
// snapshot is taken at a time (INVALID_STATE reason snapshotting). id is
// the snapshot's: a retry with the same id answers it.
func TakeSnapshot(ctx context.Context, tx store.Tx, typ, tenantID, sandboxID, id string, includeMemory bool) (Snapshot, error) {
	if s, err := GetSnapshot(ctx, tx, tenantID, id); err == nil {
		if s.SandboxID != sandboxID || s.IncludeMemory != includeMemory {
			return Snapshot{}, core.Errorf(core.CodeConflict, "idempotencyKey was used with another request").
				WithDetails(map[string]any{"field": "idempotencyKey"})
		}
		return s, nil
	}
	s, err := load(ctx, tx, tenantID, sandboxID, true)
	if err != nil {
		return Snapshot{}, err
	}
	if err := runnable(s); err != nil {
		return Snapshot{}, err
	}
	return takeSnapshot(ctx, tx, typ, s, id, includeMemory, "requested")
}

// takeSnapshot writes the creating snapshot of s's running workload and
// its authorization row (owner the sandbox's owner), and moves the node's
// spec generation so its agent takes it.
func takeSnapshot(ctx context.Context, tx store.Tx, typ string, s row, id string, includeMemory bool, reason string) (Snapshot, error) {
	switch {
	case s.Runtime == string(coresandboxes.RuntimeVM):
		return Snapshot{}, core.Errorf(core.CodeInvalidState, "sandbox %s runs in a vm; only gvisor and runc sandboxes have snapshots", s.ID).
			WithDetails(map[string]any{"reason": "runtime", "runtime": s.Runtime})
	case includeMemory && s.Runtime != string(coresandboxes.RuntimeGVisor):
		return Snapshot{}, core.Errorf(core.CodeInvalidInput, "a memory snapshot needs the gvisor runtime; sandbox %s runs %s", s.ID, s.Runtime).
			WithDetails(map[string]any{"field": "includeMemory", "reason": "runtime", "runtime": s.Runtime})
	}
	busy, err := snapshotting(ctx, tx, s.ID)
	if err != nil {
		return Snapshot{}, err
	}
	if busy {
		return Snapshot{}, core.Errorf(core.CodeInvalidState, "sandbox %s is taking a snapshot; retry once it is ready", s.ID).
			WithDetails(map[string]any{"reason": "snapshotting"})
	}
	if _, err := tx.Exec(ctx, `INSERT INTO sandbox_snapshots (id, tenant_id, owner_identity_id, sandbox_id, template_id, instance_id,
			node_id, runtime, image_id, include_memory, reason, state)
		SELECT $1, $2, $3, $4, $5, $6, $7, t.runtime, t.image_id, $8, $9, 'creating' FROM sandbox_templates t WHERE t.id = $5`,
		id, s.TenantID, s.OwnerIdentityID, s.ID, s.TemplateID, s.InstanceID, s.NodeID, includeMemory, reason); err != nil {
		return Snapshot{}, err
	}
	if err := store.PutAuthzResource(ctx, tx, store.AuthzResource{Type: typ, ID: id, TenantID: s.TenantID, OwnerID: s.OwnerIdentityID,
		Attributes: map[string]any{"sandboxId": s.ID, "templateId": s.TemplateID, "includeMemory": includeMemory}}); err != nil {
		return Snapshot{}, err
	}
	if err := nodes.BumpGeneration(ctx, tx, s.NodeID); err != nil {
		return Snapshot{}, err
	}
	if err := publish(ctx, tx, s.Sandbox, "sandbox.snapshot.started", map[string]any{"snapshotId": id, "includeMemory": includeMemory,
		"reason": reason}); err != nil {
		return Snapshot{}, err
	}
	return GetSnapshot(ctx, tx, s.TenantID, id)
}

// snapshotting says whether a snapshot of the sandbox is being taken.
func snapshotting(ctx context.Context, tx store.Tx, sandboxID string) (bool, error) {
	var busy bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sandbox_snapshots WHERE sandbox_id = $1 AND state = 'creating')`, sandboxID).
		Scan(&busy)
	return busy, err
}

// SnapshotTarget is a creating snapshot as its node uploads it.
type SnapshotTarget struct{ TenantID, SandboxID, State, SHA256 string }

// SnapshotOnNode reads snapshot id taken by nodeID (any state), or
// NOT_FOUND: a node learns nothing of another node's snapshots.
func SnapshotOnNode(ctx context.Context, db store.DBTX, nodeID, id string) (SnapshotTarget, error) {
	var t SnapshotTarget
	err := db.QueryRow(ctx, `SELECT tenant_id, sandbox_id, state, COALESCE(sha256, '') FROM sandbox_snapshots
		WHERE id = $1 AND node_id = $2`, id, nodeID).Scan(&t.TenantID, &t.SandboxID, &t.State, &t.SHA256)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, snapshotNotFound(id)
	}
	return t, err
}

// SnapshotUploaded records that nodeID's upload of creating snapshot id
// is in the blob store (sha256, size): creating -> ready, and the node's
// spec no longer asks for it. An upload of a ready one with the same
// digest is a retry and changes nothing; anything else is INVALID_STATE.
func SnapshotUploaded(ctx context.Context, tx store.Tx, nodeID, id, sha256 string, size int64) (SnapshotTarget, error) {
	t, err := lockOnNode(ctx, tx, nodeID, id)
	if err != nil {
		return t, err
	}
	switch {
	case t.State == SnapshotReady && t.SHA256 == sha256:
		return t, nil
	case t.State != SnapshotCreating:
		return t, core.Errorf(core.CodeInvalidState, "sandbox snapshot %s is %s", id, t.State)
	}
	if _, err := tx.Exec(ctx, `UPDATE sandbox_snapshots SET state = 'ready', sha256 = $2, size_bytes = $3, ready_at = now(),
		updated_at = now() WHERE id = $1`, id, sha256, size); err != nil {
		return t, err
	}
	return t, snapshotEnded(ctx, tx, nodeID, t, id, "sandbox.snapshot.ready", map[string]any{"snapshotId": id, "sizeBytes": size})
}

// SnapshotFailedOnNode records that nodeID could not take creating
// snapshot id: creating -> failed with reason.
func SnapshotFailedOnNode(ctx context.Context, tx store.Tx, nodeID, id, reason string) (SnapshotTarget, error) {
	t, err := lockOnNode(ctx, tx, nodeID, id)
	if err != nil || t.State != SnapshotCreating {
		return t, err
	}
	return t, failSnapshot(ctx, tx, nodeID, t, id, reason)
}

func lockOnNode(ctx context.Context, tx store.Tx, nodeID, id string) (SnapshotTarget, error) {
	var t SnapshotTarget
	err := tx.QueryRow(ctx, `SELECT tenant_id, sandbox_id, state, COALESCE(sha256, '') FROM sandbox_snapshots
		WHERE id = $1 AND node_id = $2 FOR UPDATE`, id, nodeID).Scan(&t.TenantID, &t.SandboxID, &t.State, &t.SHA256)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, snapshotNotFound(id)
	}
	return t, err
}

func failSnapshot(ctx context.Context, tx store.Tx, nodeID string, t SnapshotTarget, id, reason string) error {
	if _, err := tx.Exec(ctx, `UPDATE sandbox_snapshots SET state = 'failed', failure = $2, updated_at = now() WHERE id = $1`,
		id, reason); err != nil {
		return err
	}
	return snapshotEnded(ctx, tx, nodeID, t, id, "sandbox.snapshot.failed", map[string]any{"snapshotId": id, "failure": reason})
}

// snapshotEnded publishes the end of a snapshot and drops it from its
// node's spec.
func snapshotEnded(ctx context.Context, tx store.Tx, nodeID string, t SnapshotTarget, id, typ string, data map[string]any) error {
	if err := nodes.BumpGeneration(ctx, tx, nodeID); err != nil {
		return err
	}
	return store.PublishEvent(ctx, tx, store.Event{TenantID: t.TenantID, Type: typ, ResourceType: SnapshotResourceType,
		ResourceID: id, Data: data})
}

// expireSnapshots fails sandboxID's creating snapshots older than
// SnapshotTimeout, or all of them when its workload is gone; it answers
// whether any is still creating.
func expireSnapshots(ctx context.Context, tx store.Tx, sandboxID string, workloadGone bool) (bool, error) {
	rows, err := tx.Query(ctx, `SELECT id, tenant_id, node_id, created_at < now() - $2::bigint * interval '1 millisecond'
		FROM sandbox_snapshots WHERE sandbox_id = $1 AND state = 'creating' FOR UPDATE`, sandboxID, SnapshotTimeout.Milliseconds())
	if err != nil {
		return false, err
	}
	type creating struct {
		id, tenantID, nodeID string
		late                 bool
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (creating, error) {
		var c creating
		return c, r.Scan(&c.id, &c.tenantID, &c.nodeID, &c.late)
	})
	if err != nil {
		return false, err
	}
	pending := false
	for _, c := range list {
		switch {
		case workloadGone:
			err = failSnapshot(ctx, tx, c.nodeID, SnapshotTarget{TenantID: c.tenantID, SandboxID: sandboxID}, c.id,
				"the sandbox's workload went away before the snapshot was taken")
		case c.late:
			err = failSnapshot(ctx, tx, c.nodeID, SnapshotTarget{TenantID: c.tenantID, SandboxID: sandboxID}, c.id,
				"the node did not deliver the snapshot within "+SnapshotTimeout.String())
		default:
			pending = true
		}
		if err != nil {
			return false, err
		}
	}
	return pending, nil
}

// DeleteSnapshot deletes the tenant's snapshot (its row kept, its
// authorization row and, after the commit, its bytes removed: see
// UnremovedBlobs). A creating snapshot, or one a live sandbox's workload
// is restored from, is INVALID_STATE (reason creating, inUse).
func DeleteSnapshot(ctx context.Context, tx store.Tx, typ, tenantID, id string) (Snapshot, error) {
	s, err := scanSnapshot(tx.QueryRow(ctx, `SELECT `+snapshotColumns+` FROM sandbox_snapshots
		WHERE id = $1 AND tenant_id = $2 AND state <> 'deleted' FOR UPDATE`, id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Snapshot{}, snapshotNotFound(id)
	}
	if err != nil {
		return Snapshot{}, err
	}
	if s.State == SnapshotCreating {
		return Snapshot{}, core.Errorf(core.CodeInvalidState, "sandbox snapshot %s is still being taken", id).
			WithDetails(map[string]any{"reason": "creating"})
	}
	var inUse bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM instances WHERE restore_snapshot_id = $1 AND state <> 'deleted')`, id).
		Scan(&inUse); err != nil {
		return Snapshot{}, err
	}
	if inUse {
		return Snapshot{}, core.Errorf(core.CodeInvalidState, "sandbox snapshot %s is what a live sandbox was restored from", id).
			WithDetails(map[string]any{"reason": "inUse"})
	}
	if _, err := tx.Exec(ctx, `UPDATE sandbox_snapshots SET state = 'deleted', deleted_at = now(), updated_at = now() WHERE id = $1`, id); err != nil {
		return Snapshot{}, err
	}
	if err := store.DeleteAuthzResource(ctx, tx, typ, id); err != nil {
		return Snapshot{}, err
	}
	if err := store.PublishEvent(ctx, tx, store.Event{TenantID: tenantID, Type: "sandbox.snapshot.deleted",
		ResourceType: SnapshotResourceType, ResourceID: id}); err != nil {
		return Snapshot{}, err
	}
	s.State = SnapshotDeleted
	return s, nil
}

// restoreSource checks that the tenant's snapshot id can be restored into
// a sandbox of template t: ready, taken of a sandbox of t (field
// fromSnapshot, reason template), of t's runtime (reason runtimeChanged),
// and t's image still available (reason imageGone): a restore that cannot
// run is refused before anything starts.
func restoreSource(ctx context.Context, tx store.Tx, tenantID, id string, t Template) error {
	s, err := GetSnapshot(ctx, tx, tenantID, id)
	if err != nil {
		return err
	}
	bad := func(reason, format string, args ...any) error {
		return core.Errorf(core.CodeInvalidState, format, args...).WithDetails(map[string]any{"field": "fromSnapshot", "reason": reason})
	}
	switch {
	case s.State != SnapshotReady:
		return bad("state", "sandbox snapshot %s is %s", id, s.State)
	case s.TemplateID != t.ID:
		return core.Errorf(core.CodeInvalidInput, "sandbox snapshot %s was taken of a sandbox of template %s, not %s", id, s.TemplateID, t.ID).
			WithDetails(map[string]any{"field": "templateId", "reason": "snapshotTemplate", "snapshotTemplateId": s.TemplateID})
	case s.Runtime != t.Runtime:
		return bad("runtimeChanged", "sandbox snapshot %s was taken under %s; template %s now runs %s", id, s.Runtime, t.ID, t.Runtime)
	}
	im, err := images.Get(ctx, tx, tenantID, t.ImageID)
	if err != nil || im.State != coreimages.StateAvailable {
		return bad("imageGone", "template %s's image %s is gone", t.ID, t.ImageID)
	}
	return nil
}

// Blob is a snapshot's bytes in the blob store.
type Blob struct{ SnapshotID, TenantID, SHA256 string }

// UnremovedBlobs lists up to limit deleted or failed snapshots whose bytes
// are still kept and that no other kept snapshot or image of the tenant
// shares (the blob store is content-addressed per tenant).
func UnremovedBlobs(ctx context.Context, db store.DBTX, limit int) ([]Blob, error) {
	rows, err := db.Query(ctx, `SELECT s.id, s.tenant_id, s.sha256 FROM sandbox_snapshots s
		WHERE s.state IN ('deleted', 'failed') AND NOT s.blob_removed AND s.sha256 IS NOT NULL
			AND NOT EXISTS (SELECT 1 FROM sandbox_snapshots o WHERE o.tenant_id = s.tenant_id AND o.sha256 = s.sha256 AND o.state = 'ready')
			AND NOT EXISTS (SELECT 1 FROM images i WHERE i.tenant_id = s.tenant_id AND i.sha256 = s.sha256)
		ORDER BY s.id LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Blob, error) {
		var b Blob
		return b, r.Scan(&b.SnapshotID, &b.TenantID, &b.SHA256)
	})
}

// BlobRemoved records that a snapshot's bytes were removed.
func BlobRemoved(ctx context.Context, db store.DBTX, snapshotID string) error {
	_, err := db.Exec(ctx, `UPDATE sandbox_snapshots SET blob_removed = true WHERE id = $1`, snapshotID)
	return err
}

// RestoreBlob answers the blob of the snapshot a live workload placed on
// nodeID is restored from, or NOT_FOUND (the one answer a node gets for
// a snapshot it may not read).
func RestoreBlob(ctx context.Context, db store.DBTX, nodeID, id string) (Blob, int64, error) {
	var b Blob
	var size int64
	err := db.QueryRow(ctx, `SELECT s.id, s.tenant_id, s.sha256, s.size_bytes FROM sandbox_snapshots s
		WHERE s.id = $1 AND s.state = 'ready' AND EXISTS (SELECT 1 FROM instances i
			WHERE i.restore_snapshot_id = s.id AND i.node_id = $2 AND i.state NOT IN ('draft', 'denied', 'deleted'))`,
		id, nodeID).Scan(&b.SnapshotID, &b.TenantID, &b.SHA256, &size)
	if errors.Is(err, pgx.ErrNoRows) {
		return b, 0, snapshotNotFound(id)
	}
	return b, size, err
}

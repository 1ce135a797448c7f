package sandboxes

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	instancestates "github.com/better-compute/better-compute/core/instances"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/instances"
)

// ResourceType is the catalog type a sandbox is decided on.
const ResourceType = coresandboxes.ResourceType

// Sandbox is a sandbox as the API answers it.
type Sandbox struct {
	ID              string `json:"id"`
	TenantID        string `json:"tenantId"`
	OwnerIdentityID string `json:"ownerIdentityId"`
	TemplateID      string `json:"templateId"`
	PoolID          string `json:"poolId"`
	// State is the sandbox's (core/sandboxes.State): a live sandbox is
	// named by its workload's state.
	State      string `json:"state"`
	InstanceID string `json:"instanceId,omitempty"`
	NodeID     string `json:"nodeId,omitempty"`
	Address    string `json:"address,omitempty"`
	Runtime    string `json:"runtime"`
	VCPU       int    `json:"vcpu"`
	MemoryMiB  int64  `json:"memoryMiB"`
	GPUs       int    `json:"gpus"`
	TTLSeconds int    `json:"ttlSeconds"`
	// ExpiresAt is the deadline: set when the sandbox is admitted, moved
	// only by sandboxes.extend.
	ExpiresAt      int64           `json:"expiresAt,omitempty" unit:"epoch-ms"`
	EndReason      string          `json:"endReason,omitempty"`
	FromSnapshotID string          `json:"fromSnapshotId,omitempty"`
	Failure        json.RawMessage `json:"failure,omitempty"`
	WorkflowID     string          `json:"workflowId,omitempty"`
	CreatedAt      int64           `json:"createdAt" unit:"epoch-ms"`
	UpdatedAt      int64           `json:"updatedAt" unit:"epoch-ms"`
	EndedAt        int64           `json:"endedAt,omitempty" unit:"epoch-ms"`
}

// row is a sandbox row with its workload's columns, as read.
type row struct {
	Sandbox
	stored, instanceState, observedState, desiredState string
	// nodeLost: the workload's node is lost or deleted (its host is gone).
	nodeLost                       bool
	observedGeneration, generation int64
}

var sandboxColumns = `s.id, s.tenant_id, s.owner_identity_id, s.template_id, t.pool_id, s.state, COALESCE(i.state, ''),
	COALESCE(i.observed_state, ''), COALESCE(i.observed_generation, 0), COALESCE(i.generation, 0), COALESCE(i.desired_state, ''),
	COALESCE(s.instance_id, ''), COALESCE(i.node_id, ''), COALESCE(i.address, ''), t.runtime, f.vcpu, f.memory_mib, f.gpus,
	s.ttl_seconds, COALESCE(` + ms("s.expires_at") + `, 0), s.end_reason, COALESCE(s.from_snapshot_id, ''), s.failure,
	COALESCE(n.connectivity = 'lost' OR n.deleted_at IS NOT NULL, false),
	` + ms("s.created_at") + `, ` + ms("s.updated_at") + `, COALESCE(` + ms("s.ended_at") + `, 0)`

const sandboxFrom = ` FROM sandboxes s JOIN sandbox_templates t ON t.id = s.template_id JOIN flavors f ON f.id = t.flavor_id
	LEFT JOIN instances i ON i.id = s.instance_id LEFT JOIN nodes n ON n.id = i.node_id`

func scanSandbox(r pgx.Row) (row, error) {
	var s row
	var failure []byte
	err := r.Scan(&s.ID, &s.TenantID, &s.OwnerIdentityID, &s.TemplateID, &s.PoolID, &s.stored, &s.instanceState,
		&s.observedState, &s.observedGeneration, &s.generation, &s.desiredState,
		&s.InstanceID, &s.NodeID, &s.Address, &s.Runtime, &s.VCPU, &s.MemoryMiB, &s.GPUs,
		&s.TTLSeconds, &s.ExpiresAt, &s.EndReason, &s.FromSnapshotID, &failure, &s.nodeLost, &s.CreatedAt, &s.UpdatedAt, &s.EndedAt)
	if failure != nil {
		s.Failure = failure
	}
	s.State = string(coresandboxes.Answered(s.stored, s.instanceState))
	if s.stored == coresandboxes.StoredLive || s.stored == coresandboxes.StoredDeleting || s.stored == coresandboxes.StoredDeleted {
		s.WorkflowID = s.ID
	}
	return s, err
}

func notFound(id string) error { return core.Errorf(core.CodeNotFound, "sandbox %s not found", id) }

// load reads one of the tenant's sandboxes, drafts and denials included;
// lock locks the sandbox row.
func load(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (row, error) {
	q := `SELECT ` + sandboxColumns + sandboxFrom + ` WHERE s.id = $1 AND s.tenant_id = $2`
	if lock {
		q += ` FOR UPDATE OF s`
	}
	s, err := scanSandbox(tx.QueryRow(ctx, q, id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return row{}, notFound(id)
	}
	return s, err
}

// Load reads one of the tenant's admitted sandboxes (a draft or a denied
// one is NOT_FOUND, as another tenant's).
func Load(ctx context.Context, tx store.Tx, tenantID, id string) (Sandbox, error) {
	s, err := load(ctx, tx, tenantID, id, false)
	if err == nil && (s.stored == coresandboxes.StoredDraft || s.stored == coresandboxes.StoredDenied) {
		return Sandbox{}, notFound(id)
	}
	return s.Sandbox, err
}

// QueueLoad queues Load's read in b (store.Read).
func QueueLoad(b *store.Batch, tenantID, id string) func() (Sandbox, error) {
	return store.QueueRow(b, func(r pgx.Row) (Sandbox, error) {
		s, err := scanSandbox(r)
		if errors.Is(err, pgx.ErrNoRows) {
			return Sandbox{}, notFound(id)
		}
		return s.Sandbox, err
	}, `SELECT `+sandboxColumns+sandboxFrom+` WHERE s.id = $1 AND s.tenant_id = $2 AND s.state NOT IN ('draft', 'denied')`, id, tenantID)
}

// Filter narrows a list; "" keeps every value.
type Filter struct {
	Owner, TemplateID string
	// Ended lists ended sandboxes (deleted, failed) instead of live ones.
	Ended bool
}

// List reads the tenant's admitted sandboxes the projection holds a row
// for (typ: the sandbox type's full name), newest first.
func List(ctx context.Context, tx store.Tx, typ, tenantID string, f Filter, page store.PageQuery) ([]Sandbox, error) {
	created := ms("s.created_at")
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+sandboxColumns+sandboxFrom+`
		WHERE s.tenant_id = $1 AND s.state NOT IN ('draft', 'denied')
			AND (s.state IN ('deleted', 'failed')) = $3 AND ($4 = '' OR s.owner_identity_id = $4) AND ($5 = '' OR s.template_id = $5)
			AND `+store.VisibleIn("s.id", "$1", "$2", false)+`
			AND ($7 OR (`+created+`, s.id) < ($8, $9))
		ORDER BY `+created+` DESC, s.id DESC LIMIT $6`,
		tenantID, typ, f.Ended, f.Owner, f.TemplateID, page.Fetch(), page.First(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Sandbox, error) {
		s, err := scanSandbox(r)
		return s.Sandbox, err
	})
}

// Types are the catalog's full names an authorization row names.
type Types struct{ Sandbox, Pool string }

// Request is what sandboxes.create asks.
type Request struct {
	// TemplateID is the template; with FromSnapshot, "" is the
	// snapshot's.
	TemplateID string
	// TTLSeconds is the lifetime asked (0: the template's default).
	TTLSeconds int
	// FromSnapshot restores a ready snapshot of the tenant (its template's
	// sandbox): its disk and, for a memory snapshot, its processes.
	FromSnapshot string
}

// Draft writes the draft sandbox draftID and its authorization row, which
// the decision is made on: parent the template's pool, owner the caller,
// attributes templateId, vcpu, memoryGiB, gpus (the template's flavor),
// ttlSeconds and warm (the template has a warm pool: the create may be
// served from it), and fromSnapshot on a restore. A TTL above the
// template's maximum is INVALID_INPUT (field ttlSeconds, reason
// aboveMax), and a snapshot that cannot be restored is refused
// (restoreSource), before any decision.
func Draft(ctx context.Context, tx store.Tx, types Types, tenantID, draftID, ownerID string, in Request) (store.AuthzResource, error) {
	templateID := in.TemplateID
	if in.FromSnapshot != "" && templateID == "" {
		snap, err := GetSnapshot(ctx, tx, tenantID, in.FromSnapshot)
		if err != nil {
			return store.AuthzResource{}, err
		}
		templateID = snap.TemplateID
	}
	if templateID == "" {
		return store.AuthzResource{}, badField("templateId", "required", "templateId is required without fromSnapshot")
	}
	t, err := GetTemplate(ctx, tx, tenantID, templateID)
	if err != nil {
		return store.AuthzResource{}, err
	}
	if in.FromSnapshot != "" {
		if err := restoreSource(ctx, tx, tenantID, in.FromSnapshot, t); err != nil {
			return store.AuthzResource{}, err
		}
	}
	ttl := in.TTLSeconds
	if ttl == 0 {
		ttl = t.DefaultTTLSeconds
	}
	if ttl > t.MaxTTLSeconds {
		return store.AuthzResource{}, core.Errorf(core.CodeInvalidInput, "ttlSeconds %d is above template %s's maximum of %d", ttl, t.ID, t.MaxTTLSeconds).
			WithDetails(map[string]any{"field": "ttlSeconds", "reason": "aboveMax", "maxTtlSeconds": t.MaxTTLSeconds})
	}
	if _, err := tx.Exec(ctx, `INSERT INTO sandboxes (id, tenant_id, owner_identity_id, template_id, state, ttl_seconds, from_snapshot_id)
		VALUES ($1, $2, $3, $4, 'draft', $5, NULLIF($6, ''))`, draftID, tenantID, ownerID, t.ID, ttl, in.FromSnapshot); err != nil {
		return store.AuthzResource{}, err
	}
	attrs := map[string]any{"templateId": t.ID, "vcpu": t.VCPU, "memoryGiB": float64(t.MemoryMiB) / 1024, "gpus": t.GPUs,
		"ttlSeconds": ttl, "warm": t.WarmPoolSize > 0 && in.FromSnapshot == ""}
	if in.FromSnapshot != "" {
		attrs["fromSnapshot"] = in.FromSnapshot
	}
	r := store.AuthzResource{Type: types.Sandbox, ID: draftID, TenantID: tenantID, OwnerID: ownerID,
		ParentType: types.Pool, ParentID: t.PoolID, Attributes: attrs}
	return r, store.PutAuthzResource(ctx, tx, r)
}

// WorkloadID is the id of sandbox id's instance: derived, so a replay
// names the same one.
func WorkloadID(tenantID, sandboxID string) string {
	return core.DerivedID("inst", tenantID, "sandbox", sandboxID)
}

// hostName is a DNS label of the sandbox's id (its workload's name).
func hostName(id string) string { return strings.ReplaceAll(id, "_", "-") }

// Complete starts the admitted draft: its workload is placed
// (instances.PlaceWorkload: the node, the quota, the offer's terms) and
// the deadline recorded as now plus its TTL; draft -> live, and
// sandbox.created is published. A replay answers the sandbox as it is; a
// replay of a refused draft its refusal.
func Complete(ctx context.Context, tx store.Tx, tenantID, id string) (Sandbox, error) {
	s, err := load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Sandbox{}, err
	}
	if s.stored == coresandboxes.StoredFailed && s.Failure != nil {
		return Sandbox{}, failureError(s.Failure)
	}
	if s.stored != coresandboxes.StoredDraft {
		return s.Sandbox, nil
	}
	t, err := GetTemplate(ctx, tx, tenantID, s.TemplateID)
	if err != nil {
		return Sandbox{}, err
	}
	// A warm workload the node runs is claimed; without one (or for a
	// restore) the workload boots.
	w, warm := instances.Instance{}, false
	if t.WarmPoolSize > 0 && s.FromSnapshotID == "" {
		if w, warm, err = instances.ClaimWarm(ctx, tx, tenantID, t.ID, t.Version, id, s.OwnerIdentityID); err != nil {
			return Sandbox{}, err
		}
	}
	if !warm {
		host, mounts, err := workloadMounts(ctx, tx, t)
		if err != nil {
			return Sandbox{}, err
		}
		if w, err = instances.PlaceWorkload(ctx, tx, tenantID, instances.Workload{ID: WorkloadID(tenantID, id), SandboxID: id,
			OwnerID: s.OwnerIdentityID, PoolID: t.PoolID, FlavorID: t.FlavorID, ImageID: t.ImageID, Name: hostName(id),
			Runtime: workloadRuntime(t.Runtime), Command: t.Command, NodeID: host, Mounts: mounts,
			RestoreSnapshotID: s.FromSnapshotID, Env: t.Env}); err != nil {
			return Sandbox{}, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE sandboxes SET state = 'live', instance_id = $2,
			expires_at = now() + ttl_seconds * interval '1 second', updated_at = now()
		WHERE id = $1`, id, w.ID); err != nil {
		return Sandbox{}, err
	}
	if err := publish(ctx, tx, s.Sandbox, "sandbox.created", map[string]any{"templateId": t.ID, "instanceId": w.ID, "warm": warm,
		"fromSnapshot": s.FromSnapshotID}); err != nil {
		return Sandbox{}, err
	}
	out, err := load(ctx, tx, tenantID, id, false)
	return out.Sandbox, err
}

func publish(ctx context.Context, tx store.Tx, s Sandbox, typ string, data map[string]any) error {
	return store.PublishEvent(ctx, tx, store.Event{TenantID: s.TenantID, Type: typ, ResourceType: ResourceType,
		ResourceID: s.ID, Data: data})
}

func failureError(raw json.RawMessage) error {
	var f struct {
		Code    core.Code      `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details"`
	}
	_ = json.Unmarshal(raw, &f)
	if f.Code == "" {
		f.Code = core.CodeInvalidState
	}
	return core.Errorf(f.Code, "%s", f.Message).WithDetails(f.Details)
}

// Deny records a denial on the draft: draft -> denied.
func Deny(ctx context.Context, tx store.Tx, tenantID, id string) error {
	_, err := tx.Exec(ctx, `UPDATE sandboxes SET state = 'denied', updated_at = now() WHERE id = $1 AND tenant_id = $2 AND state = 'draft'`, id, tenantID)
	return err
}

// Fail records a final refusal of Complete (no capacity, over quota):
// draft -> failed with the error a replay answers. Any other cause is not
// final and changes nothing (a retry with the same key completes it).
func Fail(ctx context.Context, tx store.Tx, tenantID, id string, cause error) error {
	ce := core.AsError(cause)
	if ce.Code != core.CodeQuotaExceeded && !(ce.Code == core.CodeInvalidState && ce.Details["reason"] == "noCapacity") {
		return nil
	}
	failure, err := json.Marshal(map[string]any{"code": ce.Code, "message": ce.Message, "details": ce.Details})
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE sandboxes SET state = 'failed', failure = $3, end_reason = 'refused', ended_at = now(), updated_at = now()
		WHERE id = $1 AND tenant_id = $2 AND state = 'draft'`, id, tenantID, failure)
	return err
}

func stateError(s row, allowed ...string) error {
	return core.Errorf(core.CodeInvalidState, "sandbox %s is %s", s.ID, s.State).
		WithDetails(map[string]any{"reason": "state", "state": s.State, "allowedIn": allowed})
}

// Extend moves a live sandbox's deadline to expiresAt (epoch ms): in the
// future, and at most the template's maximum TTL after the sandbox was
// created (INVALID_INPUT field expiresAt, reason past or aboveMax, with
// maxExpiresAt). It is the only writer of the deadline after Complete.
func Extend(ctx context.Context, tx store.Tx, tenantID, id string, expiresAt int64) (Sandbox, error) {
	s, err := load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Sandbox{}, err
	}
	if s.stored == coresandboxes.StoredDraft || s.stored == coresandboxes.StoredDenied {
		return Sandbox{}, notFound(id)
	}
	if s.stored != coresandboxes.StoredLive {
		return Sandbox{}, stateError(s, string(coresandboxes.Starting), string(coresandboxes.Running))
	}
	var maxTTL int
	var nowMs int64
	if err := tx.QueryRow(ctx, `SELECT t.max_ttl_seconds, `+ms("now()")+` FROM sandbox_templates t WHERE t.id = $1`, s.TemplateID).
		Scan(&maxTTL, &nowMs); err != nil {
		return Sandbox{}, err
	}
	maxAt := s.CreatedAt + int64(maxTTL)*1000
	switch {
	case expiresAt <= nowMs:
		return Sandbox{}, core.Errorf(core.CodeInvalidInput, "expiresAt %d is not in the future", expiresAt).
			WithDetails(map[string]any{"field": "expiresAt", "reason": "past", "maxExpiresAt": maxAt})
	case expiresAt > maxAt:
		return Sandbox{}, core.Errorf(core.CodeInvalidInput, "expiresAt %d is past the template's maximum lifetime of %d s (%d)", expiresAt, maxTTL, maxAt).
			WithDetails(map[string]any{"field": "expiresAt", "reason": "aboveMax", "maxExpiresAt": maxAt})
	}
	if _, err := tx.Exec(ctx, `UPDATE sandboxes SET expires_at = timestamptz 'epoch' + $2::bigint * interval '1 millisecond',
			updated_at = now() WHERE id = $1`, id, expiresAt); err != nil {
		return Sandbox{}, err
	}
	if err := publish(ctx, tx, s.Sandbox, "sandbox.extended", map[string]any{"from": s.ExpiresAt, "to": expiresAt}); err != nil {
		return Sandbox{}, err
	}
	out, err := load(ctx, tx, tenantID, id, false)
	return out.Sandbox, err
}

// end moves a live sandbox to deleting with reason, and deletes its
// workload (deleteWorkload) unless a snapshot of it is being taken: the
// workflow deletes it once none is. With its workload gone, snapshots
// being taken fail at once.
func end(ctx context.Context, tx store.Tx, s row, reason string) error {
	if _, err := tx.Exec(ctx, `UPDATE sandboxes SET state = 'deleting', end_reason = $2, updated_at = now() WHERE id = $1`, s.ID, reason); err != nil {
		return err
	}
	pending, err := expireSnapshots(ctx, tx, s.ID, s.gone())
	if err != nil || pending {
		return err
	}
	return deleteWorkload(ctx, tx, s)
}

// deleteWorkload deletes s's workload (instances.Change), in the caller's
// transaction.
func deleteWorkload(ctx context.Context, tx store.Tx, s row) error {
	if s.InstanceID == "" || s.desiredState == string(instancestates.Deleted) {
		return nil
	}
	_, _, err := instances.Change(ctx, tx, s.TenantID, s.InstanceID, instancestates.MethodDelete)
	if errors.Is(err, core.ErrNotFound) {
		return nil
	}
	return err
}

// ttlEnd ends a live sandbox at its deadline: with the template's
// ttlAction snapshot and its workload running, a snapshot is taken first
// (memory included under gvisor) and the workload deleted once it is
// ready or failed.
func ttlEnd(ctx context.Context, tx store.Tx, s row, snapshotType string) error {
	var action string
	if err := tx.QueryRow(ctx, `SELECT ttl_action FROM sandbox_templates WHERE id = $1`, s.TemplateID).Scan(&action); err != nil {
		return err
	}
	if action == string(coresandboxes.TTLSnapshot) && runnable(s) == nil {
		busy, err := snapshotting(ctx, tx, s.ID)
		if err != nil {
			return err
		}
		if !busy {
			if _, err := takeSnapshot(ctx, tx, snapshotType, s, core.DerivedID("snap", s.TenantID, "ttl", s.ID),
				s.Runtime == string(coresandboxes.RuntimeGVisor), "ttl"); err != nil && !errors.As(err, new(*core.Error)) {
				return err
			}
		}
	}
	return end(ctx, tx, s, coresandboxes.EndTTL)
}

// Delete ends the tenant's sandbox (reason deleted): live -> deleting, its
// workload deleted; the workflow records deleted once the workload is
// gone. Deleting one that is deleting or ended answers it unchanged.
func Delete(ctx context.Context, tx store.Tx, tenantID, id string) (Sandbox, error) {
	s, err := load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Sandbox{}, err
	}
	switch s.stored {
	case coresandboxes.StoredDraft, coresandboxes.StoredDenied:
		return Sandbox{}, notFound(id)
	case coresandboxes.StoredLive:
		if err := end(ctx, tx, s, coresandboxes.EndDeleted); err != nil {
			return Sandbox{}, err
		}
	}
	out, err := load(ctx, tx, tenantID, id, false)
	return out.Sandbox, err
}

// gone says s's workload failed, went away, or lost its host.
func (s row) gone() bool {
	return s.nodeLost || s.instanceState == string(instancestates.Failed) || s.instanceState == string(instancestates.Deleted) ||
		s.instanceState == string(instancestates.Deleting) || s.instanceState == ""
}

// Progress is what one step of the sandbox's workflow found.
type Progress struct {
	// Ended: the sandbox is deleted or failed; the workflow ends.
	Ended bool
	// ExpiresAt is the deadline (epoch ms), Now the database's clock.
	ExpiresAt, Now int64
	State          string
	// InstanceID is the workload, whose workflow converges it.
	InstanceID string
}

// Step is one step of the sandbox's workflow, in one transaction: past
// its deadline (by the database's clock) a live sandbox ends with reason
// ttl (ttlEnd: a snapshot first when its template says so); a live one
// whose workload failed or went away, or whose host is lost, ends with
// reason workloadGone (its ready snapshots stay); a
// deleting one deletes its workload once no snapshot of it is being taken
// (expireSnapshots bounds the wait) and is recorded deleted
// (sandbox.ended) once its workload is. A missing sandbox is Ended.
// snapshotType is the snapshot type's full name.
func Step(ctx context.Context, tx store.Tx, id, snapshotType string) (Progress, error) {
	var tenantID string
	err := tx.QueryRow(ctx, `SELECT tenant_id FROM sandboxes WHERE id = $1`, id).Scan(&tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Progress{Ended: true}, nil
	}
	if err != nil {
		return Progress{}, err
	}
	s, err := load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Progress{}, err
	}
	var now int64
	if err := tx.QueryRow(ctx, `SELECT `+ms("now()")).Scan(&now); err != nil {
		return Progress{}, err
	}
	gone := s.gone()
	switch s.stored {
	case coresandboxes.StoredLive:
		switch {
		case now >= s.ExpiresAt:
			err = ttlEnd(ctx, tx, s, snapshotType)
		case gone:
			err = end(ctx, tx, s, coresandboxes.EndWorkloadGone)
		default:
			_, err = expireSnapshots(ctx, tx, s.ID, false)
		}
	case coresandboxes.StoredDeleting:
		var pending bool
		if pending, err = expireSnapshots(ctx, tx, s.ID, gone); err == nil && !pending {
			err = deleteWorkload(ctx, tx, s)
		}
	}
	if err != nil {
		return Progress{}, err
	}
	if s, err = load(ctx, tx, tenantID, id, false); err != nil {
		return Progress{}, err
	}
	if s.stored == coresandboxes.StoredDeleting && (s.instanceState == "" || s.instanceState == string(instancestates.Deleted)) {
		if _, err := tx.Exec(ctx, `UPDATE sandboxes SET state = 'deleted', ended_at = now(), updated_at = now() WHERE id = $1`, id); err != nil {
			return Progress{}, err
		}
		if err := publish(ctx, tx, s.Sandbox, "sandbox.ended", map[string]any{"reason": s.EndReason}); err != nil {
			return Progress{}, err
		}
		s.stored = coresandboxes.StoredDeleted
	}
	ended := s.stored == coresandboxes.StoredDeleted || s.stored == coresandboxes.StoredFailed
	return Progress{Ended: ended, ExpiresAt: s.ExpiresAt, Now: now, State: s.stored, InstanceID: s.InstanceID}, nil
}

// ExecTarget answers the node and instance an exec in the tenant's
// sandbox runs on: the sandbox must be live and its workload reported
// running by its node at its current generation (else INVALID_STATE,
// reason state, or notRunning).
func ExecTarget(ctx context.Context, tx store.Tx, tenantID, id string) (nodeID, instanceID string, err error) {
	s, err := load(ctx, tx, tenantID, id, false)
	if err != nil {
		return "", "", err
	}
	if s.stored == coresandboxes.StoredDraft || s.stored == coresandboxes.StoredDenied {
		return "", "", notFound(id)
	}
	if err := runnable(s); err != nil {
		return "", "", err
	}
	return s.NodeID, s.InstanceID, nil
}

// runnable says whether s is live with its workload reported running by
// its node at its current generation (else INVALID_STATE, reason state,
// or notRunning): what an exec or a snapshot needs.
func runnable(s row) error {
	if s.stored != coresandboxes.StoredLive {
		return stateError(s, string(coresandboxes.Running))
	}
	if s.observedState != "running" || s.observedGeneration != s.generation || s.NodeID == "" || s.nodeLost {
		return core.Errorf(core.CodeInvalidState, "sandbox %s is %s; its workload is not running yet", s.ID, s.State).
			WithDetails(map[string]any{"reason": "notRunning", "state": s.State})
	}
	return nil
}

// WorkflowStarted records that the sandbox's workflow was started.
func WorkflowStarted(ctx context.Context, db store.DBTX, id string) error {
	_, err := db.Exec(ctx, `UPDATE sandboxes SET workflow_started_at = now() WHERE id = $1 AND workflow_started_at IS NULL`, id)
	return err
}

// Owed is a sandbox whose workflow should run.
type Owed struct {
	TenantID, SandboxID, PoolID, InstanceID string
}

// OwedWorkflows lists live and deleting sandboxes (after afterID, up to
// limit) whose workflow start was not recorded for longer than grace, or
// every live one when all is set (the reconciler starts a closed one
// again; a running one is kept).
func OwedWorkflows(ctx context.Context, tx store.Tx, grace time.Duration, all bool, afterID string, limit int) ([]Owed, error) {
	rows, err := tx.Query(ctx, `SELECT s.tenant_id, s.id, t.pool_id, COALESCE(s.instance_id, '')
		FROM sandboxes s JOIN sandbox_templates t ON t.id = s.template_id
		WHERE s.state IN ('live', 'deleting') AND s.id > $3
			AND ($2 OR (s.workflow_started_at IS NULL AND s.updated_at < now() - $1::bigint * interval '1 millisecond'))
		ORDER BY s.id LIMIT $4`, grace.Milliseconds(), all, afterID, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Owed, error) {
		var o Owed
		return o, r.Scan(&o.TenantID, &o.SandboxID, &o.PoolID, &o.InstanceID)
	})
}

// SweepDrafts deletes drafts (and their authorization rows) older than
// maxAge: an admission whose second transaction never ran.
func SweepDrafts(ctx context.Context, tx store.Tx, typ string, maxAge time.Duration) (int, error) {
	rows, err := tx.Query(ctx, `DELETE FROM sandboxes WHERE state = 'draft' AND created_at < now() - $1::bigint * interval '1 millisecond'
		RETURNING id`, maxAge.Milliseconds())
	if err != nil {
		return 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, err
	}
	for _, id := range ids {
		if err := store.DeleteAuthzResource(ctx, tx, typ, id); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}

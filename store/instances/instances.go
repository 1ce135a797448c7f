// Package instances is the instances domain's store: the instances table,
// the draft an admission decides on, the placement that books a vps-host
// instance's allocation (scalar vCPU and memory under the pool's
// overcommit, GPU atoms through core/placement and device_bookings), the
// desired-state changes of the API, the node's reports, and the
// workflow's state writes. It is the only writer of instances and of the
// allocations instances own.
package instances

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	states "github.com/better-compute/better-compute/core/instances"
	coresecrets "github.com/better-compute/better-compute/core/secrets"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/flavors"
	"github.com/better-compute/better-compute/store/images"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
)

// ResourceType is the catalog type an instance is decided on.
const ResourceType = states.ResourceType

// Pool classes instances run on.
const (
	ClassVPSHost  = "vps-host"
	ClassProvider = "provider"
)

// Instance is an instance as the API answers it.
type Instance struct {
	ID              string `json:"id"`
	TenantID        string `json:"tenantId"`
	OwnerIdentityID string `json:"ownerIdentityId"`
	ProjectID       string `json:"projectId,omitempty"`
	PoolID          string `json:"poolId"`
	FlavorID        string `json:"flavorId"`
	// ImageID is the registered image (vps-host pools); ProviderImage the
	// provider's image slug or id (provider pools). Exactly one is set.
	ImageID       string `json:"imageId,omitempty"`
	ProviderImage string `json:"providerImage,omitempty"`
	Name          string `json:"name"`
	DesiredState  string `json:"desiredState"`
	State         string `json:"state"`
	// Generation numbers the desired state and limits; ObservedGeneration
	// is the one the node last answered.
	Generation         int64  `json:"generation"`
	ObservedGeneration int64  `json:"observedGeneration"`
	NodeID             string `json:"nodeId,omitempty"`
	// Address is the instance's IPv4 address: on its node's instance
	// network (vps-host), or the droplet's public one (provider).
	Address string `json:"address,omitempty"`
	// UserDataRef is the secret:// reference of its user data; plain user
	// data is never answered (HasUserData says there is some).
	UserDataRef string   `json:"userDataRef,omitempty"`
	HasUserData bool     `json:"hasUserData"`
	Command     []string `json:"command,omitempty"`
	// VCPU, MemoryMiB and GPUs are the flavor's.
	VCPU      int    `json:"vcpu"`
	MemoryMiB int64  `json:"memoryMiB"`
	GPUs      int    `json:"gpus"`
	Runtime   string `json:"runtime,omitempty"`
	// Devices are the stable ids of the GPU atoms of its allocation.
	Devices []string `json:"devices,omitempty"`
	// ObservedError is the runtime's last error, if any.
	ObservedError    string          `json:"observedError,omitempty"`
	Failure          json.RawMessage `json:"failure,omitempty"`
	ProviderServerID string          `json:"providerServerId,omitempty"`
	ReservationID    string          `json:"reservationId,omitempty"` // the binding instance reservation it runs on
	WorkflowID       string          `json:"workflowId,omitempty"`
	CreatedAt        int64           `json:"createdAt" unit:"epoch-ms"`
	UpdatedAt        int64           `json:"updatedAt" unit:"epoch-ms"`
	DeletedAt        int64           `json:"deletedAt,omitempty" unit:"epoch-ms"`
}

// columns are what scan reads, from instances i joined with flavors f.
var columns = `i.id, i.tenant_id, i.owner_identity_id, i.project_id, i.pool_id, i.flavor_id, i.image_id, i.provider_image, i.name,
	i.desired_state, i.state, i.generation, i.observed_generation, COALESCE(i.node_id, ''), i.address,
	COALESCE(i.user_data_ref, ''), (i.user_data IS NOT NULL OR i.user_data_ref IS NOT NULL), i.command,
	f.vcpu, f.memory_mib, f.gpus, CASE WHEN i.runtime <> '' THEN i.runtime ELSE f.runtime END,
	COALESCE((SELECT a.atoms FROM allocations a WHERE a.instance_id = i.id AND a.released_at IS NULL), '{}'),
	i.observed_error, i.failure, i.provider_server_id,
	` + msOf("i.created_at") + `, ` + msOf("i.updated_at") + `, COALESCE(` + msOf("i.deleted_at") + `, 0),
	COALESCE(i.reservation_id, '')`

const from = ` FROM instances i JOIN flavors f ON f.id = i.flavor_id`

func msOf(col string) string { return `(floor(extract(epoch FROM ` + col + `) * 1000)::bigint)` }

func scan(row pgx.Row) (Instance, error) {
	var in Instance
	var failure []byte
	err := row.Scan(&in.ID, &in.TenantID, &in.OwnerIdentityID, &in.ProjectID, &in.PoolID, &in.FlavorID, &in.ImageID, &in.ProviderImage, &in.Name,
		&in.DesiredState, &in.State, &in.Generation, &in.ObservedGeneration, &in.NodeID, &in.Address,
		&in.UserDataRef, &in.HasUserData, &in.Command, &in.VCPU, &in.MemoryMiB, &in.GPUs, &in.Runtime, &in.Devices,
		&in.ObservedError, &failure, &in.ProviderServerID, &in.CreatedAt, &in.UpdatedAt, &in.DeletedAt, &in.ReservationID)
	if failure != nil {
		in.Failure = failure
	}
	if len(in.Command) == 0 {
		in.Command = nil
	}
	if len(in.Devices) == 0 {
		in.Devices = nil
	}
	if in.State != string(states.Draft) && in.State != string(states.Denied) {
		in.WorkflowID = in.ID
	}
	return in, err
}

func notFound(id string) error { return core.Errorf(core.CodeNotFound, "instance %s not found", id) }

// Load reads one of the tenant's instances (NOT_FOUND for another
// tenant's); lock locks its row first.
func Load(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (Instance, error) {
	if lock {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM instances WHERE id = $1 AND tenant_id = $2 FOR UPDATE`, id, tenantID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return Instance{}, notFound(id)
		}
		if err != nil {
			return Instance{}, err
		}
	}
	in, err := scan(tx.QueryRow(ctx, `SELECT `+columns+from+` WHERE i.id = $1 AND i.tenant_id = $2`, id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Instance{}, notFound(id)
	}
	return in, err
}

// QueueLoad queues Load's read (unlocked) in b (store.Read).
func QueueLoad(b *store.Batch, tenantID, id string) func() (Instance, error) {
	return store.QueueRow(b, func(row pgx.Row) (Instance, error) {
		in, err := scan(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return Instance{}, notFound(id)
		}
		return in, err
	}, `SELECT `+columns+from+` WHERE i.id = $1 AND i.tenant_id = $2 AND i.state NOT IN ('draft', 'denied')`, id, tenantID)
}

// Filter narrows a list; "" keeps every value.
type Filter struct {
	Owner, State, PoolID, ProjectID string
}

// List reads the tenant's admitted instances (no drafts, no denials) the
// projection holds a row for (typ is the instance type's full name),
// newest first: the page's rows after its key, plus one. Deleted
// instances are listed only when the filter asks for them.
func List(ctx context.Context, tx store.Tx, typ, tenantID string, f Filter, page store.PageQuery) ([]Instance, error) {
	createdMs := msOf("i.created_at")
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+columns+from+`
		WHERE i.tenant_id = $1 AND i.state NOT IN ('draft', 'denied')
			AND ($2 = '' OR i.owner_identity_id = $2)
			AND (($3 = '' AND i.state <> 'deleted') OR i.state = $3)
			AND ($4 = '' OR i.pool_id = $4) AND ($5 = '' OR i.project_id = $5)
			AND `+store.VisibleIn("i.id", "$1", "$6", false)+`
			AND ($8 OR (`+createdMs+`, i.id) < ($9, $10))
		ORDER BY `+createdMs+` DESC, i.id DESC LIMIT $7`,
		tenantID, f.Owner, f.State, f.PoolID, f.ProjectID, typ, page.Fetch(), page.First(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Instance, error) { return scan(row) })
}

// Types are the catalog's full names of the types an instance's
// authorization row names: its own and its parent pool's.
type Types struct {
	Instance, Pool string
}

// Request is what instances.create asks for.
type Request struct {
	PoolID, FlavorID, ImageID, Name, ProjectID string
	// ProviderImage is a provider pool's image: a slug or id of the
	// provider's (providerAccounts.offers lists them).
	ProviderImage string
	// UserData is plain text, or a secret:// reference.
	UserData      string
	Command       []string
	ReservationID string
}

// IsSecretRef says whether user data is a secret:// reference (the
// create's secrets decision).
func IsSecretRef(userData string) bool { return strings.HasPrefix(userData, coresecrets.Scheme) }

// maxCommandArg bounds one argument of a container's command.
const maxCommandArg = 4096

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// Draft writes the draft instance draftID (state draft, desired running)
// and its authorization row, which the decision is made on (attributes
// vcpu, memoryGiB, gpus, imageId, imageVerified, projectId; parent the
// pool; owner the caller). The pool must resolve in the tenant's view and
// be a live vps-host or provider pool, the flavor be the pool's, the
// image one the tenant may see whose bytes are uploaded, the project the
// tenant's; command is for container flavors only; a reservation must be
// one the instance can run on (checkReservation).
func Draft(ctx context.Context, tx store.Tx, types Types, tenantID, draftID, ownerID string, in Request) (store.AuthzResource, error) {
	pool, err := pools.View(ctx, tx, tenantID, in.PoolID)
	if err != nil {
		return store.AuthzResource{}, err
	}
	if pool.ArchivedAt != nil {
		return store.AuthzResource{}, core.Errorf(core.CodeInvalidState, "pool %s is archived", pool.ID).
			WithDetails(map[string]any{"reason": "archived"})
	}
	if pool.Class != ClassVPSHost && pool.Class != ClassProvider {
		return store.AuthzResource{}, badField("poolId", "class", "pool %s is a %s pool; instances run on vps-host and provider pools", pool.ID, pool.Class)
	}
	flavor, err := flavors.Get(ctx, tx, pool.ID, in.FlavorID)
	if err != nil {
		return store.AuthzResource{}, err
	}
	if len(in.Command) > 0 && flavor.Runtime != flavors.RuntimeContainer {
		return store.AuthzResource{}, badField("command", "runtime", "command is for container flavors only")
	}
	for i, arg := range in.Command {
		if len(arg) > maxCommandArg {
			return store.AuthzResource{}, badField("command", "tooLong", "command[%d] is %d bytes; at most %d", i, len(arg), maxCommandArg)
		}
	}
	var reservationID *string
	if in.ReservationID != "" {
		if _, err := checkReservation(ctx, tx, tenantID, pool.ID, flavor, draftID, in.ReservationID, false); err != nil {
			return store.AuthzResource{}, err
		}
		reservationID = &in.ReservationID
	}
	image, err := draftImage(ctx, tx, tenantID, pool.Class, in)
	if err != nil {
		return store.AuthzResource{}, err
	}
	if in.ProjectID != "" {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM projects WHERE id = $1 AND tenant_id = $2 AND archived_at IS NULL`, in.ProjectID, tenantID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.AuthzResource{}, core.Errorf(core.CodeNotFound, "project %s not found", in.ProjectID)
		} else if err != nil {
			return store.AuthzResource{}, err
		}
	}
	var plain, ref *string
	if in.UserData != "" {
		if IsSecretRef(in.UserData) {
			owner, _, err := coresecrets.ParseRef(in.UserData)
			if err != nil {
				return store.AuthzResource{}, badField("userData", "secretRef", "userData: %v", err)
			}
			if owner != tenantID {
				return store.AuthzResource{}, badField("userData", "secretRef", "userData must name a secret of tenant %s", tenantID)
			}
			ref = &in.UserData
		} else {
			plain = &in.UserData
		}
	}
	if in.Command == nil {
		in.Command = []string{}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO instances (id, tenant_id, owner_identity_id, project_id, pool_id, flavor_id, image_id, name,
			desired_state, state, user_data, user_data_ref, command, provider_image, reservation_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'running', 'draft', $9, $10, $11, $12, $13)`,
		draftID, tenantID, ownerID, in.ProjectID, pool.ID, flavor.ID, image.ID, in.Name, plain, ref, in.Command, in.ProviderImage,
		reservationID); err != nil {
		return store.AuthzResource{}, err
	}
	row := authzRow(types, tenantID, draftID, ownerID, pool.ID, flavor, image, in.ProjectID)
	return row, store.PutAuthzResource(ctx, tx, row)
}

// draftImage checks the create's image for the pool's class: a vps-host
// pool runs a registered image the tenant may see whose bytes are
// uploaded; a provider pool boots one of the provider's images, which
// only the provider can check (an unknown one fails the instance with
// the provider's refusal).
func draftImage(ctx context.Context, tx store.Tx, tenantID, class string, in Request) (coreimages.Image, error) {
	if class == ClassProvider {
		if in.ImageID != "" {
			return coreimages.Image{}, badField("imageId", "providerPool",
				"a provider pool boots one of the provider's images: give providerImage (providerAccounts.offers lists them), not imageId")
		}
		if in.ProviderImage == "" {
			return coreimages.Image{}, badField("providerImage", "required", "a provider pool's instance needs providerImage")
		}
		return coreimages.Image{}, nil
	}
	if in.ProviderImage != "" {
		return coreimages.Image{}, badField("providerImage", "providerPoolsOnly", "providerImage is for provider pools; give imageId")
	}
	if in.ImageID == "" {
		return coreimages.Image{}, badField("imageId", "required", "a %s pool's instance needs imageId", class)
	}
	image, err := images.Get(ctx, tx, tenantID, in.ImageID)
	if err != nil {
		return coreimages.Image{}, err
	}
	if image.State != coreimages.StateAvailable {
		return coreimages.Image{}, core.Errorf(core.CodeInvalidState, "image %s is %s; its bytes are not uploaded", image.ID, image.State).
			WithDetails(map[string]any{"field": "imageId", "reason": "notUploaded"})
	}
	return image, nil
}

// authzRow is an instance's authorization row. A provider image has no
// imageId and is never verified (we hold no signature of it), so a policy
// that requires imageVerified denies it: fail closed.
func authzRow(types Types, tenantID, id, ownerID, poolID string, f flavors.Flavor, im coreimages.Image, projectID string) store.AuthzResource {
	attrs := map[string]any{"vcpu": f.VCPU, "memoryGiB": f.MemoryGiB, "gpus": f.GPUs,
		"imageId": im.ID, "imageVerified": im.Verified}
	if projectID != "" {
		attrs["projectId"] = projectID
	}
	return store.AuthzResource{Type: types.Instance, ID: id, TenantID: tenantID, OwnerID: ownerID,
		ParentType: types.Pool, ParentID: poolID, Attributes: attrs}
}

// setState writes the instance's state, publishing instance.<state> for
// the states owners watch (created, running, stopped, deleted, failed),
// in the caller's transaction.
func setState(ctx context.Context, tx store.Tx, in Instance, to states.State, failure json.RawMessage) error {
	if _, err := tx.Exec(ctx, `UPDATE instances SET state = $2, failure = COALESCE($3, failure), updated_at = now(),
			converging_since = CASE WHEN $2 IN ('running', 'stopped', 'deleted', 'failed') THEN NULL
				ELSE COALESCE(converging_since, now()) END
		WHERE id = $1`, in.ID, string(to), failure); err != nil {
		return err
	}
	event := ""
	switch to {
	case states.Creating:
		event = "instance.created"
	case states.Running, states.Stopped, states.Deleted, states.Failed:
		event = "instance." + string(to)
	}
	if event == "" {
		return nil
	}
	return store.PublishEvent(ctx, tx, store.Event{TenantID: in.TenantID, Type: event, ResourceType: ResourceType,
		ResourceID: in.ID, ProjectID: in.ProjectID, Data: map[string]any{"from": in.State, "to": string(to), "poolId": in.PoolID}})
}

// Deny records a denial on the draft: draft -> denied.
func Deny(ctx context.Context, tx store.Tx, tenantID, id string) error {
	in, err := Load(ctx, tx, tenantID, id, true)
	if err != nil || in.State != string(states.Draft) {
		return err
	}
	return setState(ctx, tx, in, states.Denied, nil)
}

// FailureError is the error a failed admission was refused with.
func FailureError(in Instance) error {
	var f struct {
		Code    core.Code      `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details"`
	}
	_ = json.Unmarshal(in.Failure, &f)
	if f.Code == "" {
		f.Code = core.CodeInvalidState
	}
	return core.Errorf(f.Code, "%s", f.Message).WithDetails(f.Details)
}

// Fail records a final refusal of Place (no capacity, over quota): draft
// -> failed, with the error a replay of the key answers, in a transaction
// of its own. Any other cause is not final and changes nothing.
func Fail(ctx context.Context, tx store.Tx, tenantID, id string, cause error) error {
	ce := core.AsError(cause)
	if ce.Code != core.CodeQuotaExceeded && !(ce.Code == core.CodeInvalidState && ce.Details["reason"] == "noCapacity") {
		return nil
	}
	failure, err := json.Marshal(map[string]any{"code": ce.Code, "message": ce.Message, "details": ce.Details})
	if err != nil {
		return err
	}
	in, err := Load(ctx, tx, tenantID, id, true)
	if err != nil || in.State != string(states.Draft) {
		return err
	}
	return setState(ctx, tx, in, states.Failed, failure)
}

// Place completes the admitted draft: on a vps-host pool it books the
// instance's allocation on one node (placement.go; on its reservation's
// node and atoms with a reservation: reservation.go) and bumps the node's
// NodeSpec generation; on a provider pool nothing is booked (the
// instance's workflow makes the droplet). draft -> creating, and
// instance.created is published. A replay of a refused draft answers its
// refusal.
func Place(ctx context.Context, tx store.Tx, tenantID, id string) (Instance, error) {
	return place(ctx, tx, tenantID, id, "")
}

// place is Place on node onNode alone when it is set (a workload that
// mounts volumes runs on their host).
func place(ctx context.Context, tx store.Tx, tenantID, id, onNode string) (Instance, error) {
	in, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Instance{}, err
	}
	if in.State == string(states.Failed) && in.Failure != nil {
		return Instance{}, FailureError(in)
	}
	if in.State != string(states.Draft) {
		return in, nil
	}
	pool, err := pools.View(ctx, tx, tenantID, in.PoolID)
	if err != nil {
		return Instance{}, err
	}
	if err := pools.CheckOffer(pool, pool.Region); err != nil {
		return Instance{}, err
	}
	if pool.Class == ClassVPSHost {
		flavor, err := flavors.Get(ctx, tx, pool.ID, in.FlavorID)
		if err != nil {
			return Instance{}, err
		}
		var nodeID string
		if in.ReservationID != "" {
			nodeID, err = placeOnReservation(ctx, tx, pool, flavor, in)
		} else {
			nodeID, err = placeOnNode(ctx, tx, pool, flavor, in, onNode)
		}
		if err != nil {
			return Instance{}, err
		}
		if err := checkQuota(ctx, tx, tenantID, pool, askOf(in, flavor)); err != nil {
			return Instance{}, err
		}
		if _, err := tx.Exec(ctx, `UPDATE instances SET node_id = $2 WHERE id = $1`, in.ID, nodeID); err != nil {
			return Instance{}, err
		}
		if err := nodes.BumpGeneration(ctx, tx, nodeID); err != nil {
			return Instance{}, err
		}
	}
	if err := setState(ctx, tx, in, states.Creating, nil); err != nil {
		return Instance{}, err
	}
	return Load(ctx, tx, tenantID, id, false)
}

// ProviderServers maps those of ids that are live instances of the tenant
// on a pool of provider account accountID to their provider server ids
// ("" while the provider has not made one).
func ProviderServers(ctx context.Context, tx store.Tx, tenantID, accountID string, ids []string) (map[string]string, error) {
	rows, err := tx.Query(ctx, `SELECT i.id, i.provider_server_id FROM instances i JOIN pools p ON p.id = i.pool_id
		WHERE i.id = ANY($3) AND i.tenant_id = $1 AND p.provider_account_id = $2
			AND i.state NOT IN ('draft', 'denied', 'deleting', 'deleted', 'failed')`, tenantID, accountID, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, server string
		if err := rows.Scan(&id, &server); err != nil {
			return nil, err
		}
		out[id] = server
	}
	return out, rows.Err()
}

// Workload is a sandbox's instance (store/sandboxes): it has no
// authorization row of its own, since IAM decides on the sandbox, so
// instances.* never list or answer it.
type Workload struct {
	ID, SandboxID, OwnerID, PoolID, FlavorID, ImageID, Name string
	// Runtime is "" (the flavor's) or "gvisor" (a container flavor under
	// runsc).
	Runtime string
	Command []string
	// WarmTemplateID and WarmVersion make it a warm workload of that
	// template version's pool (SandboxID empty until ClaimWarm).
	WarmTemplateID string
	WarmVersion    int64
	// RestoreSnapshotID makes it from a sandbox snapshot (its rootfs, and
	// its processes for a memory snapshot) instead of its image.
	RestoreSnapshotID string
	// Env is the guest's environment (plain values and secret://
	// references), fetched resolved by its node (InstanceEnv).
	Env map[string]string
	// NodeID, when set, is the one node it may be placed on (the host of
	// the volumes it mounts); Mounts are those volumes, as the NodeSpec
	// hands them to the runtime.
	NodeID string
	Mounts []nodespec.Mount
}

// PlaceWorkload writes a sandbox's workload and places it as Place places
// an admitted draft (the pool's offer terms, the node, the quota), in the
// caller's transaction: the sandbox's admission decided on it.
func PlaceWorkload(ctx context.Context, tx store.Tx, tenantID string, w Workload) (Instance, error) {
	if w.Command == nil {
		w.Command = []string{}
	}
	if w.Mounts == nil {
		w.Mounts = []nodespec.Mount{}
	}
	mounts, err := json.Marshal(w.Mounts)
	if err != nil {
		return Instance{}, err
	}
	if w.Env == nil {
		w.Env = map[string]string{}
	}
	env, err := json.Marshal(w.Env)
	if err != nil {
		return Instance{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO instances (id, tenant_id, owner_identity_id, pool_id, flavor_id, image_id, name,
			desired_state, state, command, sandbox_id, runtime, warm_template_id, warm_version, mounts, restore_snapshot_id, env)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'running', 'draft', $8, NULLIF($9, ''), $10, NULLIF($11, ''), NULLIF($12, 0), $13, NULLIF($14, ''), $15)`,
		w.ID, tenantID, w.OwnerID, w.PoolID, w.FlavorID, w.ImageID, w.Name, w.Command, w.SandboxID, w.Runtime,
		w.WarmTemplateID, w.WarmVersion, mounts, w.RestoreSnapshotID, env); err != nil {
		return Instance{}, err
	}
	return place(ctx, tx, tenantID, w.ID, w.NodeID)
}

// ClaimWarm binds one of the template's warm workloads at version that its
// node reports running at its current generation to sandboxID (its owner
// becoming ownerID), in the caller's transaction; ok is false when none is
// ready. Concurrent claims take different ones (SKIP LOCKED).
func ClaimWarm(ctx context.Context, tx store.Tx, tenantID, templateID string, version int64, sandboxID, ownerID string) (Instance, bool, error) {
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM instances
		WHERE warm_template_id = $1 AND warm_version = $2 AND sandbox_id IS NULL AND tenant_id = $3
			AND state = 'running' AND desired_state = 'running' AND observed_state = 'running' AND observed_generation = generation
		ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED`, templateID, version, tenantID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Instance{}, false, nil
	}
	if err != nil {
		return Instance{}, false, err
	}
	if _, err := tx.Exec(ctx, `UPDATE instances SET sandbox_id = $2, owner_identity_id = $3, updated_at = now() WHERE id = $1`,
		id, sandboxID, ownerID); err != nil {
		return Instance{}, false, err
	}
	in, err := Load(ctx, tx, tenantID, id, false)
	return in, err == nil, err
}

// WarmWorkload is one unclaimed warm workload of a template.
type WarmWorkload struct {
	ID      string
	Version int64
	State   string
}

// WarmWorkloads lists the template's unclaimed warm workloads that are
// not deleted, oldest first.
func WarmWorkloads(ctx context.Context, tx store.Tx, templateID string) ([]WarmWorkload, error) {
	rows, err := tx.Query(ctx, `SELECT id, warm_version, state FROM instances
		WHERE warm_template_id = $1 AND sandbox_id IS NULL AND state <> 'deleted' ORDER BY created_at, id`, templateID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (WarmWorkload, error) {
		var w WarmWorkload
		return w, r.Scan(&w.ID, &w.Version, &w.State)
	})
}

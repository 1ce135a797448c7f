// Package cloudresources is the cloud-resources domain's store: the
// cloud_resources table (migrations/00041), the draft create and adopt
// decide on, the tenant's changes (update, delete, release) and the
// reconciler's writes of what it found at the provider. It is the only
// writer of cloud_resources. What a kind takes and reports is its
// manifest's (drivers/cloudresources): the API reads the manifest and
// hands this package the facts it needs (family, identity, booking).
package cloudresources

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	rules "github.com/better-compute/better-compute/core/cloudresources"
	"github.com/better-compute/better-compute/store"
)

// ResourceType is the catalog type a resource is decided on.
const ResourceType = rules.ResourceType

// Resource is a cloud resource as the methods answer it. SecretOutputs
// hold secret:// references only.
type Resource struct {
	ID                string            `json:"id"`
	TenantID          string            `json:"tenantId"`
	OwnerIdentityID   string            `json:"ownerIdentityId"`
	ProjectID         string            `json:"projectId,omitempty"`
	PoolID            string            `json:"poolId"`
	ProviderAccountID string            `json:"providerAccountId"`
	Provider          string            `json:"provider"`
	Kind              string            `json:"kind"`
	Family            string            `json:"family"`
	Name              string            `json:"name"`
	Description       string            `json:"description,omitempty"`
	ParentID          string            `json:"parentId,omitempty"`
	Region            string            `json:"region,omitempty"`
	Spec              json.RawMessage   `json:"spec"`
	Version           int64             `json:"version"`
	AppliedVersion    int64             `json:"appliedVersion"`
	State             string            `json:"state"`
	Desired           string            `json:"desired"`
	Message           string            `json:"message,omitempty"`
	Reason            string            `json:"reason,omitempty"`
	ProviderID        string            `json:"providerId,omitempty"`
	ProviderStatus    string            `json:"providerStatus,omitempty"`
	Outputs           map[string]string `json:"outputs"`
	SecretOutputs     map[string]string `json:"secretOutputs"`
	// Adopted resources were taken over by adopt; Adopting until the
	// reconciler wrote the ownership labels; ObserveOnly until the
	// tenant first changed its spec.
	Adopted     bool     `json:"adopted"`
	Adopting    bool     `json:"adopting,omitempty"`
	ObserveOnly bool     `json:"observeOnly,omitempty"`
	Booked      *Booking `json:"booked,omitempty"`
	WorkflowID  string   `json:"workflowId,omitempty"`
	CreatedAt   int64    `json:"createdAt" unit:"epoch-ms"`
	UpdatedAt   int64    `json:"updatedAt" unit:"epoch-ms"`
	EndedAt     int64    `json:"endedAt,omitempty" unit:"epoch-ms"`

	identity     *string
	createSentAt int64
	readyAt      int64
	driftField   string
	driftCount   int
	secretsHash  string
	authzType    string
}

// Booking is the capacity quota a resource's spec books on its pool.
type Booking struct {
	Quota  string `json:"quota"`
	Amount int    `json:"amount"`
}

func msOf(col string) string { return `(floor(extract(epoch FROM ` + col + `) * 1000)::bigint)` }

var columns = `id, tenant_id, owner_identity_id, project_id, pool_id, provider_account_id, provider, kind, family, name,
	description, COALESCE(parent_id, ''), region, spec, version, applied_version, state, desired, message, reason,
	provider_id, provider_status, outputs, secret_outputs, adopted, (adopted AND taken_over_at IS NULL), observe_only,
	booked_quota, booked_amount, ` + msOf("created_at") + `, ` + msOf("updated_at") + `, COALESCE(` + msOf("ended_at") + `, 0),
	identity, COALESCE(` + msOf("create_sent_at") + `, 0),
	COALESCE(` + msOf("ready_at") + `, 0), secrets_sent_hash, authz_type`

func scan(row pgx.Row) (Resource, error) {
	var r Resource
	var quota string
	var amount int
	err := row.Scan(&r.ID, &r.TenantID, &r.OwnerIdentityID, &r.ProjectID, &r.PoolID, &r.ProviderAccountID, &r.Provider,
		&r.Kind, &r.Family, &r.Name, &r.Description, &r.ParentID, &r.Region, &r.Spec, &r.Version, &r.AppliedVersion,
		&r.State, &r.Desired, &r.Message, &r.Reason, &r.ProviderID, &r.ProviderStatus, &r.Outputs, &r.SecretOutputs,
		&r.Adopted, &r.Adopting, &r.ObserveOnly, &quota, &amount, &r.CreatedAt, &r.UpdatedAt, &r.EndedAt,
		&r.identity, &r.createSentAt, &r.readyAt, &r.secretsHash, &r.authzType)
	if err != nil {
		return Resource{}, err
	}
	if quota != "" {
		r.Booked = &Booking{Quota: quota, Amount: amount}
	}
	if r.Outputs == nil {
		r.Outputs = map[string]string{}
	}
	if r.SecretOutputs == nil {
		r.SecretOutputs = map[string]string{}
	}
	if r.State != rules.StateDraft && r.State != rules.StateDenied {
		r.WorkflowID = r.ID
	}
	return r, nil
}

// NotFound is the error of a resource the tenant has not (or cannot see).
func NotFound(id string) error {
	return core.Errorf(core.CodeNotFound, "cloud resource %s not found", id)
}

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// load reads one row by id, whatever its tenant (the reconciler's read);
// lock locks it.
func load(ctx context.Context, tx store.Tx, id string, lock bool) (Resource, error) {
	q := `SELECT ` + columns + ` FROM cloud_resources WHERE id = $1`
	if lock {
		q += ` FOR UPDATE`
	}
	r, err := scan(tx.QueryRow(ctx, q, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Resource{}, NotFound(id)
	}
	return r, err
}

// Load reads one of the tenant's resources, drafts left out (NOT_FOUND
// for another tenant's); lock locks its row.
func Load(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (Resource, error) {
	r, err := load(ctx, tx, id, lock)
	if err != nil {
		return Resource{}, err
	}
	if r.TenantID != tenantID || r.State == rules.StateDraft || r.State == rules.StateDenied {
		return Resource{}, NotFound(id)
	}
	return r, nil
}

// QueueLoad queues Load's read in b (cloudResources.get).
func QueueLoad(b *store.Batch, tenantID, id string) func() (Resource, error) {
	return store.QueueRow(b, func(row pgx.Row) (Resource, error) {
		r, err := scan(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return Resource{}, NotFound(id)
		}
		return r, err
	}, `SELECT `+columns+` FROM cloud_resources WHERE id = $1 AND tenant_id = $2 AND state NOT IN ('draft', 'denied')`, id, tenantID)
}

// Filter narrows a list; "" keeps every value.
type Filter struct {
	PoolID, ProjectID, Kind, Family string
	IncludeEnded                    bool
}

// List reads a page of the tenant's resources visible in its view (an
// ended one has no authorization row: it is the tenant's record), oldest
// first (creation millisecond, then id).
func List(ctx context.Context, tx store.Tx, typ, tenantID string, f Filter, page store.PageQuery) ([]Resource, error) {
	createdMs := msOf("created_at")
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM cloud_resources
		WHERE tenant_id = $1 AND state NOT IN ('draft', 'denied')
			AND ($2 OR state NOT IN ('deleted', 'released'))
			AND ($3 = '' OR pool_id = $3) AND ($4 = '' OR project_id = $4)
			AND ($5 = '' OR kind = $5) AND ($6 = '' OR family = $6)
			AND (state IN ('deleted', 'released') OR `+store.VisibleIn("id", "$1", "$7", false)+`)
			AND ($9 OR (`+createdMs+`, id) > ($10, $11))
		ORDER BY `+createdMs+`, id LIMIT $8`,
		tenantID, f.IncludeEnded, f.PoolID, f.ProjectID, f.Kind, f.Family, typ, page.Fetch(), page.First(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return collect(rows)
}

// publish records one of the resource's events in tx.
func publish(ctx context.Context, tx store.Tx, r Resource, event string, data map[string]any) error {
	if data == nil {
		data = map[string]any{}
	}
	data["kind"], data["poolId"], data["state"] = r.Kind, r.PoolID, r.State
	return store.PublishEvent(ctx, tx, store.Event{TenantID: r.TenantID, Type: event, ResourceType: ResourceType,
		ResourceID: r.ID, ProjectID: r.ProjectID, Data: data})
}

// lockTenantKind serializes the creates of one tenant's kind (name,
// maxPerKind) to the commit.
func lockTenantKind(ctx context.Context, tx store.Tx, tenantID, kind string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "cloud-resource-kind:"+tenantID+":"+kind)
	return err
}

func wrap(err error, what string) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("cloud resources: %s: %w", what, err)
}

func collect(rows pgx.Rows) ([]Resource, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Resource, error) { return scan(row) })
}

// RecordedProviderIDs maps those of providerIDs that a live resource of
// kind on the account records to that resource's id (any tenant's: a
// provider resource is recorded once per account).
func RecordedProviderIDs(ctx context.Context, tx store.Tx, accountID, kind string, providerIDs []string) (map[string]string, error) {
	rows, err := tx.Query(ctx, `SELECT provider_id, id FROM cloud_resources
		WHERE provider_account_id = $1 AND kind = $2 AND provider_id = ANY($3)
			AND state NOT IN ('draft', 'denied', 'deleted', 'released')`, accountID, kind, providerIDs)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var pid, id string
		if err := rows.Scan(&pid, &id); err != nil {
			return nil, err
		}
		out[pid] = id
	}
	return out, rows.Err()
}

// Recorded is the resource that records a provider resource.
type Recorded struct {
	ID, TenantID string
}

// RecordedOnAccount maps kind + "\x00" + provider id of the live
// resources of the account among providerIDs to what records them.
func RecordedOnAccount(ctx context.Context, tx store.Tx, accountID string, providerIDs []string) (map[string]Recorded, error) {
	rows, err := tx.Query(ctx, `SELECT kind, provider_id, id, tenant_id FROM cloud_resources
		WHERE provider_account_id = $1 AND provider_id = ANY($2)
			AND state NOT IN ('draft', 'denied', 'deleted', 'released')`, accountID, providerIDs)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]Recorded{}
	for rows.Next() {
		var kind, pid string
		var r Recorded
		if err := rows.Scan(&kind, &pid, &r.ID, &r.TenantID); err != nil {
			return nil, err
		}
		out[kind+"\x00"+pid] = r
	}
	return out, rows.Err()
}

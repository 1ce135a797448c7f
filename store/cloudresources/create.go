package cloudresources

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	rules "github.com/better-compute/better-compute/core/cloudresources"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/budgets"
	"github.com/better-compute/better-compute/store/pools"
)

// Types are the catalog's full names of the types a resource's
// authorization row names: its own and its parent pool's.
type Types struct {
	Resource, Pool string
}

// Request is a create (or an adopt) as the API checked it against the
// kind's manifest: the spec is valid, Family, Region, Identity and
// Booking are the manifest's reading of it.
type Request struct {
	Pool    pools.Pool
	Kind    string
	Family  string
	Name    string
	Region  string
	Spec    json.RawMessage
	Project string
	// Description is better-compute's alone.
	Description string
	// ParentID and ParentKind: a kind with a parent names a resource of
	// ParentKind on the same account.
	ParentID, ParentKind string
	// Identity is the value that is unique per parent (nil: the kind has
	// none; "" for one per parent).
	Identity *string
	Booking  *Booking
	// ProviderID is set by adopt: the provider's resource taken over.
	ProviderID string
	Provider   string
}

// Draft writes the admission's draft and its authorization row (decided
// on with kind, family, provider, providerAccountId, poolId, region and
// projectId). A parent that is not a live resource of the parent kind on
// the pool's account, being deleted or released, is refused here.
func Draft(ctx context.Context, tx store.Tx, types Types, tenantID, draftID, ownerID string, in Request) (store.AuthzResource, error) {
	if in.Project != "" {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM projects WHERE id = $1 AND tenant_id = $2 AND archived_at IS NULL`, in.Project, tenantID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.AuthzResource{}, core.Errorf(core.CodeNotFound, "project %s not found", in.Project)
		} else if err != nil {
			return store.AuthzResource{}, err
		}
	}
	if in.ParentID != "" {
		if _, err := liveParent(ctx, tx, tenantID, in, false); err != nil {
			return store.AuthzResource{}, err
		}
	}
	var parent *string
	if in.ParentID != "" {
		parent = &in.ParentID
	}
	var quota string
	amount := 0
	if in.Booking != nil {
		quota, amount = in.Booking.Quota, in.Booking.Amount
	}
	spec := in.Spec
	if len(spec) == 0 {
		spec = json.RawMessage(`{}`)
	}
	adopted := in.ProviderID != ""
	if _, err := tx.Exec(ctx, `INSERT INTO cloud_resources (id, tenant_id, owner_identity_id, project_id, pool_id,
			provider_account_id, provider, kind, family, name, description, parent_id, identity, region, spec,
			state, provider_id, adopted, observe_only, booked_quota, booked_amount, authz_type)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, 'draft', $16, $17, $17, $18, $19, $20)`,
		draftID, tenantID, ownerID, in.Project, in.Pool.ID, in.Pool.ProviderAccountID, in.Provider, in.Kind, in.Family,
		in.Name, in.Description, parent, in.Identity, in.Region, spec, in.ProviderID, adopted, quota, amount, types.Resource); err != nil {
		return store.AuthzResource{}, wrap(err, "writing the draft")
	}
	row := authzRow(types, tenantID, draftID, ownerID, in)
	return row, store.PutAuthzResource(ctx, tx, row)
}

func authzRow(types Types, tenantID, id, ownerID string, in Request) store.AuthzResource {
	attrs := map[string]any{"kind": in.Kind, "family": in.Family, "provider": in.Provider,
		"providerAccountId": in.Pool.ProviderAccountID, "poolId": in.Pool.ID, "region": in.Region}
	if in.Project != "" {
		attrs["projectId"] = in.Project
	}
	return store.AuthzResource{Type: types.Resource, ID: id, TenantID: tenantID, OwnerID: ownerID,
		ParentType: types.Pool, ParentID: in.Pool.ID, Attributes: attrs}
}

// liveParent reads the parent a request names: one of the tenant's
// resources of the parent kind on the same account, neither ended nor
// being deleted or released; anything else is INVALID_INPUT on parentId.
func liveParent(ctx context.Context, tx store.Tx, tenantID string, in Request, lock bool) (Resource, error) {
	p, err := load(ctx, tx, in.ParentID, lock)
	switch {
	case errors.Is(err, core.ErrNotFound) || (err == nil && (p.TenantID != tenantID || p.State == rules.StateDraft || p.State == rules.StateDenied)):
		return Resource{}, badField("parentId", "parent", "cloud resource %s not found", in.ParentID)
	case err != nil:
		return Resource{}, err
	case p.Kind != in.ParentKind:
		return Resource{}, badField("parentId", "parent", "a %s lives in a %s; %s is a %s", in.Kind, in.ParentKind, p.ID, p.Kind)
	case p.ProviderAccountID != in.Pool.ProviderAccountID:
		return Resource{}, badField("parentId", "parent", "%s is on another provider account than pool %s", p.ID, in.Pool.ID)
	case rules.Ended(p.State) || p.Desired != rules.DesiredPresent:
		return Resource{}, badField("parentId", "parent", "%s is %s", p.ID, p.State)
	}
	return p, nil
}

// Limits are what a create is held to after the decision.
type Limits struct {
	// Quotas are the module's caps of each kind.
	Quotas rules.Quotas
}

// Complete admits the decided draft: under the tenant's kind lock, its
// name must be free among the tenant's live resources of the kind
// (CONFLICT), its identity within the parent free (CONFLICT reason
// identity, with the resourceId holding it), the tenant under its cap of
// the kind (QUOTA_EXCEEDED with details.limit; one being deleted still
// counts); then the capacity it books fits the offer's quota, the offer
// admits it (suspended, region) and the tenant's budgets do unless the
// pool bills nothing. draft -> pending, cloud.resource.created (adopted
// for an adopt). A replay answers the row as it is.
func Complete(ctx context.Context, tx store.Tx, tenantID, id string, limits Limits) (Resource, error) {
	r, err := load(ctx, tx, id, true)
	if err != nil {
		return Resource{}, err
	}
	if r.TenantID != tenantID {
		return Resource{}, NotFound(id)
	}
	if r.State != rules.StateDraft {
		return r, nil
	}
	if err := lockTenantKind(ctx, tx, tenantID, r.Kind); err != nil {
		return Resource{}, err
	}
	var holder string
	err = tx.QueryRow(ctx, `SELECT id FROM cloud_resources WHERE tenant_id = $1 AND kind = $2 AND name = $3
		AND state NOT IN ('draft', 'denied', 'deleted', 'released') LIMIT 1`, tenantID, r.Kind, r.Name).Scan(&holder)
	if err == nil {
		return Resource{}, core.Errorf(core.CodeConflict, "a %s named %s exists", r.Kind, r.Name).
			WithDetails(map[string]any{"field": "name", "resourceId": holder})
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return Resource{}, err
	}
	if r.ParentID != "" {
		var parentKind string
		if err := tx.QueryRow(ctx, `SELECT kind FROM cloud_resources WHERE id = $1`, r.ParentID).Scan(&parentKind); err != nil {
			return Resource{}, err
		}
		pool, err := pools.View(ctx, tx, tenantID, r.PoolID)
		if err != nil {
			return Resource{}, err
		}
		if _, err := liveParent(ctx, tx, tenantID, Request{Pool: pool, Kind: r.Kind, ParentID: r.ParentID, ParentKind: parentKind}, true); err != nil {
			return Resource{}, err
		}
		if r.identity != nil {
			err := tx.QueryRow(ctx, `SELECT id FROM cloud_resources WHERE parent_id = $1 AND kind = $2 AND identity = $3
				AND state NOT IN ('draft', 'denied', 'deleted', 'released') LIMIT 1`, r.ParentID, r.Kind, *r.identity).Scan(&holder)
			if err == nil {
				return Resource{}, core.Errorf(core.CodeConflict, "%s already has this %s", r.ParentID, r.Kind).
					WithDetails(map[string]any{"reason": "identity", "resourceId": holder})
			} else if !errors.Is(err, pgx.ErrNoRows) {
				return Resource{}, err
			}
		}
	}
	var count int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM cloud_resources WHERE tenant_id = $1 AND kind = $2
		AND state NOT IN ('draft', 'denied', 'deleted', 'released')`, tenantID, r.Kind).Scan(&count); err != nil {
		return Resource{}, err
	}
	if limit := limits.Quotas.Of(r.Kind); count >= limit {
		return Resource{}, core.Errorf(core.CodeQuotaExceeded, "the tenant holds %d of its %d %s resources", count, limit, r.Kind).
			WithDetails(map[string]any{"resource": r.Kind, "limit": limit, "inUse": count})
	}
	pool, err := pools.View(ctx, tx, tenantID, r.PoolID)
	if err != nil {
		return Resource{}, err
	}
	if r.Booked != nil {
		if err := checkBooking(ctx, tx, tenantID, pool, r.ID, *r.Booked, r.Booked.Amount); err != nil {
			return Resource{}, err
		}
	}
	if err := pools.CheckOffer(pool, r.Region); err != nil {
		return Resource{}, err
	}
	if pool.BillingMode != pools.BillingNone {
		if err := budgets.Check(ctx, tx, tenantID, rules.MeterHours); err != nil {
			return Resource{}, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE cloud_resources SET state = 'pending', updated_at = now() WHERE id = $1`, id); err != nil {
		return Resource{}, err
	}
	r.State = rules.StatePending
	event := rules.EventCreated
	if r.Adopted {
		event = rules.EventAdopted
	}
	if err := publish(ctx, tx, r, event, map[string]any{"name": r.Name}); err != nil {
		return Resource{}, err
	}
	return load(ctx, tx, id, false)
}

// checkBooking keeps the capacity the tenant's resources book on a pool
// offered to it within the offer's quota, once this resource's amount is
// counted as want (its row holds what it booked before). It takes the
// per-(tenant, pool) quota lock reservations and instances take, held to
// the commit. A key the offer does not name grants zero; the pool's own
// tenant has no quota. Over it: QUOTA_EXCEEDED with resource, limit,
// inUse and requested.
func checkBooking(ctx context.Context, tx store.Tx, tenantID string, pool pools.Pool, id string, b Booking, want int) error {
	if pool.TenantID == tenantID || pool.Offer == nil || want <= 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "quota:"+tenantID+":"+pool.ID); err != nil {
		return err
	}
	var others int64
	if err := tx.QueryRow(ctx, `SELECT COALESCE(sum(booked_amount), 0) FROM cloud_resources
		WHERE tenant_id = $1 AND pool_id = $2 AND booked_quota = $3 AND id <> $4
			AND state NOT IN ('draft', 'denied', 'deleted', 'released')`, tenantID, pool.ID, b.Quota, id).Scan(&others); err != nil {
		return err
	}
	limit := pool.Offer.Quota[b.Quota]
	if others+int64(want) > limit {
		return core.Errorf(core.CodeQuotaExceeded, "%d %s booked plus %d requested exceeds the quota of %d", others, b.Quota, want, limit).
			WithDetails(map[string]any{"resource": b.Quota, "limit": limit, "inUse": others, "requested": want})
	}
	return nil
}

// Deny records a denial on the draft: draft -> denied (ended).
func Deny(ctx context.Context, tx store.Tx, tenantID, id string) error {
	r, err := load(ctx, tx, id, true)
	if err != nil || r.TenantID != tenantID || r.State != rules.StateDraft {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE cloud_resources SET state = 'denied', ended_at = now(), updated_at = now() WHERE id = $1`, id)
	return err
}

// WorkflowStarted records that the resource's workflow was started.
func WorkflowStarted(ctx context.Context, db store.DBTX, id string) error {
	_, err := db.Exec(ctx, `UPDATE cloud_resources SET workflow_started_at = now() WHERE id = $1 AND workflow_started_at IS NULL`, id)
	return err
}

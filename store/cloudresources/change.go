package cloudresources

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	rules "github.com/better-compute/better-compute/core/cloudresources"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
)

// Change is what an update asks of the row, as the API planned it from
// the locked row with the kind's manifest (the merged, valid spec; its
// booking).
type Change struct {
	// Spec is the merged spec (nil: the input named none).
	Spec json.RawMessage
	// Description, when set, replaces it ("" clears it).
	Description *string
	// Booking is the merged spec's booking, for a kind that books.
	Booking *Booking
}

// Update applies a tenant's update. A resource being deleted or released
// is INVALID_STATE; an adopted one's spec cannot change before its
// takeover completed (INVALID_STATE, reason adopting). plan turns the
// locked row into the change (its errors, replaceRequired among them,
// refuse the update). A spec change ends an adopted resource's
// observation, and a ready or failed resource goes updating
// (cloud.resource.updating). Growth of a booking is charged here
// (QUOTA_EXCEEDED refuses the update); a shrink is returned once the
// provider applied the spec. Every update bumps version.
func Update(ctx context.Context, tx store.Tx, tenantID, id string, specGiven bool, plan func(Resource) (Change, error)) (Resource, error) {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Resource{}, err
	}
	if r.Desired != rules.DesiredPresent || rules.Ended(r.State) {
		return Resource{}, core.Errorf(core.CodeInvalidState, "cloud resource %s is being %s", r.ID, endingWord(r)).
			WithDetails(map[string]any{"reason": r.Desired, "state": r.State})
	}
	if specGiven && r.Adopting {
		return Resource{}, core.Errorf(core.CodeInvalidState, "cloud resource %s is being adopted: its spec can change once the takeover completed", r.ID).
			WithDetails(map[string]any{"reason": "adopting"})
	}
	c, err := plan(r)
	if err != nil {
		return Resource{}, err
	}
	specChanged := c.Spec != nil && !sameJSON(c.Spec, r.Spec)
	booked := 0
	if r.Booked != nil {
		booked = r.Booked.Amount
	}
	if specChanged && c.Booking != nil && c.Booking.Amount > booked {
		pool, err := pools.View(ctx, tx, tenantID, r.PoolID)
		if err != nil {
			return Resource{}, err
		}
		if err := checkBooking(ctx, tx, tenantID, pool, r.ID, *c.Booking, c.Booking.Amount); err != nil {
			return Resource{}, err
		}
		booked = c.Booking.Amount
	}
	state := r.State
	if specChanged && (r.State == rules.StateReady || r.State == rules.StateError) {
		state = rules.StateUpdating
	}
	spec := r.Spec
	if specChanged {
		spec = c.Spec
	}
	desc := r.Description
	if c.Description != nil {
		desc = *c.Description
	}
	if _, err := tx.Exec(ctx, `UPDATE cloud_resources SET spec = $2, description = $3, version = version + 1,
			state = $4, booked_amount = $5, observe_only = observe_only AND NOT $6,
			message = CASE WHEN $4 = 'updating' THEN '' ELSE message END,
			reason = CASE WHEN $4 = 'updating' THEN '' ELSE reason END,
			drift_field = CASE WHEN $6 THEN '' ELSE drift_field END, drift_count = CASE WHEN $6 THEN 0 ELSE drift_count END,
			updated_at = now()
		WHERE id = $1`, r.ID, spec, desc, state, booked, specChanged); err != nil {
		return Resource{}, wrap(err, "updating")
	}
	if state == rules.StateUpdating && r.State != rules.StateUpdating {
		r.State = state
		if err := publish(ctx, tx, r, rules.EventUpdating, map[string]any{"version": r.Version + 1}); err != nil {
			return Resource{}, err
		}
	}
	return load(ctx, tx, r.ID, false)
}

func endingWord(r Resource) string {
	if r.Desired == rules.DesiredReleased {
		return "released"
	}
	return "deleted"
}

func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	ca, _ := json.Marshal(x)
	cb, _ := json.Marshal(y)
	return bytes.Equal(ca, cb)
}

// Delete marks the resource and every resource living in it (at any
// depth) for deletion: desired deleted, state deleting, and
// cloud.resource.deleting for each. One already being deleted is answered
// unchanged; one being released is deleted instead. An adopted resource
// whose takeover never completed is let go (released) with no provider
// call. The reconciler deletes children first.
func Delete(ctx context.Context, tx store.Tx, tenantID, id string) (Resource, error) {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Resource{}, err
	}
	if rules.Ended(r.State) || r.Desired == rules.DesiredDeleted {
		return r, nil
	}
	if r.Adopting {
		if err := end(ctx, tx, r, rules.StateReleased, "the takeover never completed: let go without a provider call"); err != nil {
			return Resource{}, err
		}
		return load(ctx, tx, r.ID, false)
	}
	rows, err := tx.Query(ctx, `WITH RECURSIVE tree AS (
			SELECT id FROM cloud_resources WHERE id = $1
			UNION SELECT c.id FROM cloud_resources c JOIN tree t ON c.parent_id = t.id
		)
		SELECT `+columns+` FROM cloud_resources WHERE id IN (SELECT id FROM tree)
			AND state NOT IN ('draft', 'denied', 'deleted', 'released') AND desired <> 'deleted'
		ORDER BY created_at, id FOR UPDATE`, r.ID)
	if err != nil {
		return Resource{}, err
	}
	marked, err := collect(rows)
	if err != nil {
		return Resource{}, err
	}
	for _, m := range marked {
		if err := markDeleting(ctx, tx, m); err != nil {
			return Resource{}, err
		}
	}
	return load(ctx, tx, r.ID, false)
}

// markDeleting sets one live resource's desired state to deleted.
func markDeleting(ctx context.Context, tx store.Tx, r Resource) error {
	if _, err := tx.Exec(ctx, `UPDATE cloud_resources SET desired = 'deleted', state = 'deleting', message = '', reason = '',
		updated_at = now() WHERE id = $1`, r.ID); err != nil {
		return wrap(err, "marking for deletion")
	}
	from := r.State
	r.State = rules.StateDeleting
	return publish(ctx, tx, r, rules.EventDeleting, map[string]any{"from": from})
}

// Release lets a resource go: the reconciler removes its ownership labels
// and leaves it running. A kind the provider cannot release is
// UNSUPPORTED reason release; one the provider has not accepted, one that
// lives in a parent, one with live children, or one being deleted is
// INVALID_STATE; one being released is answered unchanged. An adopted one
// whose takeover never completed is let go at once. Publishes
// cloud.resource.releasing.
func Release(ctx context.Context, tx store.Tx, tenantID, id string, releasable bool) (Resource, error) {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Resource{}, err
	}
	if !releasable {
		return Resource{}, core.Errorf(core.CodeUnsupported, "a %s is owned by its name at the provider and cannot be released: keep it or delete it", r.Kind).
			WithDetails(map[string]any{"reason": "release"})
	}
	switch {
	case r.State == rules.StateReleased || r.Desired == rules.DesiredReleased:
		return r, nil
	case rules.Ended(r.State) || r.Desired == rules.DesiredDeleted:
		return Resource{}, core.Errorf(core.CodeInvalidState, "cloud resource %s is being deleted", r.ID).
			WithDetails(map[string]any{"reason": "deleted", "state": r.State})
	case r.ParentID != "":
		return Resource{}, core.Errorf(core.CodeInvalidState, "a %s lives in %s: release that", r.Kind, r.ParentID).
			WithDetails(map[string]any{"reason": "parent", "parentId": r.ParentID})
	case r.Adopting:
		if err := end(ctx, tx, r, rules.StateReleased, "the takeover never completed: let go without a provider call"); err != nil {
			return Resource{}, err
		}
		return load(ctx, tx, r.ID, false)
	case r.ProviderID == "":
		return Resource{}, core.Errorf(core.CodeInvalidState, "the provider has not accepted cloud resource %s yet: delete it instead", r.ID).
			WithDetails(map[string]any{"reason": "notAccepted", "state": r.State})
	}
	var child string
	err = tx.QueryRow(ctx, `SELECT id FROM cloud_resources WHERE parent_id = $1
		AND state NOT IN ('draft', 'denied', 'deleted', 'released') ORDER BY created_at LIMIT 1`, r.ID).Scan(&child)
	if err == nil {
		return Resource{}, core.Errorf(core.CodeInvalidState, "cloud resource %s has live children (%s): delete or release them first", r.ID, child).
			WithDetails(map[string]any{"reason": "children", "resourceId": child})
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return Resource{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE cloud_resources SET desired = 'released', updated_at = now() WHERE id = $1`, r.ID); err != nil {
		return Resource{}, wrap(err, "marking for release")
	}
	if err := publish(ctx, tx, r, rules.EventReleasing, nil); err != nil {
		return Resource{}, err
	}
	return load(ctx, tx, r.ID, false)
}

// Descendants are the live resources living in id, at any depth, oldest
// first.
func Descendants(ctx context.Context, tx store.Tx, id string) ([]Resource, error) {
	rows, err := tx.Query(ctx, `WITH RECURSIVE tree AS (
			SELECT id FROM cloud_resources WHERE parent_id = $1
			UNION SELECT c.id FROM cloud_resources c JOIN tree t ON c.parent_id = t.id
		)
		SELECT `+columns+` FROM cloud_resources WHERE id IN (SELECT id FROM tree)
			AND state NOT IN ('draft', 'denied', 'deleted', 'released')
		ORDER BY created_at, id`, id)
	if err != nil {
		return nil, err
	}
	return collect(rows)
}

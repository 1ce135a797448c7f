package cloudresources

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	rules "github.com/better-compute/better-compute/core/cloudresources"
	"github.com/better-compute/better-compute/store"
)

// The reconciler's writes. Each runs in the activity's transaction, with
// the row locked, and records one fact the provider answered; state
// changes publish their events in the same transaction.

// Target is what one reconciler round reads of a resource.
type Target struct {
	Resource
	// ParentProviderID is the parent's provider id ("" until the provider
	// accepted the parent), ParentEnded whether the parent is gone.
	ParentProviderID string
	ParentEnded      bool
	// LiveChildren are the children not yet deleted or released.
	LiveChildren []string
	BillingMode  string
	// CreateSentAgo is how long ago a create was sent (CreateSent false:
	// none since the last acceptance).
	CreateSent    bool
	CreateSentAgo time.Duration
	// SecretsHash is the hash of the SecretRefs' values last sent.
	SecretsHash string
}

// LoadTarget reads and locks the resource with its parent's provider id,
// its live children and its pool's billing mode.
func LoadTarget(ctx context.Context, tx store.Tx, id string) (Target, error) {
	r, err := load(ctx, tx, id, true)
	if err != nil {
		return Target{}, err
	}
	t := Target{Resource: r, SecretsHash: r.secretsHash}
	if r.createSentAt > 0 {
		t.CreateSent = true
		var ms int64
		if err := tx.QueryRow(ctx, `SELECT (floor(extract(epoch FROM now() - create_sent_at) * 1000))::bigint FROM cloud_resources WHERE id = $1`,
			id).Scan(&ms); err != nil {
			return Target{}, err
		}
		t.CreateSentAgo = time.Duration(ms) * time.Millisecond
	}
	if r.ParentID != "" {
		var state string
		if err := tx.QueryRow(ctx, `SELECT provider_id, state FROM cloud_resources WHERE id = $1`, r.ParentID).
			Scan(&t.ParentProviderID, &state); err != nil {
			return Target{}, wrap(err, "reading the parent")
		}
		t.ParentEnded = rules.Ended(state)
	}
	rows, err := tx.Query(ctx, `SELECT id FROM cloud_resources WHERE parent_id = $1
		AND state NOT IN ('draft', 'denied', 'deleted', 'released') ORDER BY id`, id)
	if err != nil {
		return Target{}, err
	}
	if t.LiveChildren, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return Target{}, err
	}
	if err := tx.QueryRow(ctx, `SELECT billing_mode FROM pools WHERE id = $1`, r.PoolID).Scan(&t.BillingMode); err != nil {
		return Target{}, wrap(err, "reading the pool")
	}
	return t, nil
}

// RecordCreateSent journals a create about to be sent (on its own
// connection, committed before the call): a worker that dies with the
// answer unread finds it, and looks the resource up by name and owner
// before it ever sends another.
func RecordCreateSent(ctx context.Context, db store.DBTX, id string) error {
	_, err := db.Exec(ctx, `UPDATE cloud_resources SET create_sent_at = now() WHERE id = $1`, id)
	return err
}

// ForgetCreateSent clears the journal once the provider answered that
// nothing was made (the create was refused, or never sent).
func ForgetCreateSent(ctx context.Context, db store.DBTX, id string) error {
	_, err := db.Exec(ctx, `UPDATE cloud_resources SET create_sent_at = NULL WHERE id = $1`, id)
	return err
}

// bills says whether a resource bills cloud.resource.hours: one that
// lives in another (a database user, pool, firewall, replica) bills no
// fee of its own, and a pool billing nothing bills nothing.
func bills(t Target) bool { return t.ParentID == "" && rules.Bills(t.BillingMode) }

// openBilling starts the resource's hours, once.
func openBilling(ctx context.Context, tx store.Tx, t Target) error {
	if !bills(t) {
		return nil
	}
	return store.OpenUsage(ctx, tx, store.UsageInterval{ReservationID: t.ID, TenantID: t.TenantID, ProjectID: t.ProjectID,
		PoolID: t.PoolID, GPUModel: t.Kind, Class: UsageClass, Units: 1})
}

// UsageClass is the class of a resource's metering intervals (their
// gpu_model column holds its kind); budgets read cloud.resource.hours
// from it.
const UsageClass = "cloud.resource"

// RecordAccepted records the provider's id of a resource it accepted
// (created, or found again by name and owner after a lost answer):
// pending -> provisioning, and the resource's hours start (a created
// one's; an adopted one's start at its first ready).
func RecordAccepted(ctx context.Context, tx store.Tx, t Target, providerID string) error {
	if _, err := tx.Exec(ctx, `UPDATE cloud_resources SET provider_id = $2, create_sent_at = NULL,
			accepted_at = COALESCE(accepted_at, now()),
			state = CASE WHEN state = 'pending' THEN 'provisioning' ELSE state END, updated_at = now()
		WHERE id = $1`, t.ID, providerID); err != nil {
		return wrap(err, "recording the provider id")
	}
	if t.Adopted {
		return nil
	}
	return openBilling(ctx, tx, t)
}

// Observation is what one observation of the provider found.
type Observation struct {
	ProviderStatus string
	// Ready says the resource serves with the spec of Applied (the
	// version the provider now runs).
	Ready   bool
	Applied int64
	Outputs map[string]string
	// SecretRefs are the secret outputs sealed in this run (merged into
	// the recorded ones).
	SecretRefs map[string]string
	// SpecReported, for an adopted resource being taken over or still
	// observed only, is the spec the provider reports.
	SpecReported []byte
	TakenOver    bool
	// SecretsHash is the hash of the SecretRefs' values the provider now
	// holds ("" keeps the recorded one).
	SecretsHash string
	// Booking is the applied spec's booking: a shrink is returned here.
	Booking *Booking
}

// RecordObserved writes an observation and moves the state: ready once
// the provider serves the current version (cloud.resource.ready the
// first time, with the names of its outputs and secret outputs;
// cloud.resource.updated after an update), provisioning or updating
// while it converges. An error is cleared by a ready observation.
func RecordObserved(ctx context.Context, tx store.Tx, t Target, o Observation) (Resource, error) {
	outputs := t.Outputs
	if o.Outputs != nil {
		outputs = o.Outputs
	}
	secretRefs := maps.Clone(t.SecretOutputs)
	maps.Copy(secretRefs, o.SecretRefs)
	spec := t.Spec
	version := t.Version
	if o.SpecReported != nil && (t.Adopting || t.ObserveOnly) {
		spec = o.SpecReported
	}
	applied := max(t.AppliedVersion, o.Applied)
	state := t.State
	converged := o.Ready && applied >= version
	switch {
	case t.Desired != rules.DesiredPresent:
	case converged:
		state = rules.StateReady
	case t.State == rules.StatePending:
		state = rules.StateProvisioning
	}
	booked := -1
	if converged && o.Booking != nil && t.Booked != nil && o.Booking.Amount < t.Booked.Amount {
		booked = o.Booking.Amount
	}
	hash := t.SecretsHash
	if o.SecretsHash != "" {
		hash = o.SecretsHash
	}
	if _, err := tx.Exec(ctx, `UPDATE cloud_resources SET provider_status = $2, outputs = $3, secret_outputs = $4,
			spec = $5, applied_version = $6, state = $7,
			message = CASE WHEN $7 = 'ready' THEN '' ELSE message END, reason = CASE WHEN $7 = 'ready' THEN '' ELSE reason END,
			taken_over_at = CASE WHEN $8 THEN COALESCE(taken_over_at, now()) ELSE taken_over_at END,
			secrets_sent_hash = $9, booked_amount = CASE WHEN $10 >= 0 THEN $10 ELSE booked_amount END,
			ready_at = CASE WHEN $7 = 'ready' THEN COALESCE(ready_at, now()) ELSE ready_at END,
			updated_at = CASE WHEN state <> $7 THEN now() ELSE updated_at END
		WHERE id = $1`, t.ID, o.ProviderStatus, outputs, secretRefs, spec, applied, state, o.TakenOver, hash, booked); err != nil {
		return Resource{}, wrap(err, "recording an observation")
	}
	r := t.Resource
	r.State = state
	if state == rules.StateReady && t.State != rules.StateReady {
		switch {
		case t.readyAt == 0:
			if err := publish(ctx, tx, r, rules.EventReady, map[string]any{
				"outputs": slices.Sorted(maps.Keys(outputs)), "secretOutputs": slices.Sorted(maps.Keys(secretRefs))}); err != nil {
				return Resource{}, err
			}
			if t.Adopted {
				if err := openBilling(ctx, tx, t); err != nil {
					return Resource{}, err
				}
			}
		case t.State == rules.StateUpdating:
			if err := publish(ctx, tx, r, rules.EventUpdated, map[string]any{"version": applied}); err != nil {
				return Resource{}, err
			}
		}
	}
	return load(ctx, tx, t.ID, false)
}

// MarkError records that the resource failed (state error, with reason
// and message), publishing cloud.resource.failed when it was not failed
// already. A resource being deleted stays deleting, with the message.
func MarkError(ctx context.Context, tx store.Tx, t Target, reason, message string) error {
	state := rules.StateError
	if t.Desired == rules.DesiredDeleted {
		state = rules.StateDeleting
	}
	if _, err := tx.Exec(ctx, `UPDATE cloud_resources SET state = $2, reason = $3, message = $4, updated_at = now() WHERE id = $1`,
		t.ID, state, reason, message); err != nil {
		return wrap(err, "marking failed")
	}
	if state != rules.StateError || (t.State == rules.StateError && t.Reason == reason) {
		return nil
	}
	r := t.Resource
	r.State = state
	return publish(ctx, tx, r, rules.EventFailed, map[string]any{"reason": reason, "message": message})
}

// RecordFix notes that an in-place update set field back to the spec's
// value, and answers how many updates in a row fixed that same field
// (the drift-loop breaker's count).
func RecordFix(ctx context.Context, tx store.Tx, id, field string) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `UPDATE cloud_resources SET drift_count = CASE WHEN drift_field = $2 THEN drift_count + 1 ELSE 1 END,
		drift_field = $2 WHERE id = $1 RETURNING drift_count`, id, field).Scan(&n)
	return n, err
}

// ClearFixes forgets the breaker's count once an observation found the
// provider holding the spec.
func ClearFixes(ctx context.Context, tx store.Tx, id string) error {
	_, err := tx.Exec(ctx, `UPDATE cloud_resources SET drift_field = '', drift_count = 0 WHERE id = $1 AND drift_count > 0`, id)
	return err
}

// WithdrawRelease keeps a resource the provider refused to let go
// managed: desired present again, in error with the reason until the
// next refresh.
func WithdrawRelease(ctx context.Context, tx store.Tx, t Target, message string) error {
	if _, err := tx.Exec(ctx, `UPDATE cloud_resources SET desired = 'present' WHERE id = $1`, t.ID); err != nil {
		return err
	}
	t.Desired = rules.DesiredPresent
	return MarkError(ctx, tx, t, "releaseRefused", message)
}

// End finishes a deletion or a release: the row ends (deleted or
// released), its authorization row is removed, its hours stop and the
// quota its spec booked is returned (ended rows book nothing), and
// cloud.resource.deleted or .released is published. The caller destroys
// its sealed secrets in the same transaction. Ending twice does nothing.
func End(ctx context.Context, tx store.Tx, t Target, state string) error {
	if rules.Ended(t.State) {
		return nil
	}
	return end(ctx, tx, t.Resource, state, "")
}

func end(ctx context.Context, tx store.Tx, r Resource, state, message string) error {
	if state != rules.StateDeleted && state != rules.StateReleased {
		return fmt.Errorf("cloud resources: ending %s as %s", r.ID, state)
	}
	if _, err := tx.Exec(ctx, `UPDATE cloud_resources SET state = $2, message = $3, reason = '', ended_at = now(), updated_at = now(),
		secret_outputs = '{}' WHERE id = $1`, r.ID, state, message); err != nil {
		return wrap(err, "ending")
	}
	if err := store.DeleteAuthzResource(ctx, tx, r.authzType, r.ID); err != nil {
		return err
	}
	if err := store.CloseUsage(ctx, tx, r.ID); err != nil {
		return err
	}
	event := rules.EventDeleted
	if state == rules.StateReleased {
		event = rules.EventReleased
	}
	from := r.State
	r.State = state
	return publish(ctx, tx, r, event, map[string]any{"from": from})
}

// Owed is a resource whose workflow should be running.
type Owed struct {
	TenantID, ID string
	Started      bool // its start was recorded
}

// OwedWorkflows are up to limit live resources with ids after afterID, in
// id order, changed longer than grace ago: those whose workflow start is
// not recorded, and those whose start is (the reconciler starts a closed
// run again, so no row is stranded).
func OwedWorkflows(ctx context.Context, tx store.Tx, grace time.Duration, afterID string, limit int) ([]Owed, error) {
	rows, err := tx.Query(ctx, `SELECT tenant_id, id, workflow_started_at IS NOT NULL FROM cloud_resources
		WHERE state NOT IN ('draft', 'denied', 'deleted', 'released') AND id > $3
			AND (workflow_started_at IS NOT NULL OR updated_at < now() - $1 * interval '1 millisecond')
		ORDER BY id LIMIT $2`, grace.Milliseconds(), limit, afterID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Owed, error) {
		var o Owed
		return o, r.Scan(&o.TenantID, &o.ID, &o.Started)
	})
}

// SweepDrafts deletes up to 1000 drafts older than maxAge (an admission
// that was never completed nor retried), with their idempotency and
// authorization rows.
func SweepDrafts(ctx context.Context, tx store.Tx, maxAge time.Duration) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `WITH stale AS (
			SELECT r.id, r.tenant_id FROM cloud_resources r
			WHERE r.state = 'draft' AND r.created_at < now() - $1 * interval '1 millisecond'
				AND NOT EXISTS (SELECT 1 FROM cloud_resources c WHERE c.parent_id = r.id)
			ORDER BY r.created_at LIMIT 1000 FOR UPDATE SKIP LOCKED),
		keys AS (DELETE FROM idempotency_keys k USING stale
			WHERE k.tenant_id = stale.tenant_id AND k.resource_id = stale.id AND k.completed_at IS NULL RETURNING 1),
		authz AS (DELETE FROM authz_resources z USING stale WHERE z.id = stale.id AND z.tenant_id = stale.tenant_id RETURNING 1),
		drafts AS (DELETE FROM cloud_resources r USING stale WHERE r.id = stale.id RETURNING 1)
		SELECT count(*) FROM drafts`, maxAge.Milliseconds()).Scan(&n)
	return n, err
}

package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/reservations"
)

// The reservations' repository functions that both the API and the
// reservation workflow's activities use. SetReservationState is the one
// writer of reservations.state: every change goes through
// core/reservations.Transition and, in the same transaction, publishes the
// change as an event and opens or closes the reservation's usage interval.

// LockReservationState reads and locks a reservation's state; another
// tenant's reservation, or none, is NOT_FOUND.
func LockReservationState(ctx context.Context, tx Tx, tenantID, id string) (reservations.State, error) {
	var s string
	err := tx.QueryRow(ctx, `SELECT state FROM reservations WHERE id = $1 AND tenant_id = $2 FOR UPDATE`, id, tenantID).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", core.Errorf(core.CodeNotFound, "reservation %s not found", id)
	}
	return reservations.State(s), err
}

// SetReservationState moves reservation id from one state to the next
// (INVALID_STATE when the table has no such edge, CONFLICT when the row is
// no longer in from). failure, when not nil, records why it failed.
// Reaching a terminal state records ended_at, and the end reason when no
// step recorded one (SetReservationEndReason); every change's event
// carries the end reason once there is one.
func SetReservationState(ctx context.Context, tx Tx, tenantID, id string, from, to reservations.State, failure json.RawMessage) error {
	if err := reservations.Transition(from, to); err != nil {
		return err
	}
	var defaultReason *string
	if r := reservations.DefaultEndReason(to); r != "" {
		defaultReason = (*string)(&r)
	}
	var poolID, projectID, class string
	var endReason *string
	err := tx.QueryRow(ctx, `UPDATE reservations SET state = $4, failure = COALESCE($5, failure), updated_at = now(),
			end_reason = COALESCE(end_reason, $6),
			ended_at = CASE WHEN $7 THEN COALESCE(ended_at, now()) ELSE ended_at END
		WHERE id = $1 AND tenant_id = $2 AND state = $3
		RETURNING pool_id, project_id, COALESCE(devices->>'class', ''), end_reason`,
		id, tenantID, string(from), string(to), failure, defaultReason, reservations.Terminal(to)).
		Scan(&poolID, &projectID, &class, &endReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return core.Errorf(core.CodeConflict, "reservation %s is no longer %s", id, from)
	}
	if err != nil {
		return err
	}
	data := map[string]any{"from": string(from), "to": string(to), "poolId": poolID}
	if failure != nil {
		data["failure"] = failure
	}
	if endReason != nil {
		data["endReason"] = *endReason
	}
	if err := PublishEvent(ctx, tx, Event{TenantID: tenantID, Type: "reservation." + string(to),
		ResourceType: "reservation", ResourceID: id, ProjectID: projectID, Data: data}); err != nil {
		return err
	}
	switch {
	case to == reservations.Active:
		u := UsageInterval{ReservationID: id, TenantID: tenantID, ProjectID: projectID, PoolID: poolID, Class: class}
		if err := tx.QueryRow(ctx, `SELECT p.gpu_model, COALESCE((SELECT sum(cardinality(a.atoms)) FROM allocations a
				WHERE a.reservation_id = $1), 0)
			FROM pools p WHERE p.id = $2`, id, poolID).Scan(&u.GPUModel, &u.Units); err != nil {
			return err
		}
		return OpenUsage(ctx, tx, u)
	case from == reservations.Active || reservations.Terminal(to):
		return CloseUsage(ctx, tx, id)
	}
	return nil
}

// SetReservationEndReason records why the reservation is ending, before
// the step that begins the ending walks its states; the first reason
// recorded is kept, so a release that races the window's end keeps
// whichever began first.
func SetReservationEndReason(ctx context.Context, tx Tx, id string, reason reservations.EndReason) error {
	_, err := tx.Exec(ctx, `UPDATE reservations SET end_reason = COALESCE(end_reason, $2) WHERE id = $1`, id, string(reason))
	return err
}

// CutReservationBookings frees a reservation's atoms from now on: a booking
// that has begun ends now ([lower, now)); one that has not begun is deleted,
// as an empty range would break device_bookings' CHECK (NOT isempty(during)).
// now() is the transaction's start, the same instant for every row, so
// cutting twice changes nothing the second time. Allocations that were
// bound get their cdi.withdraw command in the same transaction.
func CutReservationBookings(ctx context.Context, tx Tx, tenantID, id string) error {
	return cutBookings(ctx, tx, tenantID, id, nil)
}

// cutBookings frees the reservation's atoms from at (now when nil), and
// ends what runs on them (reservationCutHooks).
func cutBookings(ctx context.Context, tx Tx, tenantID, id string, at *time.Time) error {
	if err := queueUnbindCommands(ctx, tx, id); err != nil {
		return err
	}
	for _, hook := range reservationCutHooks {
		if err := hook(ctx, tx, tenantID, id); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM device_bookings b USING allocations a
		WHERE a.reservation_id = $1 AND a.tenant_id = $2 AND b.allocation_id = a.id AND lower(b.during) >= COALESCE($3, now())`,
		id, tenantID, at); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE device_bookings b SET during = tstzrange(lower(b.during), COALESCE($3, now()))
		FROM allocations a
		WHERE a.reservation_id = $1 AND a.tenant_id = $2 AND b.allocation_id = a.id
			AND (upper_inf(b.during) OR upper(b.during) > COALESCE($3, now()))`, id, tenantID, at)
	return err
}

// reservationCutHooks run in every transaction that cuts a reservation's
// bookings: each ending (release, expiry, lease, cancel, failure, a lost
// node, a preemption) and the re-placement of one not yet bound. The
// domains that run things on a reservation's atoms register one
// (OnReservationCut), since store cannot import them.
var reservationCutHooks []func(ctx context.Context, tx Tx, tenantID, reservationID string) error

// OnReservationCut registers hook to run, in the cutting transaction,
// whenever a reservation's bookings are cut; it is meant for a package's
// init, before any transaction runs.
func OnReservationCut(hook func(ctx context.Context, tx Tx, tenantID, reservationID string) error) {
	reservationCutHooks = append(reservationCutHooks, hook)
}

// PreemptReservation ends a spot reservation whose atoms reservation by,
// starting at at, takes: one not begun is cancelled, an active (or expired)
// one released, with the failure {code UNAVAILABLE, reason preempted, by};
// its bookings are cut at at. A reservation already ended is left alone.
func PreemptReservation(ctx context.Context, tx Tx, tenantID, id, by string, at time.Time) error {
	from, err := LockReservationState(ctx, tx, tenantID, id)
	if err != nil {
		return err
	}
	failure, err := json.Marshal(map[string]any{"code": core.CodeUnavailable,
		"message": "preempted by reservation " + by, "details": map[string]any{"reason": "preempted", "by": by}})
	if err != nil {
		return err
	}
	var path []reservations.State
	switch from {
	case reservations.AwaitingConfirmation, reservations.Pending, reservations.Placed, reservations.Binding:
		path = []reservations.State{reservations.Cancelled}
	case reservations.Active, reservations.Expired:
		path = []reservations.State{reservations.Releasing, reservations.Released}
	case reservations.Releasing:
		path = []reservations.State{reservations.Released}
	default:
		return nil
	}
	if err := SetReservationEndReason(ctx, tx, id, reservations.EndPreempt); err != nil {
		return err
	}
	for i, to := range path {
		var f json.RawMessage
		if i == len(path)-1 {
			f = failure
		}
		if err := SetReservationState(ctx, tx, tenantID, id, from, to, f); err != nil {
			return err
		}
		from = to
	}
	return cutBookings(ctx, tx, tenantID, id, &at)
}

// UnstartedReservation is a live reservation whose workflow start was not
// recorded: what its workflow needs to start. Times are epoch ms; Active
// says it is already active (or ending), LeaseDeadline when its lease
// lapses (0 without one).
type UnstartedReservation struct {
	TenantID, ID  string
	PoolID        string
	Start, End    int64
	LeaseSeconds  int64
	Active        bool
	LeaseDeadline int64
}

// UnstartedReservations are up to limit live reservations (placed or later,
// not yet ended) whose workflow start has not been recorded for longer than
// grace.
func UnstartedReservations(ctx context.Context, tx Tx, grace time.Duration, limit int) ([]UnstartedReservation, error) {
	rows, err := tx.Query(ctx, `SELECT tenant_id, id, pool_id, (extract(epoch FROM starts_at) * 1000)::bigint,
			(extract(epoch FROM ends_at) * 1000)::bigint, COALESCE(lease_seconds, 0),
			state IN ('active', 'expired', 'releasing'),
			COALESCE((extract(epoch FROM lease_expires_at) * 1000)::bigint, 0)
		FROM reservations
		WHERE workflow_started_at IS NULL AND state IN ('placed', 'binding', 'active', 'expired', 'releasing')
			AND updated_at < now() - $1 * interval '1 millisecond'
		ORDER BY updated_at, id LIMIT $2`, grace.Milliseconds(), limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (UnstartedReservation, error) {
		var u UnstartedReservation
		return u, r.Scan(&u.TenantID, &u.ID, &u.PoolID, &u.Start, &u.End, &u.LeaseSeconds, &u.Active, &u.LeaseDeadline)
	})
}

// StartedLiveReservations are up to limit live reservations with ids after
// afterID, in id order (a page), whose workflow was started and that were
// last changed longer than grace ago: those whose workflow must be running.
func StartedLiveReservations(ctx context.Context, tx Tx, afterID string, grace time.Duration, limit int) ([]UnstartedReservation, error) {
	rows, err := tx.Query(ctx, `SELECT tenant_id, id, pool_id, (extract(epoch FROM starts_at) * 1000)::bigint,
			(extract(epoch FROM ends_at) * 1000)::bigint, COALESCE(lease_seconds, 0),
			state IN ('active', 'expired', 'releasing'),
			COALESCE((extract(epoch FROM lease_expires_at) * 1000)::bigint, 0)
		FROM reservations
		WHERE workflow_started_at IS NOT NULL AND state IN ('placed', 'binding', 'active', 'expired', 'releasing')
			AND id > $1 AND updated_at < now() - $2 * interval '1 millisecond'
		ORDER BY id LIMIT $3`, afterID, grace.Milliseconds(), limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (UnstartedReservation, error) {
		var u UnstartedReservation
		return u, r.Scan(&u.TenantID, &u.ID, &u.PoolID, &u.Start, &u.End, &u.LeaseSeconds, &u.Active, &u.LeaseDeadline)
	})
}

// ReservationLive says whether the reservation is live (placed or later,
// not ended).
func ReservationLive(ctx context.Context, tx Tx, id string) (bool, error) {
	var live bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM reservations WHERE id = $1
		AND state IN ('placed', 'binding', 'active', 'expired', 'releasing'))`, id).Scan(&live)
	return live, err
}

// MarkReservationWorkflowStarted records that the reservation's workflow
// was started; recording it again changes nothing.
func MarkReservationWorkflowStarted(ctx context.Context, tx Tx, id string) error {
	_, err := tx.Exec(ctx, `UPDATE reservations SET workflow_started_at = now() WHERE id = $1 AND workflow_started_at IS NULL`, id)
	return err
}

// OwedReservationStarts are those of ids, admitted reservations, whose
// workflow is owed: placed or later with no start recorded. One that ended
// before its start (cancelled right after its create) is included, so
// every admitted reservation has a run that ends as its row says; a
// replayed id whose start is already recorded is left out.
func OwedReservationStarts(ctx context.Context, tx Tx, ids []string) ([]UnstartedReservation, error) {
	rows, err := tx.Query(ctx, `SELECT tenant_id, id, pool_id, (extract(epoch FROM starts_at) * 1000)::bigint,
			(extract(epoch FROM ends_at) * 1000)::bigint, COALESCE(lease_seconds, 0),
			state IN ('active', 'expired', 'releasing'),
			COALESCE((extract(epoch FROM lease_expires_at) * 1000)::bigint, 0)
		FROM reservations
		WHERE id = ANY($1) AND workflow_started_at IS NULL AND state NOT IN ('draft', 'denied', 'pending', 'awaiting-confirmation')`, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (UnstartedReservation, error) {
		var u UnstartedReservation
		return u, r.Scan(&u.TenantID, &u.ID, &u.PoolID, &u.Start, &u.End, &u.LeaseSeconds, &u.Active, &u.LeaseDeadline)
	})
}

// MarkReservationWorkflowsStarted records, in one statement, that the
// workflows of ids were started (a start already recorded is kept), and
// answers those of the newly recorded whose reservation is no longer live:
// one that ended (a cancel) between the read its start was made from and
// the start, whose workflow may have missed being told.
func MarkReservationWorkflowsStarted(ctx context.Context, tx Tx, ids []string) (ended []string, err error) {
	rows, err := tx.Query(ctx, `UPDATE reservations SET workflow_started_at = now()
		WHERE id = ANY($1) AND workflow_started_at IS NULL
		RETURNING id, state IN ('placed', 'binding', 'active', 'expired', 'releasing')`, ids)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var live bool
		if err := rows.Scan(&id, &live); err != nil {
			return nil, err
		}
		if !live {
			ended = append(ended, id)
		}
	}
	return ended, rows.Err()
}

package reservations

import (
	"context"

	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
)

// A reservation's life after placement. PostgreSQL holds the truth and the
// reservation's workflow (id = the reservation id) drives it; these check
// the row in the call's transaction, and the caller tells the workflow
// once it commits:
//
//	release  active (or expired, releasing) -> releasing -> released, end
//	         reason release, its bookings cut and usage closed, in the
//	         call's transaction, so it works without a live workflow; the
//	         workflow is then told (its release update, whose activity finds
//	         the row released); idempotent on a released reservation
//	cancel   before it is active: -> cancelled, end reason cancel, and its
//	         bookings cut, in the call's transaction; the workflow is then
//	         signalled to stop waiting (a missed signal is found by its
//	         activation activity)
//	renew    restarts an active reservation's allocation lease (the renew
//	         update); it answers the new leaseExpiresAt
//	extend   an admission: the new total duration is written to the
//	         authorization row and decided on (a policy bounding
//	         durationHours sees the extended request), then the extra time
//	         is booked on the same atoms (CONFLICT when another booking holds
//	         them) and the workflow's extend update moves its end (a missed
//	         update is found by its expiry activity, which reads the row)

func stateError(r Reservation, verb, hint string) error {
	details := map[string]any{"state": r.State, "reservationId": r.ID}
	msg := "reservation %s is %s and cannot be %s"
	if hint != "" {
		details["hint"] = hint
		msg += "; use " + hint
	}
	return core.Errorf(core.CodeInvalidState, msg, r.ID, r.State, verb).WithDetails(details)
}

// Release releases the tenant's active reservation in the caller's
// transaction: the end reason release, then active -> releasing ->
// released (an expired or releasing one is carried on), its bookings cut
// from now (queueing the agents' cdi.withdraw) and its usage closed. A
// released one is answered as it is.
func Release(ctx context.Context, tx store.Tx, tenantID, id string) (Reservation, error) {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Reservation{}, err
	}
	from := states.State(r.State)
	var path []states.State
	switch from {
	case states.Released:
		return r, nil
	case states.Active, states.Expired:
		path = []states.State{states.Releasing, states.Released}
	case states.Releasing:
		path = []states.State{states.Released}
	case states.AwaitingConfirmation, states.Pending, states.Placed, states.Binding:
		return Reservation{}, stateError(r, "released", "reservations.cancel")
	default:
		return Reservation{}, stateError(r, "released", "")
	}
	if err := store.SetReservationEndReason(ctx, tx, r.ID, states.EndRelease); err != nil {
		return Reservation{}, err
	}
	for _, to := range path {
		if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, from, to, nil); err != nil {
			return Reservation{}, err
		}
		from = to
	}
	if err := store.CutReservationBookings(ctx, tx, r.TenantID, r.ID); err != nil {
		return Reservation{}, err
	}
	return Load(ctx, tx, tenantID, r.ID, false)
}

// Cancel cancels the tenant's reservation before it is active and cuts its
// bookings; cancelling a cancelled one changes nothing.
func Cancel(ctx context.Context, tx store.Tx, tenantID, id string) (Reservation, error) {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Reservation{}, err
	}
	from := states.State(r.State)
	switch from {
	case states.Cancelled:
		return r, nil
	case states.AwaitingConfirmation, states.Pending, states.Placed, states.Binding:
	case states.Active:
		return Reservation{}, stateError(r, "cancelled", "reservations.release")
	default:
		return Reservation{}, stateError(r, "cancelled", "")
	}
	if err := store.SetReservationEndReason(ctx, tx, r.ID, states.EndCancel); err != nil {
		return Reservation{}, err
	}
	if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, from, states.Cancelled, nil); err != nil {
		return Reservation{}, err
	}
	if err := store.CutReservationBookings(ctx, tx, r.TenantID, r.ID); err != nil {
		return Reservation{}, err
	}
	return Load(ctx, tx, tenantID, r.ID, false)
}

// Renew locks the tenant's reservation and checks its lease can be
// renewed: it is active and was made with leaseSeconds. The workflow owns
// the lease's timer.
func Renew(ctx context.Context, tx store.Tx, tenantID, id string) (Reservation, error) {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Reservation{}, err
	}
	if r.LeaseSeconds == nil {
		return Reservation{}, core.Errorf(core.CodeInvalidState, "reservation %s was made without leaseSeconds: it has no lease to renew", r.ID).
			WithDetails(map[string]any{"reason": "noLease", "reservationId": r.ID})
	}
	if r.State != string(states.Active) {
		return Reservation{}, stateError(r, "renewed", "")
	}
	return r, nil
}

// RecordLease records the lease deadline (epoch ms) the workflow answered
// a renewal with, for readers; an older deadline never replaces a newer.
func RecordLease(ctx context.Context, tx store.Tx, id string, deadline int64) error {
	_, err := tx.Exec(ctx, `UPDATE reservations SET lease_expires_at = timestamptz 'epoch' + $2::bigint * interval '1 millisecond'
		WHERE id = $1 AND (lease_expires_at IS NULL OR lease_expires_at < timestamptz 'epoch' + $2::bigint * interval '1 millisecond')`,
		id, deadline)
	return err
}

// extendable says whether a reservation in state st can still be extended.
func extendable(st states.State) bool {
	return st == states.Placed || st == states.Binding || st == states.Active
}

// PrepareExtend (extend's transaction 1) records the requested end (the
// new total duration, in seconds from the start, so a retry asks for the
// same end) and writes the authorization row with the new durationHours,
// so the one decision sees the extended request.
func PrepareExtend(ctx context.Context, tx store.Tx, types Types, tenantID, id string, duration int64) (store.AuthzResource, error) {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return store.AuthzResource{}, err
	}
	if !extendable(states.State(r.State)) {
		return store.AuthzResource{}, stateError(r, "extended", "")
	}
	end := r.Start + duration*1000
	if end < r.End {
		return store.AuthzResource{}, core.Errorf(core.CodeInvalidInput,
			"duration %d s ends before the reservation's current end; a reservation can only be extended", duration).
			WithDetails(map[string]any{"field": "duration", "reason": "range"})
	}
	pool, err := pools.View(ctx, tx, tenantID, r.PoolID)
	if err != nil {
		return store.AuthzResource{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE reservations SET pending_ends_at = timestamptz 'epoch' + $2::bigint * interval '1 millisecond'
		WHERE id = $1`, r.ID, end); err != nil {
		return store.AuthzResource{}, err
	}
	row := authzRow(types, r.TenantID, r.ID, r.OwnerIdentityID, pool, r.Devices, duration, r.Binding, r.ProjectID, r.Spot)
	return row, store.PutAuthzResource(ctx, tx, row)
}

// CompleteExtend (extend's transaction 2) books [end, new end) on the
// reservation's atoms by stretching each booking, so the EXCLUDE
// constraint refuses the stretch when another booking holds an atom then.
func CompleteExtend(ctx context.Context, tx store.Tx, tenantID, id string, duration int64) (Reservation, error) {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Reservation{}, err
	}
	end := r.Start + duration*1000
	var pending *int64
	if err := tx.QueryRow(ctx, `SELECT (extract(epoch FROM pending_ends_at) * 1000)::bigint FROM reservations WHERE id = $1`,
		r.ID).Scan(&pending); err != nil {
		return Reservation{}, err
	}
	switch {
	case !extendable(states.State(r.State)):
		return Reservation{}, stateError(r, "extended", "")
	case pending == nil || *pending != end:
		// Another extension wrote the authorization row after this one: the
		// decision may have been made on its duration.
		return Reservation{}, core.Errorf(core.CodeConflict, "a concurrent extension of reservation %s changed the request; retry", r.ID).
			WithDetails(map[string]any{"reason": "concurrentExtension", "reservationId": r.ID})
	}
	if end > r.End {
		pool, err := pools.View(ctx, tx, tenantID, r.PoolID)
		if err != nil {
			return Reservation{}, err
		}
		// The limits are checked once the bookings are stretched, as a
		// create's are once booked: everyone takes the quota lock after
		// booking, so no holder of it waits for a booking whose
		// transaction waits for the lock. A stretch the exclusion
		// refuses is rolled back first, and over the quota is still
		// the answer it gets when it is over both.
		sp, err := tx.Begin(ctx) // a SAVEPOINT
		if err != nil {
			return Reservation{}, err
		}
		tag, err := sp.Exec(ctx, `UPDATE device_bookings b
			SET during = tstzrange(lower(b.during), timestamptz 'epoch' + $3::bigint * interval '1 millisecond')
			FROM allocations a
			WHERE a.reservation_id = $1 AND b.allocation_id = a.id
				AND upper(b.during) = timestamptz 'epoch' + $2::bigint * interval '1 millisecond'`, r.ID, r.End, end)
		if pgState(err) == "23P01" {
			if err := sp.Rollback(ctx); err != nil {
				return Reservation{}, err
			}
			if err := checkLimits(ctx, tx, tenantID, pool, r, r.End, end, false, false); err != nil {
				return Reservation{}, err
			}
			return Reservation{}, core.Errorf(core.CodeConflict, "another booking holds some of reservation %s's atoms before the new end", r.ID).
				WithDetails(map[string]any{"reason": "atomsTaken", "reservationId": r.ID})
		}
		if err != nil {
			return Reservation{}, err
		}
		if err := sp.Commit(ctx); err != nil {
			return Reservation{}, err
		}
		if tag.RowsAffected() == 0 {
			return Reservation{}, core.Errorf(core.CodeInternal, "reservation %s has no bookings ending at its end", r.ID)
		}
		if err := checkLimits(ctx, tx, tenantID, pool, r, r.End, end, false, true); err != nil {
			return Reservation{}, err
		}
		if err := store.PublishEvent(ctx, tx, store.Event{TenantID: r.TenantID, Type: "reservation.extended",
			ResourceType: "reservation", ResourceID: r.ID, ProjectID: r.ProjectID,
			Data: map[string]any{"from": r.End, "to": end, "poolId": r.PoolID}}); err != nil {
			return Reservation{}, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE reservations SET ends_at = timestamptz 'epoch' + $2::bigint * interval '1 millisecond',
		pending_ends_at = NULL, updated_at = now() WHERE id = $1`, r.ID, end); err != nil {
		return Reservation{}, err
	}
	return Load(ctx, tx, tenantID, r.ID, false)
}

// UndoExtend puts the authorization row back to the reservation's real
// duration after a denial or a refusal of an extension to duration, so
// later decisions on the reservation do not see the request that was
// turned down.
func UndoExtend(ctx context.Context, tx store.Tx, types Types, tenantID, id string, duration int64) error {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return err
	}
	pool, err := pools.View(ctx, tx, tenantID, r.PoolID)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE reservations SET pending_ends_at = NULL
		WHERE id = $1 AND pending_ends_at = timestamptz 'epoch' + $2::bigint * interval '1 millisecond'`,
		r.ID, r.Start+duration*1000); err != nil {
		return err
	}
	seconds := (r.End - r.Start + 999) / 1000
	return store.PutAuthzResource(ctx, tx, authzRow(types, r.TenantID, r.ID, r.OwnerIdentityID, pool, r.Devices,
		seconds, r.Binding, r.ProjectID, r.Spot))
}

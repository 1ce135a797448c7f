package activities

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.temporal.io/sdk/temporal"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/store"
)

// Reservations is the activity side of the reservation workflow
// (workflows.ReservationWorkflow). Every activity is idempotent: it locks
// the reservation row, reads where the state already is and walks only the
// edges that are left, each through core/reservations.Transition, in one
// transaction. A retry after a crash therefore finds the state advanced and
// succeeds without doing anything twice; the bookings are cut only in the
// transaction that reaches released, so they are never released twice.
type Reservations struct {
	Store *store.Store
}

// MarkActive moves a placed reservation to active: placed -> binding ->
// active. Binding is a no-op seam for now: a hold needs nothing on the node;
// the agent's CDI command (instance and node bindings) comes with the agent
// issue and will run between the two edges. An already active reservation
// succeeds unchanged; any other state is a non-retryable INVALID_STATE.
func (r *Reservations) MarkActive(ctx context.Context, tenantID, reservationID string) error {
	return r.Store.InTx(ctx, pgx.TxOptions{}, func(tx store.Tx) error {
		from, err := lockState(ctx, tx, tenantID, reservationID)
		if err != nil {
			return err
		}
		var path []reservations.State
		switch from {
		case reservations.Active:
			return nil
		case reservations.Placed:
			path = []reservations.State{reservations.Binding, reservations.Active}
		case reservations.Binding:
			path = []reservations.State{reservations.Active}
		default:
			return invalidState(reservationID, from, reservations.Active)
		}
		return walk(ctx, tx, reservationID, from, path)
	})
}

// Expire ends an active reservation that ran past its end: active ->
// expired -> releasing -> released, cutting its bookings to now in the same
// transaction. A released reservation succeeds unchanged.
func (r *Reservations) Expire(ctx context.Context, tenantID, reservationID string) error {
	return r.finish(ctx, tenantID, reservationID, true)
}

// Release releases an active reservation (the release update, or a lease
// that was not renewed in time): active -> releasing -> released, cutting
// its bookings to now in the same transaction. An expired or releasing
// reservation is carried on to released; a released one succeeds unchanged.
func (r *Reservations) Release(ctx context.Context, tenantID, reservationID string) error {
	return r.finish(ctx, tenantID, reservationID, false)
}

func (r *Reservations) finish(ctx context.Context, tenantID, reservationID string, expire bool) error {
	return r.Store.InTx(ctx, pgx.TxOptions{}, func(tx store.Tx) error {
		from, err := lockState(ctx, tx, tenantID, reservationID)
		if err != nil {
			return err
		}
		var path []reservations.State
		switch from {
		case reservations.Released:
			return nil
		case reservations.Active:
			if expire {
				path = append(path, reservations.Expired)
			}
			path = append(path, reservations.Releasing, reservations.Released)
		case reservations.Expired:
			path = []reservations.State{reservations.Releasing, reservations.Released}
		case reservations.Releasing:
			path = []reservations.State{reservations.Released}
		default:
			return invalidState(reservationID, from, reservations.Released)
		}
		if err := walk(ctx, tx, reservationID, from, path); err != nil {
			return err
		}
		return cutBookings(ctx, tx, tenantID, reservationID)
	})
}

// lockState reads and locks the reservation's state; an unknown reservation
// (or another tenant's) is a non-retryable NOT_FOUND.
func lockState(ctx context.Context, tx store.Tx, tenantID, id string) (reservations.State, error) {
	var s string
	err := tx.QueryRow(ctx, `SELECT state FROM reservations WHERE id = $1 AND tenant_id = $2 FOR UPDATE`, id, tenantID).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", temporal.NewNonRetryableApplicationError(fmt.Sprintf("reservation %s not found", id),
			string(core.CodeNotFound), nil)
	}
	if err != nil {
		return "", err
	}
	return reservations.State(s), nil
}

// walk moves the locked reservation from along path, one checked edge at a
// time.
func walk(ctx context.Context, tx store.Tx, id string, from reservations.State, path []reservations.State) error {
	for _, to := range path {
		if err := reservations.Transition(from, to); err != nil {
			return temporal.NewNonRetryableApplicationError(err.Error(), string(core.CodeInvalidState), err)
		}
		tag, err := tx.Exec(ctx, `UPDATE reservations SET state = $3, updated_at = now() WHERE id = $1 AND state = $2`,
			id, string(from), string(to))
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("reservation %s is no longer %s", id, from)
		}
		from = to
	}
	return nil
}

// cutBookings frees the reservation's atoms from now on: a booking that has
// begun ends now ([lower, now)); one that has not begun yet is deleted, as
// an empty range would break device_bookings' CHECK (NOT isempty(during)).
// now() is the transaction's start, the same instant for every row.
func cutBookings(ctx context.Context, tx store.Tx, tenantID, id string) error {
	if _, err := tx.Exec(ctx, `DELETE FROM device_bookings b USING allocations a
		WHERE a.reservation_id = $1 AND a.tenant_id = $2 AND b.allocation_id = a.id AND lower(b.during) >= now()`,
		id, tenantID); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE device_bookings b SET during = tstzrange(lower(b.during), now())
		FROM allocations a
		WHERE a.reservation_id = $1 AND a.tenant_id = $2 AND b.allocation_id = a.id
			AND (upper_inf(b.during) OR upper(b.during) > now())`, id, tenantID)
	return err
}

func invalidState(id string, from, to reservations.State) error {
	return temporal.NewNonRetryableApplicationError(
		fmt.Sprintf("reservation %s is %s and cannot become %s", id, from, to), string(core.CodeInvalidState), nil)
}

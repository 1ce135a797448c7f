package instances

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/instances"
	"github.com/better-compute/better-compute/core/placement"
	rsvstates "github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/capacity"
	"github.com/better-compute/better-compute/store/flavors"
	"github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/store/reservations"
)

// Instances on a binding instance reservation. The instance runs on the
// reservation's one allocation: its own allocation names the
// reservation's node and atoms, which stay booked by the reservation
// alone, and books the flavor's vCPU and memory on that node as any
// instance's do. At most one placed instance (not deleted) runs on a
// reservation: the partial unique index instances_reservation_live
// (migration 00038), and the reservation's row lock its placement takes,
// so concurrent creates are told CONFLICT rather than failing on the
// index. When the reservation's bookings are cut (its ending, or its
// re-placement off a dead node) the instance is deleted in the same
// transaction.

func init() { store.OnReservationCut(endOnReservation) }

// checkReservation checks that the instance (id) can run on the tenant's
// reservation: one of the tenant's (NOT_FOUND otherwise, a draft or a
// denied one included), binding instance and in the instance's pool
// (INVALID_INPUT field reservationId, reason binding or pool), placed,
// binding or active with its window begun (INVALID_STATE field
// reservationId, reason ended, notPlaced or notStarted), the flavor's GPUs
// exactly the reservation's (INVALID_INPUT field flavorId, reason gpus),
// and no other placed instance on it (CONFLICT field reservationId,
// reason inUse). lock locks the reservation's row to the commit first.
func checkReservation(ctx context.Context, tx store.Tx, tenantID, poolID string, f flavors.Flavor, id, reservationID string,
	lock bool) (reservations.Reservation, error) {
	r, err := reservations.Load(ctx, tx, tenantID, reservationID, lock)
	if err != nil {
		return r, err
	}
	field := func(code core.Code, name, reason, format string, args ...any) error {
		return core.Errorf(code, format, args...).WithDetails(map[string]any{"field": name, "reason": reason, "reservationId": r.ID})
	}
	st := rsvstates.State(r.State)
	switch {
	case st == rsvstates.Draft || st == rsvstates.Denied:
		return r, core.Errorf(core.CodeNotFound, "reservation %s not found", r.ID)
	case r.Binding != reservations.BindingInstance:
		return r, field(core.CodeInvalidInput, "reservationId", "binding", "reservation %s has binding %s; an instance runs on a binding instance one",
			r.ID, r.Binding)
	case r.PoolID != poolID:
		return r, field(core.CodeInvalidInput, "reservationId", "pool", "reservation %s is in pool %s, not %s", r.ID, r.PoolID, poolID)
	case rsvstates.Terminal(st) || st == rsvstates.Expired || st == rsvstates.Releasing:
		return r, field(core.CodeInvalidState, "reservationId", "ended", "reservation %s is %s", r.ID, r.State)
	case st != rsvstates.Placed && st != rsvstates.Binding && st != rsvstates.Active:
		return r, field(core.CodeInvalidState, "reservationId", "notPlaced", "reservation %s is %s and not placed yet", r.ID, r.State)
	}
	now, err := capacity.Start(ctx, tx, nil)
	if err != nil {
		return r, err
	}
	if r.Start > now {
		err := core.Errorf(core.CodeInvalidState, "reservation %s begins at %d; create the instance once it has begun", r.ID, r.Start)
		return r, err.WithDetails(map[string]any{"field": "reservationId", "reason": "notStarted", "reservationId": r.ID, "start": r.Start})
	}
	class := f.GPUClass
	if class == "" {
		class = placement.ClassGPU
	}
	if f.GPUs != r.Devices.Count || class != r.Devices.Class {
		err := core.Errorf(core.CodeInvalidInput, "flavor %s has %d %s; reservation %s holds %d %s, and an instance takes all of them",
			f.ID, f.GPUs, class, r.ID, r.Devices.Count, r.Devices.Class)
		return r, err.WithDetails(map[string]any{"field": "flavorId", "reason": "gpus", "reservationId": r.ID,
			"gpus": f.GPUs, "gpuClass": class, "reservationGpus": r.Devices.Count, "reservationClass": r.Devices.Class})
	}
	if len(r.Allocations) != 1 {
		return r, core.Errorf(core.CodeInternal, "reservation %s has %d allocations; binding instance has one", r.ID, len(r.Allocations))
	}
	var other string
	err = tx.QueryRow(ctx, `SELECT id FROM instances
		WHERE reservation_id = $1 AND node_id IS NOT NULL AND state <> 'deleted' AND id <> $2 LIMIT 1`, r.ID, id).Scan(&other)
	switch {
	case err == nil:
		err := core.Errorf(core.CodeConflict, "instance %s already runs on reservation %s", other, r.ID)
		return r, err.WithDetails(map[string]any{"field": "reservationId", "reason": "inUse", "reservationId": r.ID, "instanceId": other})
	case !errors.Is(err, pgx.ErrNoRows):
		return r, err
	}
	return r, nil
}

// placeOnReservation places the instance on its reservation's node and
// atoms (checked again, its row locked to the commit, so two creates on
// one reservation place one at a time and the second is refused inUse;
// and an ending that commits first is seen). The flavor's vCPU and
// memory must fit the node's free scalars, counted under the node's lock
// as placeOnNode counts them (INVALID_STATE reason noCapacity otherwise,
// nothing booked). The node's schedulability is not asked: the
// reservation holds its atoms whatever it is, and ends when it is lost.
func placeOnReservation(ctx context.Context, tx store.Tx, pool pools.Pool, f flavors.Flavor, in Instance) (string, error) {
	r, err := checkReservation(ctx, tx, in.TenantID, pool.ID, f, in.ID, in.ReservationID, true)
	if err != nil {
		return "", err
	}
	a := r.Allocations[0]
	if err := lockNode(ctx, tx, a.NodeID); err != nil {
		return "", err
	}
	scalars, err := nodeScalars(ctx, tx, pool, []string{a.NodeID})
	if err != nil {
		return "", err
	}
	if s := scalars[a.NodeID]; !s.Fits(int64(f.VCPU), f.MemoryMiB) {
		return "", core.Errorf(core.CodeInvalidState, "flavor %s does not fit on node %s of reservation %s", f.ID, a.NodeID, r.ID).
			WithDetails(map[string]any{"reason": "noCapacity", "nodes": []map[string]any{scalarReason(s, f)},
				"instanceId": in.ID, "reservationId": r.ID})
	}
	if _, err := insertAllocation(ctx, tx, in, a.NodeID, int64(f.VCPU), f.MemoryMiB, a.Atoms); err != nil {
		return "", err
	}
	return a.NodeID, nil
}

// endOnReservation deletes, as instances.delete does (desired deleted,
// state deleting, the generations moved), each placed instance on the
// reservation whose bookings the caller's transaction cuts. The
// instance's workflow finishes the delete once the node lets it go; the
// instance's allocation never held the reservation's bookings, so the
// reservation's cut is all the atoms need.
func endOnReservation(ctx context.Context, tx store.Tx, tenantID, reservationID string) error {
	ids, err := liveOnReservation(ctx, tx, tenantID, reservationID, false)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if _, _, err := Change(ctx, tx, tenantID, id, states.MethodDelete); err != nil {
			return fmt.Errorf("deleting instance %s of reservation %s: %w", id, reservationID, err)
		}
	}
	return nil
}

// OnReservation answers the ids of the instances on the tenant's
// reservation being deleted with it (desired deleted, not yet deleted):
// those whose workflows the caller of an ending signals after its commit.
func OnReservation(ctx context.Context, tx store.Tx, tenantID, reservationID string) ([]string, error) {
	return liveOnReservation(ctx, tx, tenantID, reservationID, true)
}

// liveOnReservation are the placed, not deleted instances on the
// reservation whose desired state is deleted (deleting) or not.
func liveOnReservation(ctx context.Context, tx store.Tx, tenantID, reservationID string, deleting bool) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT id FROM instances
		WHERE reservation_id = $1 AND tenant_id = $2 AND node_id IS NOT NULL AND state <> 'deleted'
			AND (desired_state = 'deleted') = $3
		ORDER BY id`, reservationID, tenantID, deleting)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

package store

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
)

// Binding a hold reservation: each of its allocations on a node its agent
// drives (adapter bcd/v1) gets a cdi.expose command exposing the
// allocation's GPUs as CDI devices, and a cdi.withdraw once its atoms are
// freed. The commands' idempotency keys name the reservation and the
// allocation, so a retried activity queues nothing twice. A binding
// instance reservation gets no commands: the instance placed on it is
// given the atoms by its runtime (store/instances).

// Binding states BindingStatus answers.
const (
	BindingWaiting = "waiting" // commands not all acknowledged yet
	BindingBound   = "bound"   // every command succeeded
	BindingFailed  = "failed"  // a command failed, was skipped, cancelled or expired
)

// BindKey is the idempotency key of the cdi.expose command of a
// reservation's allocation.
func BindKey(reservationID, allocationID string) string {
	return "bind:" + reservationID + ":" + allocationID
}

func unbindKey(reservationID, allocationID string) string {
	return "unbind:" + reservationID + ":" + allocationID
}

type agentAllocation struct {
	id, nodeID, nodeTenant string
	atoms                  []string
}

// agentAllocations are the reservation's allocations on agent-driven
// nodes whose devices the agent exposes: none of a binding instance
// reservation (instanceAllocations).
func agentAllocations(ctx context.Context, tx Tx, reservationID string) ([]agentAllocation, error) {
	return queryAllocations(ctx, tx, reservationID, `n.adapter = 'bcd/v1' AND r.binding <> 'instance'`)
}

// instanceAllocations are the allocations of a binding instance
// reservation (none of another binding).
func instanceAllocations(ctx context.Context, tx Tx, reservationID string) ([]agentAllocation, error) {
	return queryAllocations(ctx, tx, reservationID, `r.binding = 'instance'`)
}

func queryAllocations(ctx context.Context, tx Tx, reservationID, where string) ([]agentAllocation, error) {
	rows, err := tx.Query(ctx, `SELECT a.id, a.node_id, n.tenant_id, a.atoms FROM allocations a JOIN nodes n ON n.id = a.node_id
		JOIN reservations r ON r.id = a.reservation_id
		WHERE a.reservation_id = $1 AND `+where+` ORDER BY a.node_id, a.id`, reservationID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (agentAllocation, error) {
		var a agentAllocation
		return a, r.Scan(&a.id, &a.nodeID, &a.nodeTenant, &a.atoms)
	})
}

// Why QueueBindCommands refused (details.reason of its INVALID_STATE).
const (
	// NotBooked: an atom has no booking covering now and none ahead: the
	// window is over (or never was); binding can never succeed.
	BindNotBooked = "notBooked"
	// BindNotBegun: an atom's booking begins later: the caller woke early
	// (a clock ahead of the database's) and may try again.
	BindNotBegun = "notBegun"
)

// QueueBindCommands queues the reservation's cdi.expose commands (none for
// allocations on nodes without an agent), each valid until notAfter. An
// atom is exposed only while a booking of its allocation covers now(),
// checked in the caller's transaction: otherwise nothing is queued and the
// answer is INVALID_STATE with details.reason BindNotBooked or
// BindNotBegun. Whatever a request or a workflow asked for, no agent is
// told to expose an atom outside its reservation's booking. A binding
// instance reservation is checked the same way and queues nothing: the
// instance's runtime exposes its devices.
func QueueBindCommands(ctx context.Context, tx Tx, reservationID string, notAfter time.Time) error {
	allocs, err := agentAllocations(ctx, tx, reservationID)
	if err != nil {
		return err
	}
	instance, err := instanceAllocations(ctx, tx, reservationID)
	if err != nil {
		return err
	}
	for _, a := range append(allocs, instance...) {
		if err := checkBookedNow(ctx, tx, reservationID, a); err != nil {
			return err
		}
	}
	for _, a := range allocs {
		indexes, err := GPUIndexes(ctx, tx, a.nodeID, a.atoms)
		if err != nil {
			return err
		}
		slices.Sort(indexes)
		args, err := json.Marshal(map[string]any{"reservationId": reservationID, "devices": slices.Compact(indexes)})
		if err != nil {
			return err
		}
		if _, err := QueueNodeCommand(ctx, tx, NodeCommand{NodeID: a.nodeID, TenantID: a.nodeTenant, Kind: CommandCDIExpose,
			Args: args, NotAfter: &notAfter, CreatedBy: "reservation:" + reservationID}, BindKey(reservationID, a.id)); err != nil {
			return err
		}
	}
	return nil
}

// checkBookedNow refuses unless every atom of the allocation has a booking
// of that allocation covering now().
func checkBookedNow(ctx context.Context, tx Tx, reservationID string, a agentAllocation) error {
	var uncovered, ahead int
	err := tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT covered), count(*) FILTER (WHERE NOT covered AND later)
		FROM (SELECT atom,
				EXISTS (SELECT 1 FROM device_bookings b WHERE b.allocation_id = $1 AND b.device_node_id = $2
					AND b.device_id = atom AND b.during @> now()) AS covered,
				EXISTS (SELECT 1 FROM device_bookings b WHERE b.allocation_id = $1 AND b.device_node_id = $2
					AND b.device_id = atom AND lower(b.during) > now()) AS later
			FROM unnest($3::text[]) AS atom) atoms`, a.id, a.nodeID, a.atoms).Scan(&uncovered, &ahead)
	switch {
	case err != nil:
		return err
	case uncovered == 0:
		return nil
	case uncovered == ahead:
		return core.Errorf(core.CodeInvalidState, "reservation %s's booking on node %s has not begun", reservationID, a.nodeID).
			WithDetails(map[string]any{"reason": BindNotBegun, "reservationId": reservationID, "nodeId": a.nodeID})
	}
	return core.Errorf(core.CodeInvalidState, "reservation %s holds no booking on node %s now: nothing is exposed", reservationID, a.nodeID).
		WithDetails(map[string]any{"reason": BindNotBooked, "reservationId": reservationID, "nodeId": a.nodeID})
}

// BindingStatus says how the reservation's cdi.expose commands stand; a
// binding instance reservation has none and is bound at once.
func BindingStatus(ctx context.Context, tx Tx, reservationID string) (string, error) {
	var want, succeeded, failed int
	err := tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE c.state = 'succeeded'),
			count(*) FILTER (WHERE c.state IN ('failed', 'skipped', 'cancelled', 'expired'))
		FROM allocations a JOIN nodes n ON n.id = a.node_id AND n.adapter = 'bcd/v1'
		JOIN reservations r ON r.id = a.reservation_id AND r.binding <> 'instance'
		LEFT JOIN node_commands c ON c.node_id = a.node_id AND c.idempotency_key = 'bind:' || a.reservation_id || ':' || a.id
		WHERE a.reservation_id = $1`, reservationID).Scan(&want, &succeeded, &failed)
	switch {
	case err != nil:
		return "", err
	case failed > 0:
		return BindingFailed, nil
	case succeeded == want:
		return BindingBound, nil
	}
	return BindingWaiting, nil
}

// queueUnbindCommands queues cdi.withdraw for each allocation that was
// bound (had a cdi.expose queued).
func queueUnbindCommands(ctx context.Context, tx Tx, reservationID string) error {
	allocs, err := agentAllocations(ctx, tx, reservationID)
	if err != nil {
		return err
	}
	for _, a := range allocs {
		var bound bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM node_commands WHERE node_id = $1 AND idempotency_key = $2)`,
			a.nodeID, BindKey(reservationID, a.id)).Scan(&bound); err != nil {
			return err
		}
		if !bound {
			continue
		}
		args, err := json.Marshal(map[string]any{"reservationId": reservationID})
		if err != nil {
			return err
		}
		if _, err := QueueNodeCommand(ctx, tx, NodeCommand{NodeID: a.nodeID, TenantID: a.nodeTenant, Kind: CommandCDIWithdraw,
			Args: args, CreatedBy: "reservation:" + reservationID}, unbindKey(reservationID, a.id)); err != nil {
			return err
		}
	}
	return nil
}

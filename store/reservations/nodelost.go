package reservations

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
)

// Reservations on dead nodes. The liveness sweep (store/nodes) moves nodes
// whose lease lapsed to unreachable, then lost; what that means for the
// reservations allocated on them is decided here, from the rows' state on
// every sweep rather than from the transition itself, so a crash between
// the node's change and this step only delays it to the next sweep:
//
//   - placed or binding (not bound yet): its allocations are dropped (a
//     queued cdi.expose cancelled, a delivered one withdrawn) and its
//     request placed again from now on with the same placement code as
//     reservations.create; a binding one gets its new cdi.expose commands
//     at once. When nothing fits and its start has come, it fails at once
//     (failure UNAVAILABLE, reason nodeUnreachable or nodeLost); one whose
//     start is still ahead keeps its booking, as its node may come back,
//     and is tried again on each sweep until its start;
//   - active: while a node it holds is unreachable it carries the
//     condition NodeUnreachable {nodeId, since}, dropped when the node is
//     heard from again; when the node is lost it ends (active -> releasing
//     -> failed, end reason nodeLost), its bookings cut, its usage closed
//     and cdi.withdraw queued.

// CondNodeUnreachable is a live reservation's condition while a node one of
// its allocations is on is unreachable.
const CondNodeUnreachable = "NodeUnreachable"

// Condition is something wrong with a live reservation now.
type Condition struct {
	Type   string `json:"type"`
	NodeID string `json:"nodeId"`
	// Since is when the reservation got it (epoch ms).
	Since int64 `json:"since"`
}

// What ReconcileNodeHealth did to a reservation.
const (
	NodeHealthUnchanged  = ""
	NodeHealthReplaced   = "replaced"   // placed again on healthy nodes
	NodeHealthFailed     = "failed"     // nothing else fits: failed before it was bound
	NodeHealthLost       = "nodeLost"   // active, and its node was lost: ended failed
	NodeHealthConditions = "conditions" // its conditions changed
)

// Ref names a reservation.
type Ref struct {
	TenantID, ID string
}

// OnDeadNodes lists up to limit reservations ReconcileNodeHealth has
// something to do for: placed or binding ones on an unreachable or lost
// node, active (or expired) ones on a lost node or on an unreachable node
// without its condition, and ones carrying a condition that no longer
// holds. Earliest start first, so due ones come before future ones.
func OnDeadNodes(ctx context.Context, tx store.Tx, limit int) ([]Ref, error) {
	rows, err := tx.Query(ctx, `SELECT tenant_id, id FROM (
			SELECT r.tenant_id, r.id, r.starts_at FROM nodes n
			JOIN allocations a ON a.node_id = n.id
			JOIN reservations r ON r.id = a.reservation_id
			WHERE n.connectivity IN ('unreachable', 'lost') AND (
				(r.state IN ('placed', 'binding') AND r.ends_at > now())
				OR (r.state IN ('active', 'expired') AND n.connectivity = 'lost')
				OR (r.state = 'active' AND NOT r.conditions @> jsonb_build_array(jsonb_build_object('type', $1::text, 'nodeId', n.id))))
			UNION
			SELECT r.tenant_id, r.id, r.starts_at FROM reservations r
			WHERE r.conditions <> '[]' AND (r.state <> 'active' OR EXISTS (
				SELECT 1 FROM jsonb_array_elements(r.conditions) c
				WHERE NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = c->>'nodeId' AND n.connectivity = 'unreachable')))
		) w ORDER BY starts_at, id LIMIT $2`, CondNodeUnreachable, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Ref, error) {
		var r Ref
		return r, row.Scan(&r.TenantID, &r.ID)
	})
}

// ReconcileNodeHealth locks the reservation and brings it in step with
// the connectivity of the nodes it is allocated on (see above), answering
// what it did. The caller signals the reservation's workflow after the
// commit when it answers anything but NodeHealthUnchanged or
// NodeHealthConditions.
func ReconcileNodeHealth(ctx context.Context, tx store.Tx, tenantID, id string) (string, error) {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return NodeHealthUnchanged, err
	}
	conn, err := allocationNodes(ctx, tx, r.ID)
	if err != nil {
		return NodeHealthUnchanged, err
	}
	dead := ""
	for _, nodeID := range slices.Sorted(maps.Keys(conn)) {
		if c := conn[nodeID]; c == "lost" || (c == "unreachable" && conn[dead] != "lost") {
			dead = nodeID
		}
	}
	now, err := dbNow(ctx, tx)
	if err != nil {
		return NodeHealthUnchanged, err
	}
	switch states.State(r.State) {
	case states.Placed, states.Binding:
		if dead != "" && r.End > now.UnixMilli() {
			return replace(ctx, tx, r, dead, conn[dead])
		}
	case states.Active, states.Expired:
		if dead != "" && conn[dead] == "lost" {
			return NodeHealthLost, endOnLostNode(ctx, tx, r, dead)
		}
	}
	return setConditions(ctx, tx, r, conn)
}

// allocationNodes answers the connectivity of each node the reservation
// has an allocation on.
func allocationNodes(ctx context.Context, tx store.Tx, reservationID string) (map[string]string, error) {
	rows, err := tx.Query(ctx, `SELECT DISTINCT n.id, n.connectivity FROM allocations a JOIN nodes n ON n.id = a.node_id
		WHERE a.reservation_id = $1`, reservationID)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var nodeID, c string
	_, err = pgx.ForEachRow(rows, []any{&nodeID, &c}, func() error {
		out[nodeID] = c
		return nil
	})
	return out, err
}

// replace drops the not yet bound reservation's allocations and places its
// request again from now on, in a savepoint; when nothing fits, a due
// reservation fails and a future one is left as it was.
func replace(ctx context.Context, tx store.Tx, r Reservation, dead, connectivity string) (string, error) {
	var notAfter *time.Time
	if err := tx.QueryRow(ctx, `SELECT max(c.not_after) FROM allocations a
		JOIN node_commands c ON c.node_id = a.node_id AND c.idempotency_key = 'bind:' || a.reservation_id || ':' || a.id
		WHERE a.reservation_id = $1`, r.ID).Scan(&notAfter); err != nil {
		return NodeHealthUnchanged, err
	}
	from := slices.Clone(r.Allocations)
	sp, err := tx.Begin(ctx) // a SAVEPOINT: a refused placement leaves the old one
	if err != nil {
		return NodeHealthUnchanged, err
	}
	placed, err := replaceIn(ctx, sp, r, notAfter)
	if err != nil || !placed {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return NodeHealthUnchanged, rerr
		}
		if err != nil {
			return NodeHealthUnchanged, err
		}
		if now, err := dbNow(ctx, tx); err != nil || r.Start > now.UnixMilli() {
			return NodeHealthUnchanged, err // its node may come back before its start
		}
		return NodeHealthFailed, failOnDeadNode(ctx, tx, r, dead, connectivity)
	}
	if err := sp.Commit(ctx); err != nil {
		return NodeHealthUnchanged, err
	}
	now, err := Load(ctx, tx, r.TenantID, r.ID, false)
	if err != nil {
		return NodeHealthUnchanged, err
	}
	return NodeHealthReplaced, store.PublishEvent(ctx, tx, store.Event{TenantID: r.TenantID, Type: "reservation.replaced",
		ResourceType: "reservation", ResourceID: r.ID, ProjectID: r.ProjectID,
		Data: map[string]any{"poolId": r.PoolID, "reason": reasonOf(connectivity), "nodeId": dead,
			"from": from, "to": now.Allocations}})
}

// replaceIn does replace's work inside its savepoint; placed is false when
// the request fits nowhere.
func replaceIn(ctx context.Context, tx store.Tx, r Reservation, notAfter *time.Time) (placed bool, err error) {
	if err := cancelBindCommands(ctx, tx, r.ID); err != nil {
		return false, err
	}
	// Withdraws what a delivered cdi.expose may have exposed, and frees
	// the atoms; what is left of the bookings ([start, now)) was never
	// used, as the reservation never became active, and goes with its
	// allocations.
	if err := store.CutReservationBookings(ctx, tx, r.TenantID, r.ID); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM device_bookings b USING allocations a
		WHERE a.reservation_id = $1 AND b.allocation_id = a.id`, r.ID); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM allocations WHERE reservation_id = $1`, r.ID); err != nil {
		return false, err
	}
	pool, err := pools.View(ctx, tx, r.TenantID, r.PoolID)
	var now time.Time
	if err == nil {
		now, err = dbNow(ctx, tx)
	}
	if err == nil {
		window := r
		window.Start = max(r.Start, now.UnixMilli())
		err = placeAndBook(ctx, tx, pool, window)
	}
	if err != nil {
		// Nothing fits, or the pool is no longer the tenant's to use; any
		// other failure (contention included) is tried again next sweep.
		var ce *core.Error
		if errors.As(err, &ce) && (ce.Code == core.CodeInvalidState || ce.Code == core.CodeNotFound) {
			return false, nil
		}
		return false, err
	}
	if r.State != string(states.Binding) {
		return true, nil // the workflow binds the new allocations at the start
	}
	deadline := time.Now().Add(5 * time.Minute)
	if notAfter != nil {
		deadline = *notAfter
	}
	return true, store.QueueBindCommands(ctx, tx, r.ID, deadline)
}

// cancelBindCommands cancels the reservation's cdi.expose commands not yet
// finished: a queued one at once, a delivered or running one with a
// cancel request (its session sends the agent a cancel frame).
func cancelBindCommands(ctx context.Context, tx store.Tx, reservationID string) error {
	_, err := tx.Exec(ctx, `UPDATE node_commands c SET state = 'cancelled',
			finished_at = CASE WHEN c.state = 'queued' THEN now() ELSE c.finished_at END,
			cancel_requested_at = CASE WHEN c.state = 'queued' THEN c.cancel_requested_at ELSE now() END
		FROM allocations a
		WHERE a.reservation_id = $1 AND c.node_id = a.node_id AND c.idempotency_key = 'bind:' || a.reservation_id || ':' || a.id
			AND c.state IN ('queued', 'delivered', 'running')`, reservationID)
	return err
}

func reasonOf(connectivity string) string {
	if connectivity == "lost" {
		return "nodeLost"
	}
	return "nodeUnreachable"
}

// failOnDeadNode fails a reservation not yet bound whose node is dead and
// whose request fits nowhere else: placed or binding -> failed, bookings
// cut. Its end reason is nodeLost when the node is lost, failed (the
// default of failed) while it is only unreachable.
func failOnDeadNode(ctx context.Context, tx store.Tx, r Reservation, nodeID, connectivity string) error {
	failure, err := json.Marshal(map[string]any{"code": core.CodeUnavailable,
		"message": fmt.Sprintf("node %s is %s and the request fits nowhere else in pool %s", nodeID, connectivity, r.PoolID),
		"details": map[string]any{"reason": reasonOf(connectivity), "nodeId": nodeID}})
	if err != nil {
		return err
	}
	if connectivity == "lost" {
		if err := store.SetReservationEndReason(ctx, tx, r.ID, states.EndNodeLost); err != nil {
			return err
		}
	}
	if err := cancelBindCommands(ctx, tx, r.ID); err != nil {
		return err
	}
	if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, states.State(r.State), states.Failed, failure); err != nil {
		return err
	}
	if err := store.CutReservationBookings(ctx, tx, r.TenantID, r.ID); err != nil {
		return err
	}
	return writeConditions(ctx, tx, r.ID, nil)
}

// endOnLostNode ends an active (or expired) reservation whose node was
// lost: -> releasing -> failed with end reason nodeLost, the failure
// {UNAVAILABLE, reason nodeLost}, its bookings cut (cdi.withdraw queued)
// and, through SetReservationState, its usage interval closed.
func endOnLostNode(ctx context.Context, tx store.Tx, r Reservation, nodeID string) error {
	failure, err := json.Marshal(map[string]any{"code": core.CodeUnavailable,
		"message": fmt.Sprintf("node %s was lost", nodeID),
		"details": map[string]any{"reason": "nodeLost", "nodeId": nodeID}})
	if err != nil {
		return err
	}
	if err := store.SetReservationEndReason(ctx, tx, r.ID, states.EndNodeLost); err != nil {
		return err
	}
	if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, states.State(r.State), states.Releasing, nil); err != nil {
		return err
	}
	if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, states.Releasing, states.Failed, failure); err != nil {
		return err
	}
	if err := store.CutReservationBookings(ctx, tx, r.TenantID, r.ID); err != nil {
		return err
	}
	return writeConditions(ctx, tx, r.ID, nil)
}

// setConditions gives an active reservation one NodeUnreachable per
// unreachable node it is on (keeping each one's since) and any other
// reservation none, writing the row and an event only on a change.
func setConditions(ctx context.Context, tx store.Tx, r Reservation, conn map[string]string) (string, error) {
	var want []Condition
	if r.State == string(states.Active) {
		now := time.Now().UnixMilli()
		for _, nodeID := range slices.Sorted(maps.Keys(conn)) {
			if conn[nodeID] != "unreachable" {
				continue
			}
			c := Condition{Type: CondNodeUnreachable, NodeID: nodeID, Since: now}
			if i := slices.IndexFunc(r.Conditions, func(o Condition) bool { return o.Type == c.Type && o.NodeID == nodeID }); i >= 0 {
				c.Since = r.Conditions[i].Since
			}
			want = append(want, c)
		}
	}
	if slices.Equal(want, r.Conditions) || (len(want) == 0 && len(r.Conditions) == 0) {
		return NodeHealthUnchanged, nil
	}
	if err := writeConditions(ctx, tx, r.ID, want); err != nil {
		return NodeHealthUnchanged, err
	}
	if want == nil {
		want = []Condition{}
	}
	return NodeHealthConditions, store.PublishEvent(ctx, tx, store.Event{TenantID: r.TenantID, Type: "reservation.conditions",
		ResourceType: "reservation", ResourceID: r.ID, ProjectID: r.ProjectID,
		Data: map[string]any{"poolId": r.PoolID, "conditions": want}})
}

func writeConditions(ctx context.Context, tx store.Tx, id string, conds []Condition) error {
	if conds == nil {
		conds = []Condition{}
	}
	raw, err := json.Marshal(conds)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE reservations SET conditions = $2, updated_at = now()
		WHERE id = $1 AND conditions <> $2::jsonb`, id, string(raw))
	return err
}

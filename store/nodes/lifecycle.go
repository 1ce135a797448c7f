package nodes

import (
	"context"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	policy "github.com/better-compute/better-compute/core/pools"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
)

// AcceptanceApproval in a pool's policy.acceptance makes joins wait for
// joinRequests.approve.
const AcceptanceApproval = "approval"

// AcceptanceChecks are the pool's checks an adoption attests.
func AcceptanceChecks(p policy.Policy) []string {
	return slices.DeleteFunc(slices.Clone(p.Acceptance), func(c string) bool { return c == AcceptanceApproval })
}

// joinedState is the provision state of a machine joining a pool.
func joinedState(p policy.Policy) nodestate.ProvisionState {
	if len(AcceptanceChecks(p)) > 0 {
		return nodestate.Adopting
	}
	return nodestate.Adopted
}

// Drain cordons the tenant's node and marks it draining in mode. The
// pool's policy.disruptionBudget bounds how many of its nodes drain at
// once: floor(budget × nodes), at least one when the budget is above
// zero; past it the drain is refused (INVALID_STATE, reason
// disruptionBudget) and nothing changes. A node already draining or
// drained is answered as it is.
func Drain(ctx context.Context, tx store.Tx, tenantID, id, mode, by string) (Node, error) {
	n, err := Get(ctx, tx, tenantID, id, true)
	if err != nil {
		return Node{}, err
	}
	if n.DrainState != "" {
		return n, nil
	}
	if err := notSiteNode(n, "drained"); err != nil {
		return Node{}, err
	}
	pool, err := pools.Load(ctx, tx, tenantID, n.PoolID)
	if err != nil {
		return Node{}, err
	}
	b, err := DrainBudget(ctx, tx, pool)
	if err != nil {
		return Node{}, err
	}
	if b.Draining+1 > b.Allowed {
		return Node{}, core.Errorf(core.CodeInvalidState, "pool %s's disruption budget (%g of %d nodes) allows %d draining nodes, and %d are",
			pool.ID, b.Budget, b.Total, b.Allowed, b.Draining).
			WithDetails(map[string]any{"reason": "disruptionBudget", "limit": b.Allowed, "draining": b.Draining})
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET cordoned = true, drain_state = 'draining', drain_mode = $2,
			drain_requested_at = now(), generation = generation + 1, updated_at = now() WHERE id = $1`, n.ID, mode); err != nil {
		return Node{}, err
	}
	if err := AddEvent(ctx, tx, n.ID, EventDraining, "draining ("+mode+") by "+by,
		map[string]any{"by": by, "mode": mode}); err != nil {
		return Node{}, err
	}
	return Get(ctx, tx, tenantID, n.ID, false)
}

// Budget is a pool's disruption budget as a drain reads it: the share,
// the pool's live nodes, how many may drain at once (floor(budget ×
// nodes), at least one when the budget is above zero) and how many are
// draining now.
type Budget struct {
	Budget                   float64
	Total, Allowed, Draining int
}

// DrainBudget reads the pool's Budget.
func DrainBudget(ctx context.Context, tx store.Tx, pool pools.Pool) (Budget, error) {
	var b Budget
	if err := tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE drain_state = 'draining')
		FROM nodes WHERE pool_id = $1 AND deleted_at IS NULL`, pool.ID).Scan(&b.Total, &b.Draining); err != nil {
		return Budget{}, err
	}
	b.Budget = policy.DefaultDisruptionBudget
	if pool.Policy.DisruptionBudget != nil {
		b.Budget = *pool.Policy.DisruptionBudget
	}
	b.Allowed = int(math.Floor(b.Budget * float64(b.Total)))
	if b.Budget > 0 && b.Allowed < 1 {
		b.Allowed = 1
	}
	return b, nil
}

// IsDraining reports whether the tenant's node is draining (false when it
// is gone).
func IsDraining(ctx context.Context, tx store.Tx, tenantID, id string) (bool, error) {
	var draining bool
	err := tx.QueryRow(ctx, `SELECT drain_state = 'draining' FROM nodes WHERE id = $1 AND tenant_id = $2`,
		id, tenantID).Scan(&draining)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return draining, err
}

// MarkDrained marks the tenant's draining node drained; false when it
// stopped draining meanwhile.
func MarkDrained(ctx context.Context, tx store.Tx, tenantID, id string) (bool, error) {
	tag, err := tx.Exec(ctx, `UPDATE nodes SET drain_state = 'drained', updated_at = now()
		WHERE id = $1 AND tenant_id = $2 AND drain_state = 'draining'`, id, tenantID)
	if err != nil || tag.RowsAffected() == 0 {
		return false, err
	}
	return true, AddEvent(ctx, tx, id, EventDrained, "drained: no reservation holds its atoms", nil)
}

// Adopt completes the takeover of the tenant's adopting node once its
// agent holds a session and has observed its NodeSpec: the operator
// attests the pool's acceptance checks, which the Adopted event records.
// An adopted node is answered as it is.
func Adopt(ctx context.Context, tx store.Tx, tenantID, id, by string) (Node, error) {
	n, err := Get(ctx, tx, tenantID, id, true)
	if err != nil {
		return Node{}, err
	}
	switch {
	case n.ProvisionState == string(nodestate.Adopted):
		return n, nil
	case n.ProvisionState != string(nodestate.Adopting):
		return Node{}, core.Errorf(core.CodeInvalidState, "node %s is %s, not adopting", n.ID, n.ProvisionState).
			WithDetails(map[string]any{"reason": "provisionState", "provisionState": n.ProvisionState})
	case n.Connectivity != string(nodestate.Connected) || n.ObservedGeneration < 1:
		return Node{}, core.Errorf(core.CodeInvalidState, "node %s's agent must hold a session and have observed its NodeSpec first", n.ID).
			WithDetails(map[string]any{"reason": "agentNotReady", "connectivity": n.Connectivity,
				"observedGeneration": n.ObservedGeneration})
	}
	pool, err := pools.Load(ctx, tx, tenantID, n.PoolID)
	if err != nil {
		return Node{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET provision_state = 'adopted', updated_at = now() WHERE id = $1`, n.ID); err != nil {
		return Node{}, err
	}
	if err := AddEvent(ctx, tx, n.ID, EventAdopted, "adopted by "+by,
		map[string]any{"by": by, "acceptance": AcceptanceChecks(pool.Policy)}); err != nil {
		return Node{}, err
	}
	return Get(ctx, tx, tenantID, n.ID, false)
}

// RevokeIdentity revokes every certificate of the tenant's node: its live
// session is closed at once (NodeIdentityRevokedChannel) and the agent
// cannot reconnect until it joins again. It answers the node.
func RevokeIdentity(ctx context.Context, tx store.Tx, tenantID, id, by string) (Node, error) {
	n, err := Get(ctx, tx, tenantID, id, true)
	if err != nil {
		return Node{}, err
	}
	count, err := RevokeNodeIdentities(ctx, tx, n.ID, by)
	if err != nil {
		return Node{}, err
	}
	if err := AddEvent(ctx, tx, n.ID, EventIdentityRevoked, "identities revoked",
		map[string]any{"by": by, "revoked": count}); err != nil {
		return Node{}, err
	}
	return n, nil
}

// durationOr reads a Go duration, def when empty or unreadable.
func durationOr(s string, def time.Duration) (time.Duration, bool) {
	if s == "" {
		return def, true
	}
	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		return def, false
	}
	return v, true
}

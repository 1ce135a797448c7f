package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
)

// Pool is what the nodes domain reads of a node's pool: who owns it,
// whether it is archived, how its devices are shared and the parts of its
// policy that govern joins, drains and inventory.
type Pool struct {
	ID       string
	TenantID string
	Sharing  string
	Agent    string
	Archived bool
	Policy   PoolPolicy
}

// PoolPolicy is the part of a pool's policy the nodes domain reads (the
// pools domain validates all of it when it is written).
type PoolPolicy struct {
	Acceptance       []string `json:"acceptance,omitempty"`
	LostAfter        string   `json:"lostAfter,omitempty"`
	DisruptionBudget *float64 `json:"disruptionBudget,omitempty"`
	HardwareProfile  string   `json:"hardwareProfile,omitempty"`
	Sharing          *struct {
		Replicas int `json:"replicas"`
	} `json:"sharing,omitempty"`
	MigLayout string `json:"migLayout,omitempty"`
}

// DefaultDisruptionBudget is a pool's disruption budget when its policy
// gives none.
const DefaultDisruptionBudget = 0.05

// AcceptanceApproval in a pool's policy.acceptance makes joins wait for
// joinRequests.approve.
const AcceptanceApproval = "approval"

// PoolNotFound is the error of a pool the caller may not see.
func PoolNotFound(id string) error { return core.Errorf(core.CodeNotFound, "pool %s not found", id) }

// ReadPool reads a pool the tenant owns ("" for any tenant's); lock takes
// it for a change (joins to one pool, and drains in it, are serialized).
func ReadPool(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (Pool, error) {
	q := `SELECT p.id, p.tenant_id, p.sharing, p.agent, p.archived_at IS NOT NULL, p.policy FROM pools p
		WHERE p.id = $1 AND ($2 = '' OR p.tenant_id = $2)`
	if lock {
		q += ` FOR UPDATE OF p`
	}
	var p Pool
	var policy []byte
	err := tx.QueryRow(ctx, q, id, tenantID).Scan(&p.ID, &p.TenantID, &p.Sharing, &p.Agent, &p.Archived, &policy)
	if errors.Is(err, pgx.ErrNoRows) {
		return Pool{}, PoolNotFound(id)
	}
	if err != nil {
		return Pool{}, err
	}
	if len(policy) > 0 {
		if err := json.Unmarshal(policy, &p.Policy); err != nil {
			return Pool{}, fmt.Errorf("pool %s policy: %w", p.ID, err)
		}
	}
	return p, nil
}

// LivePool is ReadPool of the tenant's pool, locked, for a change: an
// archived pool is INVALID_STATE.
func LivePool(ctx context.Context, tx store.Tx, tenantID, id string) (Pool, error) {
	p, err := ReadPool(ctx, tx, tenantID, id, true)
	if err == nil && p.Archived {
		err = core.Errorf(core.CodeInvalidState, "pool %s is archived", id)
	}
	return p, err
}

// AcceptanceChecks are the pool's checks an adoption attests.
func (p PoolPolicy) AcceptanceChecks() []string {
	return slices.DeleteFunc(slices.Clone(p.Acceptance), func(c string) bool { return c == AcceptanceApproval })
}

// joinedState is the provision state of a machine joining a pool.
func joinedState(p PoolPolicy) nodestate.ProvisionState {
	if len(p.AcceptanceChecks()) > 0 {
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
	pool, err := ReadPool(ctx, tx, tenantID, n.PoolID, true)
	if err != nil {
		return Node{}, err
	}
	var total, draining int
	if err := tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE drain_state = 'draining')
		FROM nodes WHERE pool_id = $1 AND deleted_at IS NULL`, n.PoolID).Scan(&total, &draining); err != nil {
		return Node{}, err
	}
	budget := DefaultDisruptionBudget
	if pool.Policy.DisruptionBudget != nil {
		budget = *pool.Policy.DisruptionBudget
	}
	allowed := int(math.Floor(budget * float64(total)))
	if budget > 0 && allowed < 1 {
		allowed = 1
	}
	if draining+1 > allowed {
		return Node{}, core.Errorf(core.CodeInvalidState, "pool %s's disruption budget (%g of %d nodes) allows %d draining nodes, and %d are",
			pool.ID, budget, total, allowed, draining).
			WithDetails(map[string]any{"reason": "disruptionBudget", "limit": allowed, "draining": draining})
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
	pool, err := ReadPool(ctx, tx, tenantID, n.PoolID, true)
	if err != nil {
		return Node{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET provision_state = 'adopted', updated_at = now() WHERE id = $1`, n.ID); err != nil {
		return Node{}, err
	}
	if err := AddEvent(ctx, tx, n.ID, EventAdopted, "adopted by "+by,
		map[string]any{"by": by, "acceptance": pool.Policy.AcceptanceChecks()}); err != nil {
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

package api

import (
	"context"
	"math"

	"github.com/better-compute/better-compute/core"
	poolpolicy "github.com/better-compute/better-compute/core/pools"
	"github.com/better-compute/better-compute/store"
	pooldomain "github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/workflows"
)

// nodes.drain cordons a node and starts its drain workflow
// (workflows.NodeDrainWorkflow, id <nodeId>/drain), which waits until no
// reservation holds the node's atoms any more ("wait", the default) or
// releases the active ones and cancels those not begun ("release"), then
// marks the node drained. The pool's policy.disruptionBudget bounds how many
// of its nodes drain at once: floor(budget × nodes), at least one when the
// budget is above zero; past it the drain is refused (INVALID_STATE, reason
// disruptionBudget) and nothing changes. Draining a node already draining
// or drained answers it as it is; nodes.uncordon ends a drain.

type drainInput struct {
	NodeID string `json:"nodeId"`
	Mode   string `json:"mode"`
}

func (s *Server) nodesDrain(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in drainInput
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if in.Mode == "" {
		in.Mode = workflows.DrainWait
	}
	n, err := s.loadNode(ctx, tx, c.TenantID, in.NodeID, true)
	if err != nil {
		return nil, err
	}
	if n.DrainState != "" {
		return n, nil
	}
	pool, err := pooldomain.Load(ctx, tx, c.TenantID, n.PoolID)
	if err != nil {
		return nil, err
	}
	var total, draining int
	if err := tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE drain_state = 'draining')
		FROM nodes WHERE pool_id = $1 AND deleted_at IS NULL`, n.PoolID).Scan(&total, &draining); err != nil {
		return nil, err
	}
	budget := poolpolicy.DefaultDisruptionBudget
	if pool.Policy.DisruptionBudget != nil {
		budget = *pool.Policy.DisruptionBudget
	}
	allowed := int(math.Floor(budget * float64(total)))
	if budget > 0 && allowed < 1 {
		allowed = 1
	}
	if draining+1 > allowed {
		return nil, core.Errorf(core.CodeInvalidState, "pool %s's disruption budget (%g of %d nodes) allows %d draining nodes, and %d are",
			pool.ID, budget, total, allowed, draining).
			WithDetails(map[string]any{"reason": "disruptionBudget", "limit": allowed, "draining": draining})
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET cordoned = true, drain_state = 'draining', drain_mode = $2,
			drain_requested_at = now(), generation = generation + 1, updated_at = now() WHERE id = $1`, n.ID, in.Mode); err != nil {
		return nil, err
	}
	if err := addNodeEvent(ctx, tx, n.ID, EventDraining, "draining ("+in.Mode+") by "+c.Caller.IdentityID,
		map[string]any{"by": c.Caller.IdentityID, "mode": in.Mode}); err != nil {
		return nil, err
	}
	return s.loadNode(ctx, tx, c.TenantID, n.ID, false)
}

// afterDrain starts the node's drain workflow once the drain is committed.
func (s *Server) afterDrain(ctx context.Context, c *Call, out any) (any, error) {
	n := out.(Node)
	if n.DrainState != "draining" || s.deps.Temporal == nil {
		return n, nil
	}
	if err := workflows.StartNodeDrain(ctx, s.deps.Temporal, s.deps.TaskQueue,
		workflows.NodeDrainParams{TenantID: n.TenantID, NodeID: n.ID, Mode: n.DrainMode}); err != nil {
		return nil, core.Wrap(core.CodeUnavailable, err, "the node is draining, but its drain workflow could not be started; drain it again")
	}
	return n, nil
}

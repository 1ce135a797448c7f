package api

import (
	"context"
	"slices"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/nodes"
	poolpolicy "github.com/better-compute/better-compute/core/pools"
	"github.com/better-compute/better-compute/store"
	pooldomain "github.com/better-compute/better-compute/store/pools"
)

// Adoption takes over a machine that already runs bcd (the path beside
// bare-metal enrollment): a machine joining a pool whose policy.acceptance
// names checks besides approval lands in provision state adopting, not
// schedulable, and nodes.adopt completes the takeover once its agent holds
// a session and has observed its NodeSpec: the operator attests the pool's
// acceptance checks, which the Adopted event records. Without such checks a
// joining machine is adopted at once.

// EventAdopted records an adoption.
const EventAdopted = "Adopted"

// acceptanceChecks are the pool's checks an adoption attests.
func acceptanceChecks(p poolpolicy.Policy) []string {
	return slices.DeleteFunc(slices.Clone(p.Acceptance), func(c string) bool { return c == AcceptanceApproval })
}

// joinedState is the provision state of a machine joining a pool.
func joinedState(p poolpolicy.Policy) nodes.ProvisionState {
	if len(acceptanceChecks(p)) > 0 {
		return nodes.Adopting
	}
	return nodes.Adopted
}

func (s *Server) nodesAdopt(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	n, err := s.lockedNode(ctx, c, tx)
	if err != nil {
		return nil, err
	}
	switch {
	case n.ProvisionState == string(nodes.Adopted):
		return n, nil
	case n.ProvisionState != string(nodes.Adopting):
		return nil, core.Errorf(core.CodeInvalidState, "node %s is %s, not adopting", n.ID, n.ProvisionState).
			WithDetails(map[string]any{"reason": "provisionState", "provisionState": n.ProvisionState})
	case n.Connectivity != string(nodes.Connected) || n.ObservedGeneration < 1:
		return nil, core.Errorf(core.CodeInvalidState, "node %s's agent must hold a session and have observed its NodeSpec first", n.ID).
			WithDetails(map[string]any{"reason": "agentNotReady", "connectivity": n.Connectivity,
				"observedGeneration": n.ObservedGeneration})
	}
	pool, err := pooldomain.Load(ctx, tx, c.TenantID, n.PoolID)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET provision_state = 'adopted', updated_at = now() WHERE id = $1`, n.ID); err != nil {
		return nil, err
	}
	if err := addNodeEvent(ctx, tx, n.ID, EventAdopted, "adopted by "+c.Caller.IdentityID,
		map[string]any{"by": c.Caller.IdentityID, "acceptance": acceptanceChecks(pool.Policy)}); err != nil {
		return nil, err
	}
	return s.loadNode(ctx, tx, c.TenantID, n.ID, false)
}

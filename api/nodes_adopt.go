package api

import (
	"context"

	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// Adoption takes over a machine that already runs bcd (the path beside
// bare-metal enrollment): a machine joining a pool whose policy.acceptance
// names checks besides approval lands in provision state adopting, not
// schedulable, and nodes.adopt completes the takeover (domain.Adopt).

// EventAdopted records an adoption.
const EventAdopted = domain.EventAdopted

func (s *Server) nodesAdopt(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in nodeIDInput
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return domain.Adopt(ctx, tx, c.TenantID, in.NodeID, c.Caller.IdentityID)
}

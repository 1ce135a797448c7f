package agentgateway

import (
	"context"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// The NodeSpec: a node's desired state as the control plane holds it,
// numbered by nodes.generation (every change of a spec field increments
// it). The session sends it in a spec frame after welcome and whenever the
// generation moved; the agent converges on it and answers an observed frame
// with the generation it reached, which becomes nodes.observed_generation.
// A node is schedulable only once observed_generation is at least 1.

// sendSpec sends the node's spec when its generation is past the last one
// sent on this stream.
func (c *sessionConn) sendSpec(ctx context.Context) error {
	generation, spec, err := domain.Spec(ctx, c.g.deps.Store.Pool, c.a.nodeID)
	if err != nil || generation <= c.lastSpec {
		return err
	}
	if err := c.send(protocol.Spec{Type: protocol.FrameSpec, Generation: generation, Spec: spec}); err != nil {
		return err
	}
	c.lastSpec = generation
	return nil
}

// observed records the generation the agent converged on, in the session's
// epoch; a generation the node never had is ignored.
func (c *sessionConn) observed(ctx context.Context, generation int64) error {
	return c.g.inFencedTx(ctx, c.a.nodeID, c.a.getEpoch(), func(tx store.Tx) error {
		return domain.Observed(ctx, tx, c.a.nodeID, generation)
	})
}

package api

import (
	"context"
	"encoding/json"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/store"
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
	f := protocol.Spec{Type: protocol.FrameSpec}
	var labels, taints []byte
	err := c.s.store.Pool.QueryRow(ctx, `SELECT generation, labels, taints, cordoned, drain_state FROM nodes WHERE id = $1`,
		c.a.nodeID).Scan(&f.Generation, &labels, &taints, &f.Spec.Cordoned, &f.Spec.Drain)
	if err != nil || f.Generation <= c.lastSpec {
		return err
	}
	if err := json.Unmarshal(labels, &f.Spec.Labels); err != nil {
		return err
	}
	if err := json.Unmarshal(taints, &f.Spec.Taints); err != nil {
		return err
	}
	if err := c.send(f); err != nil {
		return err
	}
	c.lastSpec = f.Generation
	return nil
}

// observed records the generation the agent converged on, in the session's
// epoch; a generation the node never had is ignored.
func (c *sessionConn) observed(ctx context.Context, generation int64) error {
	return c.s.inFencedTx(ctx, c.a.nodeID, c.a.getEpoch(), func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE nodes SET observed_generation = $2, updated_at = now()
			WHERE id = $1 AND $2 <= generation AND $2 > observed_generation`, c.a.nodeID, generation)
		return err
	})
}

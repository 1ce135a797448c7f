package api

import (
	"context"

	nodesact "github.com/better-compute/better-compute/activities/nodes"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// nodes.drain cordons a node and starts its drain workflow
// (NodeDrainWorkflow, id <nodeId>/drain), which waits until no
// reservation holds the node's atoms any more ("wait", the default) or
// releases the active ones and cancels those not begun ("release"), then
// marks the node drained. The pool's disruption budget bounds the drains
// (domain.Drain); nodes.uncordon ends a drain.

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
		in.Mode = nodesact.DrainWait
	}
	return domain.Drain(ctx, tx, c.TenantID, in.NodeID, in.Mode, c.Caller.IdentityID)
}

// afterDrain starts the node's drain workflow once the drain is committed.
func (s *Server) afterDrain(ctx context.Context, c *Call, out any) (any, error) {
	n := out.(Node)
	if n.DrainState != "draining" || s.deps.Temporal == nil {
		return n, nil
	}
	if err := nodesact.StartNodeDrain(ctx, s.deps.Temporal, s.deps.TaskQueue,
		nodesact.NodeDrainParams{TenantID: n.TenantID, NodeID: n.ID, Mode: n.DrainMode}); err != nil {
		return nil, core.Wrap(core.CodeUnavailable, err, "the node is draining, but its drain workflow could not be started; drain it again")
	}
	return n, nil
}

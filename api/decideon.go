package api

import (
	"context"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// decisionOf picks the call's decision among its method's alternatives:
// the descriptor's DecideOn when it has one (the choice needs a database
// read, as a pool's site kind does), else the input (chooseDecision).
func (s *Server) decisionOf(ctx context.Context, c *Call) (core.Decision, error) {
	h := s.handlers[c.Method.FullName()]
	if h == nil || h.DecideOn == nil || len(c.Method.Decisions) < 2 {
		return chooseDecision(c.Method, c.Input)
	}
	var typ string
	if err := s.store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		typ, err = h.DecideOn(ctx, c, tx)
		return err
	}); err != nil {
		return core.Decision{}, err
	}
	for _, d := range c.Method.Decisions {
		if d.Resource.Type == typ {
			return d, nil
		}
	}
	return core.Decision{}, core.Errorf(core.CodeInternal, "%s: DecideOn chose %q, which is not one of its alternatives", c.Method.FullName(), typ)
}

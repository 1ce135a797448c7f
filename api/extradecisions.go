package api

import (
	"context"
	"encoding/json"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// pendingContext is the request context of a decision that carries input
// fields as pending attributes of an existing resource ("with the new
// sizeGiB pending"): {"pending": {field: value}}, which a Cedar policy
// reads as context.pending.sizeGiB next to the resource's current
// resource.sizeGiB. nil when the decision carries none.
func pendingContext(d core.Decision, fields map[string]any) map[string]any {
	if len(d.PendingAttrs) == 0 {
		return nil
	}
	pending := make(map[string]any, len(d.PendingAttrs))
	for _, a := range d.PendingAttrs {
		v, ok := fields[a]
		if !ok {
			continue
		}
		if n, isNum := v.(json.Number); isNum {
			f, err := n.Float64()
			if err != nil {
				continue
			}
			v = f
		}
		pending[a] = v
	}
	return map[string]any{"pending": pending}
}

// requireAlso requires a mutation's further decisions (rpc.Method.Also)
// for the call's caller, each in order, after the method's own decision
// and outside any transaction: Also reads what it needs in a read-only
// transaction of its own.
func (s *Server) requireAlso(ctx context.Context, c *Call, h *rpc.Handler) error {
	if h.Also == nil {
		return nil
	}
	var reqs []rpc.Requirement
	if err := s.store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		reqs, err = h.Also(ctx, c, tx)
		return err
	}); err != nil {
		return err
	}
	for _, r := range reqs {
		req := c.Request(r.Resource)
		req.Action = r.Action
		if err := s.iam.Require(ctx, req); err != nil {
			return err
		}
	}
	return nil
}

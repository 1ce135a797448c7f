package agentgateway

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// SweepLiveness is one pass of the liveness controller: connected and
// disconnected nodes whose liveness lease lapsed become unreachable (with
// the condition NodeUnreachable), and unreachable ones whose lease lapsed
// more than their pool's policy.lostAfter ago become lost, each with an
// event. It answers how many nodes it changed.
//
// Every change is a conditional UPDATE of rows it locks, so any number of
// API replicas may sweep at once: a node changes once, by whichever
// replica locks it first. A heartbeat undoes it.
func (g *Gateway) SweepLiveness(ctx context.Context) (int, error) {
	total := 0
	for _, sweep := range []func(store.Tx) (int, error){
		func(tx store.Tx) (int, error) { return domain.SweepUnreachable(ctx, tx) },
		func(tx store.Tx) (int, error) { return domain.SweepLost(ctx, tx, g.deps.Logger) },
	} {
		for {
			var n int
			err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
				n, err = sweep(tx)
				return err
			})
			total += n
			if err != nil {
				return total, err
			}
			if n < domain.SweepBatch {
				break
			}
		}
	}
	return total, nil
}

// RunLivenessSweeper sweeps every interval until ctx ends.
func (g *Gateway) RunLivenessSweeper(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if n, err := g.SweepLiveness(ctx); err != nil && ctx.Err() == nil {
			g.deps.Logger.Error("liveness sweep", "error", err)
		} else if n > 0 {
			g.deps.Logger.Info("liveness sweep", "changed", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

package api

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/store"
)

// sweepBatch bounds the nodes one statement of a sweep changes.
const sweepBatch = 500

// SweepLiveness is one pass of the liveness controller: connected and
// disconnected nodes whose liveness lease lapsed become unreachable (with
// the condition NodeUnreachable), and unreachable ones whose lease lapsed
// more than their pool's policy.lostAfter ago (DefaultLostAfter when unset)
// become lost, each with an event. It answers how many nodes it changed.
//
// Every change is a conditional UPDATE of rows it locks, so any number of
// API replicas may sweep at once: a node changes once, by whichever
// replica locks it first. A heartbeat undoes it (agentHeartbeatFrame).
func (s *Server) SweepLiveness(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := s.sweepUnreachable(ctx)
		total += n
		if err != nil {
			return total, err
		}
		if n < sweepBatch {
			break
		}
	}
	for {
		n, err := s.sweepLost(ctx)
		total += n
		if err != nil {
			return total, err
		}
		if n < sweepBatch {
			return total, nil
		}
	}
}

// RunLivenessSweeper sweeps every interval until ctx ends.
func (s *Server) RunLivenessSweeper(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if n, err := s.SweepLiveness(ctx); err != nil && ctx.Err() == nil {
			s.deps.Logger.Error("liveness sweep", "error", err)
		} else if n > 0 {
			s.deps.Logger.Info("liveness sweep", "changed", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type sweptNode struct {
	id, from string
	expired  time.Time
}

func collectSwept(rows pgx.Rows, err error) ([]sweptNode, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (sweptNode, error) {
		var n sweptNode
		return n, r.Scan(&n.id, &n.from, &n.expired)
	})
}

func (s *Server) sweepUnreachable(ctx context.Context) (int, error) {
	var swept []sweptNode
	err := s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		swept, err = collectSwept(tx.Query(ctx, `WITH old AS (
				SELECT id, connectivity FROM nodes
				WHERE deleted_at IS NULL AND connectivity IN ('connected', 'disconnected') AND liveness_expires_at < now()
				ORDER BY liveness_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
			UPDATE nodes n SET connectivity = 'unreachable', updated_at = now(),
				conditions = (SELECT coalesce(jsonb_agg(c), '[]') FROM jsonb_array_elements(n.conditions) c
						WHERE c->>'type' <> $2 OR coalesce(c->>'device', '') <> '')
					|| jsonb_build_array(jsonb_build_object('type', $2::text, 'status', 'True', 'reason', 'LeaseExpired',
						'message', 'no heartbeat since ' || to_char(n.liveness_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
						'since', (extract(epoch FROM now()) * 1000)::bigint))
			FROM old WHERE n.id = old.id
			RETURNING n.id, old.connectivity, n.liveness_expires_at`, sweepBatch, CondNodeUnreachable))
		if err != nil {
			return err
		}
		for _, n := range swept {
			if err := connectivityChanged(ctx, tx, n.id, n.from, "unreachable", 0); err != nil {
				return err
			}
			if err := addNodeEvent(ctx, tx, n.id, EventConditionRaised, CondNodeUnreachable+": the liveness lease lapsed",
				map[string]any{"type": CondNodeUnreachable, "reason": "LeaseExpired",
					"leaseExpiredAt": n.expired.UnixMilli()}); err != nil {
				return err
			}
		}
		return nil
	})
	return len(swept), err
}

func (s *Server) sweepLost(ctx context.Context) (int, error) {
	var swept []sweptNode
	err := s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		// The pools of unreachable nodes, with their lostAfter in seconds.
		var pools []string
		var secs []float64
		rows, err := tx.Query(ctx, `SELECT DISTINCT p.id, coalesce(p.policy->>'lostAfter', '') FROM nodes n
			JOIN pools p ON p.id = n.pool_id
			WHERE n.deleted_at IS NULL AND n.connectivity = 'unreachable' AND n.liveness_expires_at < now()`)
		if err != nil {
			return err
		}
		var poolID, lostAfter string
		if _, err := pgx.ForEachRow(rows, []any{&poolID, &lostAfter}, func() error {
			d := DefaultLostAfter
			if lostAfter != "" {
				v, err := time.ParseDuration(lostAfter)
				if err != nil || v <= 0 {
					s.deps.Logger.Warn("liveness sweep: pool policy.lostAfter unreadable; using the default",
						"pool", poolID, "lostAfter", lostAfter)
				} else {
					d = v
				}
			}
			pools, secs = append(pools, poolID), append(secs, d.Seconds())
			return nil
		}); err != nil {
			return err
		}
		if len(pools) == 0 {
			return nil
		}
		swept, err = collectSwept(tx.Query(ctx, `WITH old AS (
				SELECT m.id, m.connectivity FROM nodes m
				JOIN unnest($1::text[], $2::float8[]) AS pl (pool_id, secs) ON pl.pool_id = m.pool_id
				WHERE m.deleted_at IS NULL AND m.connectivity = 'unreachable'
				  AND m.liveness_expires_at + make_interval(secs => pl.secs) < now()
				ORDER BY m.liveness_expires_at LIMIT $3 FOR UPDATE OF m SKIP LOCKED)
			UPDATE nodes n SET connectivity = 'lost', updated_at = now()
			FROM old WHERE n.id = old.id
			RETURNING n.id, old.connectivity, n.liveness_expires_at`, pools, secs, sweepBatch))
		if err != nil {
			return err
		}
		for _, n := range swept {
			if err := connectivityChanged(ctx, tx, n.id, n.from, "lost", 0); err != nil {
				return fmt.Errorf("node %s: %w", n.id, err)
			}
		}
		return nil
	})
	return len(swept), err
}

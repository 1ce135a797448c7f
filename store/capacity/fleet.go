package capacity

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/store"
)

// Fleet is the whole platform's state counted for operators (the API's
// Prometheus gauges), across every tenant. Every state of each closed set is
// present, zero when nothing is in it, so a series never vanishes.
type Fleet struct {
	// Reservations by state.
	Reservations map[string]int64
	// Nodes by connectivity and whether they are schedulable (the
	// schedulability predicate, schedulableSQL), live nodes only.
	Nodes []NodeCount
	// Commands are node commands by state.
	Commands map[string]int64
	// UnstartedAgeSeconds is the age of the oldest live reservation whose
	// workflow start is not recorded (0 when there is none): how far behind
	// the reconciler is.
	UnstartedAgeSeconds float64
}

// NodeCount is the number of live nodes with one connectivity and
// schedulability.
type NodeCount struct {
	Connectivity string
	Schedulable  bool
	Count        int64
}

// CountFleet counts the fleet in tx. Each count is one aggregate over an
// indexed column, so it stays cheap on a large fleet; callers still cache it.
func CountFleet(ctx context.Context, tx store.Tx) (Fleet, error) {
	f := Fleet{Reservations: map[string]int64{}, Commands: map[string]int64{}}
	for _, s := range reservations.States {
		f.Reservations[string(s)] = 0
	}
	for _, s := range protocol.CommandStates {
		f.Commands[string(s)] = 0
	}
	if err := countBy(ctx, tx, `SELECT state, count(*) FROM reservations GROUP BY state`, f.Reservations); err != nil {
		return f, fmt.Errorf("count reservations: %w", err)
	}
	if err := countBy(ctx, tx, `SELECT state, count(*) FROM node_commands GROUP BY state`, f.Commands); err != nil {
		return f, fmt.Errorf("count node commands: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT n.connectivity, (`+schedulableSQL+`) AS schedulable, count(*)
		FROM nodes n WHERE n.deleted_at IS NULL GROUP BY 1, 2`)
	if err != nil {
		return f, fmt.Errorf("count nodes: %w", err)
	}
	counted, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeCount, error) {
		var n NodeCount
		return n, r.Scan(&n.Connectivity, &n.Schedulable, &n.Count)
	})
	if err != nil {
		return f, fmt.Errorf("count nodes: %w", err)
	}
	for _, c := range nodes.Connectivities {
		for _, sched := range []bool{false, true} {
			n := NodeCount{Connectivity: string(c), Schedulable: sched}
			for _, x := range counted {
				if x.Connectivity == n.Connectivity && x.Schedulable == sched {
					n.Count = x.Count
				}
			}
			f.Nodes = append(f.Nodes, n)
		}
	}
	// The same live states as the reconciler's query (store.UnstartedReservations).
	if err := tx.QueryRow(ctx, `SELECT COALESCE(extract(epoch FROM now() - min(updated_at)), 0)::float8
		FROM reservations
		WHERE workflow_started_at IS NULL AND state IN ('placed', 'binding', 'active', 'expired', 'releasing')`).
		Scan(&f.UnstartedAgeSeconds); err != nil {
		return f, fmt.Errorf("oldest unstarted reservation: %w", err)
	}
	return f, nil
}

func countBy(ctx context.Context, tx store.Tx, sql string, into map[string]int64) error {
	rows, err := tx.Query(ctx, sql)
	if err != nil {
		return err
	}
	var key string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error {
		into[key] = n
		return nil
	})
	return err
}

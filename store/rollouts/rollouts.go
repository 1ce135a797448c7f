package rollouts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	corerollouts "github.com/better-compute/better-compute/core/rollouts"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
)

// DefaultNodeTimeout bounds how long one node may take from its drain to
// its check before it is failed.
const DefaultNodeTimeout = 15 * time.Minute

// Acceptance is the optional check a node passes after its update: an
// exec command (argv, no shell) that must exit 0.
type Acceptance struct {
	Argv           []string `json:"argv"`
	TimeoutSeconds int64    `json:"timeoutSeconds,omitempty"`
}

// Rollout is a rollouts row, with its nodes' counts per state (and, from
// Get, its nodes).
type Rollout struct {
	ID                 string            `json:"id"`
	ReleaseID          string            `json:"releaseId"`
	PoolID             string            `json:"poolId"`
	Labels             map[string]string `json:"labels,omitempty"`
	State              string            `json:"state"`
	Wave               int               `json:"wave"`
	Waves              int               `json:"waves"`
	FailureThreshold   float64           `json:"failureThreshold"`
	Acceptance         *Acceptance       `json:"acceptanceCommand,omitempty"`
	NodeTimeoutSeconds int               `json:"nodeTimeoutSeconds"`
	Rollback           bool              `json:"rollback,omitempty"`
	Reason             string            `json:"reason,omitempty"`
	CreatedBy          string            `json:"createdBy"`
	CreatedAt          int64             `json:"createdAt"`
	UpdatedAt          int64             `json:"updatedAt"`
	FinishedAt         *int64            `json:"finishedAt,omitempty"`
	Counts             map[string]int    `json:"counts"`
	Nodes              []Node            `json:"nodes,omitempty"`
}

// Node is a rollout_nodes row.
type Node struct {
	NodeID     string `json:"nodeId"`
	Wave       int    `json:"wave"`
	State      string `json:"state"`
	CommandSeq *int64 `json:"commandSeq,omitempty"`
	Error      string `json:"error,omitempty"`
	StepAt     int64  `json:"stepAt"`
}

const rolloutColumns = `o.id, o.release_id, o.pool_id, o.labels, o.state, o.wave, o.waves, o.failure_threshold,
	o.acceptance_command, o.node_timeout_s, o.rollback, o.reason, o.created_by,
	` + `(floor(extract(epoch FROM o.created_at) * 1000)::bigint), (floor(extract(epoch FROM o.updated_at) * 1000)::bigint),
	(floor(extract(epoch FROM o.finished_at) * 1000)::bigint),
	(SELECT coalesce(jsonb_object_agg(state, n), '{}') FROM (SELECT state, count(*) AS n FROM rollout_nodes
		WHERE rollout_id = o.id GROUP BY state) c)`

func scanRollout(row pgx.Row) (Rollout, error) {
	var o Rollout
	var labels, acceptance, counts []byte
	if err := row.Scan(&o.ID, &o.ReleaseID, &o.PoolID, &labels, &o.State, &o.Wave, &o.Waves, &o.FailureThreshold,
		&acceptance, &o.NodeTimeoutSeconds, &o.Rollback, &o.Reason, &o.CreatedBy, &o.CreatedAt, &o.UpdatedAt,
		&o.FinishedAt, &counts); err != nil {
		return Rollout{}, err
	}
	if len(acceptance) > 0 && string(acceptance) != "null" {
		o.Acceptance = &Acceptance{}
		if err := json.Unmarshal(acceptance, o.Acceptance); err != nil {
			return Rollout{}, err
		}
	}
	if err := json.Unmarshal(counts, &o.Counts); err != nil {
		return Rollout{}, err
	}
	return o, json.Unmarshal(labels, &o.Labels)
}

func notFound(id string) error {
	return core.Errorf(core.CodeNotFound, "rollout %s not found", id)
}

// CreateRequest is one rollouts.create, in the root tenant.
type CreateRequest struct {
	TenantID         string
	ReleaseID        string
	PoolID           string
	Labels           map[string]string
	Canary           int
	Waves            []corerollouts.Wave
	FailureThreshold float64
	Acceptance       *Acceptance
	NodeTimeout      time.Duration
	By               string
}

// Create records a rollout, running, with its selection resolved now to
// the pool's live node-agent nodes carrying every label, in id order, cut
// into waves by corerollouts.Plan. A selection that is empty, or whose
// pool's disruption budget allows no node to drain, is INVALID_STATE
// (reason emptySelection or disruptionBudget): such a rollout could never
// move.
func Create(ctx context.Context, tx store.Tx, p CreateRequest) (Rollout, error) {
	if p.Acceptance != nil && (len(p.Acceptance.Argv) == 0 || p.Acceptance.Argv[0] == "") {
		return Rollout{}, core.Errorf(core.CodeInvalidInput, "acceptanceCommand.argv names the command to run").
			WithDetails(map[string]any{"field": "acceptanceCommand.argv", "reason": "required"})
	}
	if _, err := GetRelease(ctx, tx, p.ReleaseID); err != nil {
		return Rollout{}, err
	}
	pool, err := pools.LoadByID(ctx, tx, p.PoolID)
	if err != nil {
		return Rollout{}, err
	}
	b, err := nodes.DrainBudget(ctx, tx, pool)
	if err != nil {
		return Rollout{}, err
	}
	if b.Allowed < 1 {
		return Rollout{}, core.Errorf(core.CodeInvalidState, "pool %s's disruption budget (%g of %d nodes) lets no node drain: the rollout could never update one",
			pool.ID, b.Budget, b.Total).WithDetails(map[string]any{"reason": "disruptionBudget", "limit": b.Allowed,
			"budget": b.Budget, "poolNodes": b.Total})
	}
	labels := p.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	rawLabels, err := json.Marshal(labels)
	if err != nil {
		return Rollout{}, err
	}
	rows, err := tx.Query(ctx, `SELECT id FROM nodes WHERE pool_id = $1 AND deleted_at IS NULL AND adapter = 'bcd/v1'
		AND labels @> $2 ORDER BY id`, pool.ID, rawLabels)
	if err != nil {
		return Rollout{}, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return Rollout{}, err
	}
	plan := corerollouts.Plan(len(ids), p.Canary, p.Waves)
	if len(plan) == 0 {
		return Rollout{}, core.Errorf(core.CodeInvalidState, "the selection names no node of pool %s", pool.ID).
			WithDetails(map[string]any{"reason": "emptySelection"})
	}
	var acceptance []byte
	if p.Acceptance != nil {
		if acceptance, err = json.Marshal(p.Acceptance); err != nil {
			return Rollout{}, err
		}
	}
	timeout := p.NodeTimeout
	if timeout <= 0 {
		timeout = DefaultNodeTimeout
	}
	id := core.NewID(RolloutPrefix)
	if _, err := tx.Exec(ctx, `INSERT INTO rollouts (id, tenant_id, release_id, pool_id, labels, state, waves,
			failure_threshold, acceptance_command, node_timeout_s, created_by)
		VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $8, $9, $10)`,
		id, p.TenantID, p.ReleaseID, pool.ID, rawLabels, len(plan), p.FailureThreshold, acceptance,
		int(timeout/time.Second), p.By); err != nil {
		return Rollout{}, err
	}
	waves := make([]int, 0, len(ids))
	for w, n := range plan {
		for range n {
			waves = append(waves, w)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO rollout_nodes (rollout_id, node_id, wave)
		SELECT $1, n, w FROM unnest($2::text[], $3::int[]) AS u(n, w)`, id, ids, waves); err != nil {
		return Rollout{}, err
	}
	return Get(ctx, tx, id, false)
}

// Get reads a rollout, with its nodes when withNodes.
func Get(ctx context.Context, tx store.DBTX, id string, withNodes bool) (Rollout, error) {
	o, err := scanRollout(tx.QueryRow(ctx, `SELECT `+rolloutColumns+` FROM rollouts o WHERE o.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Rollout{}, notFound(id)
	}
	if err != nil || !withNodes {
		return o, err
	}
	o.Nodes, err = listNodes(ctx, tx, id)
	return o, err
}

func listNodes(ctx context.Context, tx store.DBTX, id string) ([]Node, error) {
	rows, err := tx.Query(ctx, `SELECT node_id, wave, state, command_seq, error,
		(floor(extract(epoch FROM step_at) * 1000)::bigint)
		FROM rollout_nodes WHERE rollout_id = $1 ORDER BY wave, node_id`, id)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Node, error) {
		var n Node
		err := r.Scan(&n.NodeID, &n.Wave, &n.State, &n.CommandSeq, &n.Error, &n.StepAt)
		return n, err
	})
}

// List reads rollouts oldest first (creation millisecond, then id), in
// state when it is not "": the page after its key, plus one.
func List(ctx context.Context, tx store.DBTX, state string, page store.PageQuery) ([]Rollout, error) {
	if page.Limit < 1 {
		return nil, fmt.Errorf("rollouts: limit %d", page.Limit)
	}
	k := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+rolloutColumns+` FROM rollouts o
		WHERE ($1 = '' OR o.state = $1) AND (`+store.MsOf("o.created_at")+`, o.id) > ($3, $4)
		ORDER BY `+store.MsOf("o.created_at")+`, o.id LIMIT $2`, state, page.Fetch(), k.At, k.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Rollout, error) { return scanRollout(r) })
}

// lockState reads a rollout's state, locking its row.
func lockState(ctx context.Context, tx store.Tx, id string) (string, error) {
	var state string
	err := tx.QueryRow(ctx, `SELECT state FROM rollouts WHERE id = $1 FOR UPDATE`, id).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", notFound(id)
	}
	return state, err
}

func setState(ctx context.Context, tx store.Tx, id, state, reason string) error {
	_, err := tx.Exec(ctx, `UPDATE rollouts SET state = $2, reason = $3, updated_at = now(),
		finished_at = CASE WHEN $2 IN ('aborted', 'succeeded') THEN now() END WHERE id = $1`, id, state, reason)
	return err
}

// Pause stops a running rollout between nodes: nodes already in flight
// finish their step, no pending one starts. A paused one is answered as
// it is; a finished or aborting one is INVALID_STATE.
func Pause(ctx context.Context, tx store.Tx, id string) (Rollout, error) {
	state, err := lockState(ctx, tx, id)
	if err != nil {
		return Rollout{}, err
	}
	switch state {
	case corerollouts.Running:
		if err := setState(ctx, tx, id, corerollouts.Paused, "paused by the operator"); err != nil {
			return Rollout{}, err
		}
	case corerollouts.Paused, corerollouts.PausedOnFailure:
	default:
		return Rollout{}, invalidState(state, "rollout %s is %s: it cannot be paused", id, state)
	}
	return Get(ctx, tx, id, false)
}

// Resume runs a paused rollout again (one paused on failure too: the
// operator has looked at the failed nodes, which stay failed). A running
// one is answered as it is; a finished or aborting one is INVALID_STATE.
func Resume(ctx context.Context, tx store.Tx, id string) (Rollout, error) {
	state, err := lockState(ctx, tx, id)
	if err != nil {
		return Rollout{}, err
	}
	switch state {
	case corerollouts.Paused, corerollouts.PausedOnFailure:
		if _, err := tx.Exec(ctx, `UPDATE rollouts SET state = 'running', reason = '', updated_at = now(),
			-- the failures the operator resumed past no longer count against the threshold
			resumed_failed = (SELECT count(*) FROM rollout_nodes WHERE rollout_id = $1 AND wave = rollouts.wave AND state = 'failed')
			WHERE id = $1`, id); err != nil {
			return Rollout{}, err
		}
	case corerollouts.Running:
	default:
		return Rollout{}, invalidState(state, "rollout %s is %s: it cannot be resumed", id, state)
	}
	return Get(ctx, tx, id, false)
}

// Abort stops a rollout: its workflow skips the nodes not begun, lets
// those in flight end, and with rollback puts the nodes it updated back on
// the previous release of the same name (when there is none, rollback is
// INVALID_STATE, reason noPreviousRelease). An aborting or aborted one is
// answered as it is; a succeeded one is INVALID_STATE.
func Abort(ctx context.Context, tx store.Tx, id string, rollback bool) (Rollout, error) {
	state, err := lockState(ctx, tx, id)
	if err != nil {
		return Rollout{}, err
	}
	switch state {
	case corerollouts.Aborting, corerollouts.Aborted:
		return Get(ctx, tx, id, false)
	case corerollouts.Succeeded:
		return Rollout{}, invalidState(state, "rollout %s has succeeded: it cannot be aborted", id)
	}
	if rollback {
		o, err := Get(ctx, tx, id, false)
		if err != nil {
			return Rollout{}, err
		}
		r, err := GetRelease(ctx, tx, o.ReleaseID)
		if err != nil {
			return Rollout{}, err
		}
		prev, err := previousRelease(ctx, tx, r)
		if err != nil {
			return Rollout{}, err
		}
		if prev == nil {
			return Rollout{}, invalidState("noPreviousRelease", "release %s@%s has no earlier release of its name to roll back to",
				r.Name, r.Version)
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE rollouts SET state = 'aborting', rollback = $2, reason = 'aborted by the operator',
		updated_at = now() WHERE id = $1`, id, rollback); err != nil {
		return Rollout{}, err
	}
	return Get(ctx, tx, id, false)
}

// Owed answers the rollouts whose workflow has work (running or
// aborting), oldest first, at most limit: the reconciler restarts their
// workflows.
func Owed(ctx context.Context, tx store.DBTX, limit int) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT id FROM rollouts WHERE state IN ('running', 'aborting') ORDER BY created_at, id LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

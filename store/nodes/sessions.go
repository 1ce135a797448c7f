package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/store"
)

// A node's session state: each session takes the node with a new fencing
// epoch (nodes.session_epoch); every later write of the session is
// conditional on it, so of two sessions for one node only the newer
// writes. The liveness lease (liveness_expires_at) is renewed by every
// heartbeat; the sweeps move nodes whose lease lapsed to unreachable, then
// lost.

// Liveness conditions.
const (
	CondNodeUnreachable = "NodeUnreachable"
	CondClockSkew       = "ClockSkew"
)

// DefaultLostAfter is how long an unreachable node stays before it is lost
// when its pool's policy.lostAfter is unset.
const DefaultLostAfter = 5 * time.Minute

// MaxClockSkew is how far the agent's clock may be from the server's
// before the node gets the ClockSkew condition.
const MaxClockSkew = 5 * time.Second

// Session endings the writes report.
var (
	ErrSuperseded = errors.New("a newer session holds the node")
	ErrRevoked    = errors.New("the node's identity was revoked")
)

// Welcome is what a new session learns when it takes the node.
type Welcome struct {
	Epoch int64
	// InventoryDigest is the digest of the node's latest snapshot ("" when
	// none).
	InventoryDigest string
}

// StartSession takes the node for a new session with a new epoch:
// connected, its liveness lease renewed for lease, its clock skew recorded.
func StartSession(ctx context.Context, tx store.Tx, nodeID, agentVersion string, lease, skew time.Duration) (Welcome, error) {
	var w Welcome
	var prev string
	var conds []byte
	err := tx.QueryRow(ctx, `WITH old AS (SELECT id, connectivity FROM nodes WHERE id = $1 AND deleted_at IS NULL FOR UPDATE)
		UPDATE nodes n SET session_epoch = n.session_epoch + 1, connectivity = 'connected', agent_version = $2,
			liveness_expires_at = now() + make_interval(secs => $3), last_heartbeat_at = now(), clock_skew_ms = $4,
			updated_at = now()
		FROM old WHERE n.id = old.id RETURNING n.session_epoch, old.connectivity, n.conditions`,
		nodeID, agentVersion, lease.Seconds(), skew.Milliseconds()).Scan(&w.Epoch, &prev, &conds)
	if errors.Is(err, pgx.ErrNoRows) {
		return Welcome{}, NotFound(nodeID)
	}
	if err != nil {
		return Welcome{}, err
	}
	if err := connectivityChanged(ctx, tx, nodeID, prev, "connected", w.Epoch); err != nil {
		return Welcome{}, err
	}
	if err := setLivenessConditions(ctx, tx, nodeID, conds, skew); err != nil {
		return Welcome{}, err
	}
	err = tx.QueryRow(ctx, `SELECT digest FROM node_inventories WHERE node_id = $1 ORDER BY seq DESC LIMIT 1`,
		nodeID).Scan(&w.InventoryDigest)
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	return w, err
}

// HoldSession locks the node in the session's epoch; ErrSuperseded when a
// newer session took it (or the node is gone).
func HoldSession(ctx context.Context, tx store.Tx, nodeID string, epoch int64) error {
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM nodes WHERE id = $1 AND session_epoch = $2 AND deleted_at IS NULL FOR UPDATE`,
		nodeID, epoch).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrSuperseded
	}
	return err
}

// Heartbeat renews the liveness lease in the session's epoch, brings the
// node back to connected and checks the identity (serial) again. It
// answers the node's NodeSpec generation.
func Heartbeat(ctx context.Context, tx store.Tx, nodeID, serial string, epoch int64, lease, skew time.Duration) (int64, error) {
	// A heartbeat is soft state: one lost to a crash only makes the lease
	// look older until the next. Not waiting for its WAL flush halves what
	// thousands of them cost PostgreSQL.
	if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
		return 0, err
	}
	var prev string
	var conds []byte
	var generation int64
	err := tx.QueryRow(ctx, `WITH old AS (SELECT id, connectivity FROM nodes
			WHERE id = $1 AND session_epoch = $2 AND deleted_at IS NULL FOR UPDATE)
		UPDATE nodes n SET liveness_expires_at = now() + make_interval(secs => $3), last_heartbeat_at = now(),
			clock_skew_ms = $4, connectivity = 'connected',
			updated_at = CASE WHEN old.connectivity <> 'connected' THEN now() ELSE n.updated_at END
		FROM old WHERE n.id = old.id RETURNING old.connectivity, n.conditions, n.generation`,
		nodeID, epoch, lease.Seconds(), skew.Milliseconds()).Scan(&prev, &conds, &generation)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, ErrSuperseded
	}
	if err != nil {
		return 0, err
	}
	ok, err := NodeIdentityValid(ctx, tx, nodeID, serial)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, ErrRevoked
	}
	if err := connectivityChanged(ctx, tx, nodeID, prev, "connected", epoch); err != nil {
		return 0, err
	}
	return generation, setLivenessConditions(ctx, tx, nodeID, conds, skew)
}

// EndSession marks the node disconnected when the ended session still
// holds it.
func EndSession(ctx context.Context, tx store.Tx, nodeID string, epoch int64) error {
	var prev string
	err := tx.QueryRow(ctx, `WITH old AS (SELECT id, connectivity FROM nodes
			WHERE id = $1 AND session_epoch = $2 AND connectivity = 'connected' FOR UPDATE)
		UPDATE nodes n SET connectivity = 'disconnected', updated_at = now()
		FROM old WHERE n.id = old.id RETURNING old.connectivity`, nodeID, epoch).Scan(&prev)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	return connectivityChanged(ctx, tx, nodeID, prev, "disconnected", epoch)
}

// Spec reads the node's NodeSpec: its generation and desired state.
func Spec(ctx context.Context, db store.DBTX, nodeID string) (int64, nodespec.Spec, error) {
	var generation int64
	var spec nodespec.Spec
	var labels, taints []byte
	err := db.QueryRow(ctx, `SELECT generation, labels, taints, cordoned, drain_state FROM nodes WHERE id = $1`,
		nodeID).Scan(&generation, &labels, &taints, &spec.Cordoned, &spec.Drain)
	if err != nil {
		return 0, spec, err
	}
	if err := json.Unmarshal(labels, &spec.Labels); err != nil {
		return 0, spec, err
	}
	return generation, spec, json.Unmarshal(taints, &spec.Taints)
}

// Observed records the generation the agent converged on; a generation the
// node never had is ignored. The caller holds the session (HoldSession).
func Observed(ctx context.Context, tx store.Tx, nodeID string, generation int64) error {
	_, err := tx.Exec(ctx, `UPDATE nodes SET observed_generation = $2, updated_at = now()
		WHERE id = $1 AND $2 <= generation AND $2 > observed_generation`, nodeID, generation)
	return err
}

// connectivityChanged writes a ConnectivityChanged event when from ≠ to.
func connectivityChanged(ctx context.Context, tx store.Tx, nodeID, from, to string, epoch int64) error {
	if from == to {
		return nil
	}
	details := map[string]any{"from": from, "to": to}
	if epoch > 0 {
		details["epoch"] = epoch
	}
	return AddEvent(ctx, tx, nodeID, EventConnectivity, "connectivity "+from+" → "+to, details)
}

// setLivenessConditions clears NodeUnreachable (the node is heard from) and
// raises or clears ClockSkew for skew, writing the node's conditions and
// an event per change only when something changed.
func setLivenessConditions(ctx context.Context, tx store.Tx, nodeID string, raw []byte, skew time.Duration) error {
	var conds []Condition
	if err := json.Unmarshal(raw, &conds); err != nil {
		return fmt.Errorf("node %s conditions: %w", nodeID, err)
	}
	changed := false
	has := func(typ string) bool {
		return slices.ContainsFunc(conds, func(c Condition) bool { return c.Type == typ && c.Device == "" })
	}
	drop := func(typ string) error {
		if !has(typ) {
			return nil
		}
		conds = slices.DeleteFunc(conds, func(c Condition) bool { return c.Type == typ && c.Device == "" })
		changed = true
		return AddEvent(ctx, tx, nodeID, EventConditionClear, typ+" cleared", map[string]any{"type": typ})
	}
	if err := drop(CondNodeUnreachable); err != nil {
		return err
	}
	if skew > MaxClockSkew || skew < -MaxClockSkew {
		if !has(CondClockSkew) {
			reason, dir := "AgentClockAhead", "ahead of"
			if skew < 0 {
				reason, dir = "AgentClockBehind", "behind"
			}
			msg := fmt.Sprintf("the agent's clock is %s %s the server's", skew.Abs().Round(time.Millisecond), dir)
			conds = append(conds, Condition{Type: CondClockSkew, Status: "True", Reason: reason, Message: msg,
				Since: time.Now().UnixMilli()})
			changed = true
			if err := AddEvent(ctx, tx, nodeID, EventConditionRaised, CondClockSkew+": "+msg,
				map[string]any{"type": CondClockSkew, "reason": reason, "skewMs": skew.Milliseconds()}); err != nil {
				return err
			}
		}
	} else if err := drop(CondClockSkew); err != nil {
		return err
	}
	if !changed {
		return nil
	}
	if conds == nil {
		conds = []Condition{}
	}
	out, err := json.Marshal(conds)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE nodes SET conditions = $2, updated_at = now() WHERE id = $1`, nodeID, string(out))
	return err
}

// SweepBatch bounds the nodes one sweep statement changes.
const SweepBatch = 500

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

// SweepUnreachable moves at most SweepBatch connected and disconnected
// nodes whose liveness lease lapsed to unreachable, with the condition
// NodeUnreachable and an event each, and answers how many. Every change is
// a conditional UPDATE of rows it locks (skipping locked ones), so any
// number of replicas may sweep at once.
func SweepUnreachable(ctx context.Context, tx store.Tx) (int, error) {
	swept, err := collectSwept(tx.Query(ctx, `WITH old AS (
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
		RETURNING n.id, old.connectivity, n.liveness_expires_at`, SweepBatch, CondNodeUnreachable))
	if err != nil {
		return 0, err
	}
	for _, n := range swept {
		if err := connectivityChanged(ctx, tx, n.id, n.from, "unreachable", 0); err != nil {
			return 0, err
		}
		if err := AddEvent(ctx, tx, n.id, EventConditionRaised, CondNodeUnreachable+": the liveness lease lapsed",
			map[string]any{"type": CondNodeUnreachable, "reason": "LeaseExpired",
				"leaseExpiredAt": n.expired.UnixMilli()}); err != nil {
			return 0, err
		}
	}
	return len(swept), nil
}

// SweepLost moves at most SweepBatch unreachable nodes whose lease lapsed
// more than their pool's policy.lostAfter ago (DefaultLostAfter when unset
// or unreadable, which it logs) to lost, with an event each, and answers
// how many.
func SweepLost(ctx context.Context, tx store.Tx, log *slog.Logger) (int, error) {
	// The pools of unreachable nodes, with their lostAfter in seconds.
	var pools []string
	var secs []float64
	rows, err := tx.Query(ctx, `SELECT DISTINCT p.id, coalesce(p.policy->>'lostAfter', '') FROM nodes n
		JOIN pools p ON p.id = n.pool_id
		WHERE n.deleted_at IS NULL AND n.connectivity = 'unreachable' AND n.liveness_expires_at < now()`)
	if err != nil {
		return 0, err
	}
	var poolID, lostAfter string
	if _, err := pgx.ForEachRow(rows, []any{&poolID, &lostAfter}, func() error {
		d, ok := durationOr(lostAfter, DefaultLostAfter)
		if !ok {
			log.Warn("liveness sweep: pool policy.lostAfter unreadable; using the default",
				"pool", poolID, "lostAfter", lostAfter)
		}
		pools, secs = append(pools, poolID), append(secs, d.Seconds())
		return nil
	}); err != nil {
		return 0, err
	}
	if len(pools) == 0 {
		return 0, nil
	}
	swept, err := collectSwept(tx.Query(ctx, `WITH old AS (
			SELECT m.id, m.connectivity FROM nodes m
			JOIN unnest($1::text[], $2::float8[]) AS pl (pool_id, secs) ON pl.pool_id = m.pool_id
			WHERE m.deleted_at IS NULL AND m.connectivity = 'unreachable'
			  AND m.liveness_expires_at + make_interval(secs => pl.secs) < now()
			ORDER BY m.liveness_expires_at LIMIT $3 FOR UPDATE OF m SKIP LOCKED)
		UPDATE nodes n SET connectivity = 'lost', updated_at = now()
		FROM old WHERE n.id = old.id
		RETURNING n.id, old.connectivity, n.liveness_expires_at`, pools, secs, SweepBatch))
	if err != nil {
		return 0, err
	}
	for _, n := range swept {
		if err := connectivityChanged(ctx, tx, n.id, n.from, "lost", 0); err != nil {
			return 0, fmt.Errorf("node %s: %w", n.id, err)
		}
	}
	return len(swept), nil
}

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
// writes. The liveness lease lives in the narrow node_liveness table
// (expires_at, with a copy of the epoch that fences it), renewed by
// heartbeats in batches (RecordHeartbeats) without writing the nodes row;
// the sweeps move nodes whose lease lapsed to unreachable, then lost.

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
			updated_at = now()
		FROM old WHERE n.id = old.id RETURNING n.session_epoch, old.connectivity, n.conditions`,
		nodeID, agentVersion).Scan(&w.Epoch, &prev, &conds)
	if errors.Is(err, pgx.ErrNoRows) {
		return Welcome{}, NotFound(nodeID)
	}
	if err != nil {
		return Welcome{}, err
	}
	if err := putLiveness(ctx, tx, nodeID, w.Epoch, lease, &skew); err != nil {
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

// putLiveness writes the node's liveness row: the session's epoch, a lease
// of lease from now, and the clock skew (nil: unknown).
func putLiveness(ctx context.Context, tx store.Tx, nodeID string, epoch int64, lease time.Duration, skew *time.Duration) error {
	var skewMs *int64
	if skew != nil {
		ms := skew.Milliseconds()
		skewMs = &ms
	}
	_, err := tx.Exec(ctx, `INSERT INTO node_liveness (node_id, session_epoch, expires_at, last_heartbeat_at, clock_skew_ms)
		VALUES ($1, $2, now() + make_interval(secs => $3), now(), $4)
		ON CONFLICT (node_id) DO UPDATE SET session_epoch = EXCLUDED.session_epoch, expires_at = EXCLUDED.expires_at,
			last_heartbeat_at = EXCLUDED.last_heartbeat_at, clock_skew_ms = EXCLUDED.clock_skew_ms`,
		nodeID, epoch, lease.Seconds(), skewMs)
	return err
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

// Beat is one heartbeat of a session, for RecordHeartbeats.
type Beat struct {
	NodeID string
	Epoch  int64
	Skew   time.Duration
	// Serial, when set, is checked as NodeIdentityValid would (the
	// session's periodic identity check rides on the batch).
	Serial string
}

// BeatResult is what RecordHeartbeats learned of one beat.
type BeatResult struct {
	// Recorded: the lease is renewed. When false the session no longer
	// holds the node (ErrSuperseded) and nothing was written for it.
	Recorded bool
	// Generation is the node's NodeSpec generation.
	Generation int64
	// NeedsRepair: the node's row does not say what a heartbeat means
	// (it is not connected, carries NodeUnreachable, or its ClockSkew
	// condition disagrees with Skew); RepairLiveness brings it in step.
	NeedsRepair bool
	// IdentityValid is false when the beat's Serial is no longer a valid
	// identity of the node (always true when Serial was empty).
	IdentityValid bool
}

// RecordHeartbeats renews the liveness lease of every beat whose session
// still holds its node, in one statement on the narrow node_liveness
// table (no write to nodes), and answers one result per beat, in order.
// The caller commits; a heartbeat is soft state, so the transaction may
// use synchronous_commit off (HeartbeatTx).
func RecordHeartbeats(ctx context.Context, tx store.Tx, lease time.Duration, beats []Beat) ([]BeatResult, error) {
	ids := make([]string, len(beats))
	epochs := make([]int64, len(beats))
	skews := make([]int64, len(beats))
	serials := make([]string, len(beats))
	for i, b := range beats {
		ids[i], epochs[i], skews[i], serials[i] = b.NodeID, b.Epoch, b.Skew.Milliseconds(), b.Serial
	}
	// ord keeps each beat's place. Two processes' batches share a row only
	// while a node moves between them (the older session is superseded);
	// a deadlock between them fails one batch, which the caller retries.
	rows, err := tx.Query(ctx, `WITH b AS (
			SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $7::text[])
				WITH ORDINALITY AS b (node_id, epoch, skew_ms, serial, ord)),
		up AS (
			UPDATE node_liveness l SET expires_at = now() + make_interval(secs => $4), last_heartbeat_at = now(),
				clock_skew_ms = b.skew_ms
			FROM b WHERE l.node_id = b.node_id AND l.session_epoch = b.epoch
			RETURNING l.node_id, l.session_epoch)
		SELECT b.ord, n.generation, n.connectivity,
			EXISTS (SELECT 1 FROM jsonb_array_elements(n.conditions) c
				WHERE c->>'type' = $5 AND coalesce(c->>'device', '') = ''),
			EXISTS (SELECT 1 FROM jsonb_array_elements(n.conditions) c
				WHERE c->>'type' = $6 AND coalesce(c->>'device', '') = ''),
			b.serial = '' OR EXISTS (SELECT 1 FROM node_identities i WHERE i.node_id = b.node_id AND i.serial = b.serial
				AND i.revoked_at IS NULL AND i.expires_at > now())
		FROM b JOIN up ON up.node_id = b.node_id AND up.session_epoch = b.epoch
		JOIN nodes n ON n.id = b.node_id AND n.deleted_at IS NULL`,
		ids, epochs, skews, lease.Seconds(), CondNodeUnreachable, CondClockSkew, serials)
	if err != nil {
		return nil, err
	}
	out := make([]BeatResult, len(beats))
	var ord, generation int64
	var connectivity string
	var unreachable, skewed, identity bool
	if _, err := pgx.ForEachRow(rows, []any{&ord, &generation, &connectivity, &unreachable, &skewed, &identity}, func() error {
		i := int(ord) - 1
		if i < 0 || i >= len(beats) {
			return fmt.Errorf("heartbeat batch: ordinal %d out of range", ord)
		}
		out[i] = BeatResult{Recorded: true, Generation: generation, IdentityValid: identity,
			NeedsRepair: connectivity != "connected" || unreachable || skewed != skewTooLarge(beats[i].Skew)}
		return nil
	}); err != nil {
		return nil, err
	}
	return out, nil
}

// HeartbeatTx prepares tx for RecordHeartbeats: a heartbeat is soft state
// (one lost to a crash only makes the lease look older until the next), so
// its commit does not wait for the WAL flush.
func HeartbeatTx(ctx context.Context, tx store.Tx) error {
	_, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`)
	return err
}

func skewTooLarge(skew time.Duration) bool { return skew > MaxClockSkew || skew < -MaxClockSkew }

// RepairLiveness brings a heartbeating node's row in step with its
// session, in the session's epoch: connected (with an event when it was
// not), NodeUnreachable cleared, ClockSkew raised or cleared for skew.
// RecordHeartbeats says when it is needed; the caller holds no lock.
func RepairLiveness(ctx context.Context, tx store.Tx, nodeID string, epoch int64, skew time.Duration) error {
	var prev string
	var conds []byte
	err := tx.QueryRow(ctx, `WITH old AS (SELECT id, connectivity FROM nodes
			WHERE id = $1 AND session_epoch = $2 AND deleted_at IS NULL FOR UPDATE)
		UPDATE nodes n SET connectivity = 'connected',
			updated_at = CASE WHEN old.connectivity <> 'connected' THEN now() ELSE n.updated_at END
		FROM old WHERE n.id = old.id RETURNING old.connectivity, n.conditions`,
		nodeID, epoch).Scan(&prev, &conds)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrSuperseded
	}
	if err != nil {
		return err
	}
	if err := connectivityChanged(ctx, tx, nodeID, prev, "connected", epoch); err != nil {
		return err
	}
	return setLivenessConditions(ctx, tx, nodeID, conds, skew)
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
	if err := json.Unmarshal(taints, &spec.Taints); err != nil {
		return 0, spec, err
	}
	if spec.Instances, err = specInstances(ctx, db, nodeID); err != nil {
		return 0, spec, err
	}
	if err := specVolumes(ctx, db, nodeID, &spec); err != nil {
		return 0, spec, err
	}
	if spec.SSH, err = specSSH(ctx, db, nodeID); err != nil {
		return 0, spec, err
	}
	return generation, spec, nil
}

// NodeSpecChannel is notified with the node id when a node's NodeSpec
// generation moves (a trigger, migrations/00039_node_spec_notify.sql).
const NodeSpecChannel = "node_spec"

// BumpGeneration moves the node's NodeSpec generation after a change of a
// section other domains keep (its instances, its sshd trust), in the
// caller's transaction; the session sends the new spec.
func BumpGeneration(ctx context.Context, tx store.Tx, nodeID string) error {
	_, err := tx.Exec(ctx, `UPDATE nodes SET generation = generation + 1, updated_at = now() WHERE id = $1`, nodeID)
	return err
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
	if skewTooLarge(skew) {
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
			SELECT m.id, m.connectivity, l.expires_at FROM nodes m JOIN node_liveness l ON l.node_id = m.id
			WHERE m.deleted_at IS NULL AND m.connectivity IN ('connected', 'disconnected') AND l.expires_at < now()
			ORDER BY l.expires_at LIMIT $1 FOR UPDATE OF m, l SKIP LOCKED)
		UPDATE nodes n SET connectivity = 'unreachable', updated_at = now(),
			conditions = (SELECT coalesce(jsonb_agg(c), '[]') FROM jsonb_array_elements(n.conditions) c
					WHERE c->>'type' <> $2 OR coalesce(c->>'device', '') <> '')
				|| jsonb_build_array(jsonb_build_object('type', $2::text, 'status', 'True', 'reason', 'LeaseExpired',
					'message', 'no heartbeat since ' || to_char(old.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
					'since', (extract(epoch FROM now()) * 1000)::bigint))
		FROM old WHERE n.id = old.id
		RETURNING n.id, old.connectivity, old.expires_at`, SweepBatch, CondNodeUnreachable))
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
		JOIN node_liveness l ON l.node_id = n.id JOIN pools p ON p.id = n.pool_id
		WHERE n.deleted_at IS NULL AND n.connectivity = 'unreachable' AND l.expires_at < now()`)
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
			SELECT m.id, m.connectivity, l.expires_at FROM nodes m
			JOIN node_liveness l ON l.node_id = m.id
			JOIN unnest($1::text[], $2::float8[]) AS pl (pool_id, secs) ON pl.pool_id = m.pool_id
			WHERE m.deleted_at IS NULL AND m.connectivity = 'unreachable'
			  AND l.expires_at + make_interval(secs => pl.secs) < now()
			ORDER BY l.expires_at LIMIT $3 FOR UPDATE OF m, l SKIP LOCKED)
		UPDATE nodes n SET connectivity = 'lost', updated_at = now()
		FROM old WHERE n.id = old.id
		RETURNING n.id, old.connectivity, old.expires_at`, pools, secs, SweepBatch))
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

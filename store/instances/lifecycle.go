package instances

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/instances"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/flavors"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
)

// bump moves the instance's generation (its desired state or limits
// changed) and its node's NodeSpec generation, in one transaction.
func bump(ctx context.Context, tx store.Tx, in Instance) error {
	if _, err := tx.Exec(ctx, `UPDATE instances SET generation = generation + 1, updated_at = now() WHERE id = $1`, in.ID); err != nil {
		return err
	}
	if in.NodeID == "" {
		return nil
	}
	return nodes.BumpGeneration(ctx, tx, in.NodeID)
}

// Change applies start, stop or delete (core/instances' table): the
// desired state, the in-between state and the generations, in the
// caller's transaction. changed is false when the call found it already
// done (nothing written, the workflow need not be told).
func Change(ctx context.Context, tx store.Tx, tenantID, id string, m states.Method) (Instance, bool, error) {
	in, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Instance{}, false, err
	}
	if in.State == string(states.Draft) || in.State == string(states.Denied) {
		return Instance{}, false, notFound(id)
	}
	rule, err := states.Check(m, states.State(in.State))
	if err != nil {
		return Instance{}, false, err
	}
	if rule.Effect == states.AlreadyDone {
		return in, false, nil
	}
	desired := states.DesiredAfter(m, states.Desired(in.DesiredState))
	if _, err := tx.Exec(ctx, `UPDATE instances SET desired_state = $2, failure = NULL WHERE id = $1`, in.ID, string(desired)); err != nil {
		return Instance{}, false, err
	}
	if err := setState(ctx, tx, in, rule.To, nil); err != nil {
		return Instance{}, false, err
	}
	if err := bump(ctx, tx, in); err != nil {
		return Instance{}, false, err
	}
	out, err := Load(ctx, tx, tenantID, id, false)
	return out, true, err
}

// Resize moves the instance to another flavor of its pool. On a vps-host
// pool the allocation's scalars are checked and rebooked on the same node
// under the node's lock (a flavor that does not fit is INVALID_STATE,
// reason noCapacity, and changes nothing); a change of the GPU count is
// UNSUPPORTED with reason "gpus" (the atoms would move). The state goes
// to resizing and the generations move, in the caller's transaction.
func Resize(ctx context.Context, tx store.Tx, tenantID, id, flavorID string) (Instance, error) {
	in, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Instance{}, err
	}
	if in.State == string(states.Draft) || in.State == string(states.Denied) {
		return Instance{}, notFound(id)
	}
	rule, err := states.Check(states.MethodResize, states.State(in.State))
	if err != nil {
		return Instance{}, err
	}
	if in.FlavorID == flavorID {
		return in, nil
	}
	f, err := flavors.Get(ctx, tx, in.PoolID, flavorID)
	if err != nil {
		return Instance{}, err
	}
	if f.GPUs != in.GPUs {
		return Instance{}, core.Errorf(core.CodeUnsupported, "a resize keeps the GPU count (%d); flavor %s has %d", in.GPUs, f.ID, f.GPUs).
			WithDetails(map[string]any{"field": "flavorId", "reason": "gpus"})
	}
	if in.NodeID != "" {
		pool, err := pools.View(ctx, tx, tenantID, in.PoolID)
		if err != nil {
			return Instance{}, err
		}
		if err := lockNode(ctx, tx, in.NodeID); err != nil {
			return Instance{}, err
		}
		scalars, err := nodeScalars(ctx, tx, pool, []string{in.NodeID})
		if err != nil {
			return Instance{}, err
		}
		s := scalars[in.NodeID]
		// What the instance holds now is freed by the resize.
		s.UsedVCPU -= int64(in.VCPU)
		s.UsedMemory -= in.MemoryMiB
		if !s.Fits(int64(f.VCPU), f.MemoryMiB) {
			return Instance{}, core.Errorf(core.CodeInvalidState, "flavor %s does not fit on node %s", f.ID, in.NodeID).
				WithDetails(map[string]any{"reason": "noCapacity", "nodes": []map[string]any{scalarReason(s, f)}})
		}
		if _, err := tx.Exec(ctx, `UPDATE allocations SET vcpu = $2, memory_mib = $3
			WHERE instance_id = $1 AND released_at IS NULL`, in.ID, f.VCPU, f.MemoryMiB); err != nil {
			return Instance{}, err
		}
		if err := checkQuota(ctx, tx, tenantID, pool, askOf(in, f).minus(in)); err != nil {
			return Instance{}, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE instances SET flavor_id = $2 WHERE id = $1`, in.ID, f.ID); err != nil {
		return Instance{}, err
	}
	if err := putAuthzShape(ctx, tx, in, f); err != nil {
		return Instance{}, err
	}
	if err := setState(ctx, tx, in, rule.To, nil); err != nil {
		return Instance{}, err
	}
	if err := bump(ctx, tx, in); err != nil {
		return Instance{}, err
	}
	return Load(ctx, tx, tenantID, id, false)
}

// putAuthzShape writes the new flavor's shape into the instance's
// authorization row, so later decisions see what it is now.
func putAuthzShape(ctx context.Context, tx store.Tx, in Instance, f flavors.Flavor) error {
	_, err := tx.Exec(ctx, `UPDATE authz_resources SET attributes = attributes || jsonb_build_object('vcpu', $3::int,
			'memoryGiB', $4::float8, 'gpus', $5::int), updated_at = now()
		WHERE id = $1 AND tenant_id = $2`, in.ID, in.TenantID, f.VCPU, f.MemoryGiB, f.GPUs)
	return err
}

// Observe records a node's report of its instances (the instances
// frame): each status's state, generation, address, applied limits and
// error, for instances placed on that node only; a Full report marks the
// node's instances it does not name as gone. It answers the ids whose
// row changed, whose workflows the caller signals after the commit.
func Observe(ctx context.Context, tx store.Tx, nodeID string, full bool, statuses []protocol.InstanceStatus) ([]string, error) {
	var changed []string
	named := make([]string, 0, len(statuses))
	for _, s := range statuses {
		named = append(named, s.ID)
		var id string
		err := tx.QueryRow(ctx, `UPDATE instances SET observed_state = $3, observed_generation = GREATEST(observed_generation, $4),
				address = CASE WHEN $5 <> '' THEN $5 ELSE address END, applied_vcpu = $6, applied_memory_mib = $7,
				observed_error = $8, observed_at = now()
			WHERE id = $1 AND node_id = $2 AND state NOT IN ('draft', 'denied', 'deleted') AND $4 <= generation
				AND $4 >= observed_generation
			RETURNING id`, s.ID, nodeID, s.State, s.Generation, s.Address, s.VCPU, s.MemoryMiB, s.Error).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // another node's, unknown, an answer to a spec it never had, or older than one recorded
		}
		if err != nil {
			return nil, err
		}
		changed = append(changed, id)
	}
	if full {
		rows, err := tx.Query(ctx, `UPDATE instances SET observed_state = $3, observed_at = now()
			WHERE node_id = $1 AND NOT (id = ANY($2)) AND state NOT IN ('draft', 'denied', 'deleted')
				AND observed_state <> $3
			RETURNING id`, nodeID, named, states.ObservedGone)
		if err != nil {
			return nil, err
		}
		gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		changed = append(changed, gone...)
	}
	return changed, nil
}

// Progress is what a convergence step found: the state as recorded, the
// desired state, whether they agree (Settled), whether the instance is
// deleted (Done), since when it has been converging (epoch ms, 0 when
// settled) and the runtime's last error.
type Progress struct {
	State           string
	Desired         string
	Settled         bool
	Done            bool
	ConvergingSince int64
	ObservedError   string
	NodeID          string
	PoolClass       string
}

// Converge is one step of the instance's workflow on a vps-host pool:
// it moves the recorded state on what the node reported
// (core/instances.Next) and, for a deleted desired state, once the node
// reports the instance gone (or the node is lost or deleted), finishes
// the delete (FinishDelete). A missing row is Done.
func Converge(ctx context.Context, tx store.Tx, id string) (Progress, error) {
	var in Instance
	var observed, class, connectivity string
	var observedGen int64
	var convergingSince *int64
	var nodeGone bool
	err := tx.QueryRow(ctx, `SELECT i.tenant_id, i.project_id, i.pool_id, i.state, i.desired_state, i.generation,
			COALESCE(i.node_id, ''), i.observed_state, i.observed_generation, i.observed_error, p.class,
			COALESCE(n.connectivity, ''), (n.id IS NOT NULL AND n.deleted_at IS NOT NULL), `+msOf("i.converging_since")+`
		FROM instances i JOIN pools p ON p.id = i.pool_id LEFT JOIN nodes n ON n.id = i.node_id
		WHERE i.id = $1 FOR UPDATE OF i`, id).Scan(&in.TenantID, &in.ProjectID, &in.PoolID, &in.State, &in.DesiredState,
		&in.Generation, &in.NodeID, &observed, &observedGen, &in.ObservedError, &class, &connectivity, &nodeGone, &convergingSince)
	if errors.Is(err, pgx.ErrNoRows) {
		return Progress{Done: true, State: string(states.Deleted)}, nil
	}
	if err != nil {
		return Progress{}, err
	}
	in.ID = id
	p := Progress{State: in.State, Desired: in.DesiredState, ObservedError: in.ObservedError, NodeID: in.NodeID, PoolClass: class}
	if convergingSince != nil {
		p.ConvergingSince = *convergingSince
	}
	if states.Terminal(states.State(in.State)) {
		p.Done = in.State == string(states.Deleted)
		p.Settled = true
		return p, nil
	}
	if in.DesiredState == string(states.DesiredDeleted) && class == ClassVPSHost {
		if in.NodeID == "" || observed == states.ObservedGone || nodeGone || connectivity == "lost" {
			if err := finishDelete(ctx, tx, in); err != nil {
				return Progress{}, err
			}
			p.State, p.Done, p.Settled, p.ConvergingSince = string(states.Deleted), true, true, 0
		}
		return p, nil
	}
	next := states.Next(states.State(in.State), states.Desired(in.DesiredState), in.Generation, observed, observedGen)
	if next != states.State(in.State) {
		if err := setState(ctx, tx, in, next, nil); err != nil {
			return Progress{}, err
		}
		p.State = string(next)
	}
	p.Settled = states.Settled(states.State(p.State), states.Desired(p.Desired))
	if p.Settled {
		p.ConvergingSince = 0
	}
	return p, nil
}

// MarkFailed records that the instance did not converge within the
// workflow's bound: state failed with {reason, message} (and the
// runtime's error), unless it settled or was deleted meanwhile.
func MarkFailed(ctx context.Context, tx store.Tx, id, reason, message string) error {
	in, err := LoadByID(ctx, tx, id)
	if err != nil || states.Terminal(states.State(in.State)) || states.Settled(states.State(in.State), states.Desired(in.DesiredState)) ||
		in.State == string(states.Failed) || in.DesiredState == string(states.DesiredDeleted) {
		return err
	}
	failure, err := json.Marshal(map[string]any{"code": core.CodeUnavailable, "message": message,
		"details": map[string]any{"reason": reason, "observedError": in.ObservedError}})
	if err != nil {
		return err
	}
	return setState(ctx, tx, in, states.Failed, failure)
}

// LoadByID reads an instance by id alone (the workflow knows its
// id, not a caller's tenant), locked.
func LoadByID(ctx context.Context, tx store.Tx, id string) (Instance, error) {
	var tenantID string
	err := tx.QueryRow(ctx, `SELECT tenant_id FROM instances WHERE id = $1`, id).Scan(&tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Instance{}, notFound(id)
	}
	if err != nil {
		return Instance{}, err
	}
	return Load(ctx, tx, tenantID, id, true)
}

// FinishDelete ends a deleted instance whose runtime is gone (a provider
// pool's droplet deleted): see finishDelete.
func FinishDelete(ctx context.Context, tx store.Tx, id string) error {
	in, err := LoadByID(ctx, tx, id)
	if errors.Is(err, core.ErrNotFound) {
		return nil
	}
	if err != nil || in.State == string(states.Deleted) {
		return err
	}
	if in.DesiredState != string(states.DesiredDeleted) {
		return core.Errorf(core.CodeInvalidState, "instance %s is not being deleted", id)
	}
	return finishDelete(ctx, tx, in)
}

// finishDelete, in the caller's transaction (one with the row locked):
// state deleted, deleted_at, the allocation released exactly once (its
// scalars freed and its GPU bookings cut), the authorization row removed,
// instance.deleted published, and the node's spec generation moved so
// the instance leaves its NodeSpec.
func finishDelete(ctx context.Context, tx store.Tx, in Instance) error {
	if _, err := release(ctx, tx, in.ID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE instances SET deleted_at = now() WHERE id = $1`, in.ID); err != nil {
		return err
	}
	if err := setState(ctx, tx, in, states.Deleted, nil); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM authz_resources WHERE id = $1 AND tenant_id = $2`, in.ID, in.TenantID); err != nil {
		return err
	}
	if in.NodeID != "" {
		return nodes.BumpGeneration(ctx, tx, in.NodeID)
	}
	return nil
}

// RecordProvider records the provider server an instance's workflow made
// or found, and its address; the journaled create is accounted for.
func RecordProvider(ctx context.Context, tx store.Tx, id, serverID, address string) error {
	_, err := tx.Exec(ctx, `UPDATE instances SET provider_server_id = $2, create_sent_at = NULL,
			address = CASE WHEN $3 <> '' THEN $3 ELSE address END, updated_at = now() WHERE id = $1`, id, serverID, address)
	return err
}

// SetObserved records a provider's observed state of the instance (the
// droplet's status mapped to running or stopped) at the instance's
// current generation.
func SetObserved(ctx context.Context, tx store.Tx, id, observed string) error {
	_, err := tx.Exec(ctx, `UPDATE instances SET observed_state = $2, observed_generation = generation, observed_at = now()
		WHERE id = $1`, id, observed)
	return err
}

// WorkflowStarted records that the instance's workflow was started.
func WorkflowStarted(ctx context.Context, db store.DBTX, id string) error {
	_, err := db.Exec(ctx, `UPDATE instances SET workflow_started_at = now() WHERE id = $1 AND workflow_started_at IS NULL`, id)
	return err
}

// Owed is an instance whose workflow should be running.
type Owed struct {
	TenantID, ID, PoolID string
	Started              bool // its start was recorded
}

// OwedWorkflows are up to limit live instances (admitted, not deleted)
// with ids after afterID, in id order, changed longer than grace ago:
// those whose workflow start is not recorded, and (all) those whose start
// is, so the reconciler can start the first and check the others run.
func OwedWorkflows(ctx context.Context, tx store.Tx, grace time.Duration, afterID string, limit int) ([]Owed, error) {
	rows, err := tx.Query(ctx, `SELECT tenant_id, id, pool_id, workflow_started_at IS NOT NULL FROM instances
		WHERE state NOT IN ('draft', 'denied', 'deleted') AND id > $3
			AND (workflow_started_at IS NOT NULL OR updated_at < now() - $1 * interval '1 millisecond')
		ORDER BY id LIMIT $2`, grace.Milliseconds(), limit, afterID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Owed, error) {
		var o Owed
		return o, r.Scan(&o.TenantID, &o.ID, &o.PoolID, &o.Started)
	})
}

// SweepDrafts deletes up to 1000 drafts older than maxAge (an admission
// that crashed between its transactions and was never retried), with
// their idempotency and authorization rows; a draft holds nothing.
func SweepDrafts(ctx context.Context, tx store.Tx, maxAge time.Duration) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `WITH stale AS (
			SELECT i.id, i.tenant_id FROM instances i
			WHERE i.state = 'draft' AND i.created_at < now() - $1 * interval '1 millisecond'
			ORDER BY i.created_at LIMIT 1000 FOR UPDATE SKIP LOCKED),
		keys AS (DELETE FROM idempotency_keys k USING stale
			WHERE k.tenant_id = stale.tenant_id AND k.resource_id = stale.id AND k.completed_at IS NULL RETURNING 1),
		authz AS (DELETE FROM authz_resources z USING stale WHERE z.id = stale.id AND z.tenant_id = stale.tenant_id RETURNING 1),
		drafts AS (DELETE FROM instances i USING stale WHERE i.id = stale.id RETURNING 1)
		SELECT count(*) FROM drafts`, maxAge.Milliseconds()).Scan(&n)
	return n, err
}

// UserData reads the instance's user data: plain text, or its secret://
// reference (both "" when it has none).
func UserData(ctx context.Context, db store.DBTX, id string) (plain, ref string, err error) {
	err = db.QueryRow(ctx, `SELECT COALESCE(user_data, ''), COALESCE(user_data_ref, '') FROM instances WHERE id = $1`, id).Scan(&plain, &ref)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", notFound(id)
	}
	return plain, ref, err
}

// The provider create's journal on the instance row (create_sent_at),
// which drivers/providers.EnsureServer keeps so a create whose outcome is
// unknown is looked up before another is ever sent. Ages are measured on
// the database's clock, the one every worker shares.

// CreateSentAgo answers how long ago the instance's provider create was
// recorded as sent, and whether one is.
func CreateSentAgo(ctx context.Context, db store.DBTX, id string) (time.Duration, bool, error) {
	var ms *int64
	err := db.QueryRow(ctx, `SELECT (floor(extract(epoch FROM now() - create_sent_at) * 1000))::bigint FROM instances WHERE id = $1`,
		id).Scan(&ms)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, notFound(id)
	}
	if err != nil || ms == nil {
		return 0, false, err
	}
	return time.Duration(*ms) * time.Millisecond, true, nil
}

// RecordCreateSent records, before the call, that a provider create is
// about to be sent.
func RecordCreateSent(ctx context.Context, db store.DBTX, id string) error {
	_, err := db.Exec(ctx, `UPDATE instances SET create_sent_at = now() WHERE id = $1`, id)
	return err
}

// ForgetCreateSent clears the record of a create that certainly made
// nothing (refused, rate limited, never sent).
func ForgetCreateSent(ctx context.Context, db store.DBTX, id string) error {
	_, err := db.Exec(ctx, `UPDATE instances SET create_sent_at = NULL WHERE id = $1`, id)
	return err
}

// ErrNoUserData is the answer for an instance without user data.
var ErrNoUserData = errors.New("instances: no user data")

// InstanceEnv reads an instance's environment as stored: plain values and
// secret:// references (its node's fetch resolves them).
func InstanceEnv(ctx context.Context, db store.DBTX, id string) (map[string]string, error) {
	var raw []byte
	if err := db.QueryRow(ctx, `SELECT env FROM instances WHERE id = $1`, id).Scan(&raw); err != nil {
		return nil, err
	}
	var env map[string]string
	return env, json.Unmarshal(raw, &env)
}

// Package fleet stores fleet plans and applies (docs/fleet-as-code.md),
// reads the live state a fleet document is diffed against, and applies one
// change through the sites, pools, flavors and nodes domains' own writers,
// with the audit row the change's own method writes.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	doc "github.com/better-compute/better-compute/core/fleet"
	policy "github.com/better-compute/better-compute/core/pools"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/flavors"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/store/sites"
)

// Types are the authorization rows' full type names the writers need.
// Applies are the root tenant's only (the methods check it), so a site is
// created with its tenant as the root.
type Types struct {
	Site, Pool string
}

// Caller is who asked for an apply: each change's audit row names it, with
// the fleet.apply call's request id.
type Caller = store.Caller

// Plan is a stored plan.
type Plan struct {
	ID        string       `json:"planId"`
	Digest    string       `json:"digest"`
	Changes   []doc.Change `json:"changes"`
	CreatedAt int64        `json:"createdAt"`
}

// Apply is a stored apply with its changes' states.
type Apply struct {
	ID         string        `json:"applyId"`
	PlanID     string        `json:"planId"`
	State      string        `json:"state"`
	Error      string        `json:"error,omitempty"`
	CreatedAt  int64         `json:"createdAt"`
	FinishedAt *int64        `json:"finishedAt,omitempty"`
	Changes    []ChangeState `json:"changes"`
	Document   *doc.Document `json:"-"`
}

// ChangeState is one change of an apply and its state: pending, done or
// failed.
type ChangeState struct {
	Seq    int        `json:"seq"`
	State  string     `json:"state"`
	Error  string     `json:"error,omitempty"`
	Change doc.Change `json:"change"`
}

// ReadLive reads the tenant's live sites and pools as a document. Provider
// pools are not the document's (their accounts are secrets' business), so
// they are neither exported nor deleted.
func ReadLive(ctx context.Context, tx store.Tx, tenantID string) (doc.Live, error) {
	live := doc.Live{TenantID: tenantID, SiteIDs: map[string]string{}, PoolIDs: map[string]string{}, FlavorIDs: map[string]string{},
		NodeIDs: map[string]string{}, Busy: map[string]bool{}, Kept: map[string]bool{}}
	rows, err := tx.Query(ctx, `SELECT s.id, s.name, s.kind, s.region, s.iam_region, EXISTS (SELECT 1 FROM pools p
		  WHERE p.site_id = s.id AND p.archived_at IS NULL AND p.class = 'provider')
		FROM sites s WHERE s.tenant_id = $1 AND s.deleted_at IS NULL ORDER BY s.name`, tenantID)
	if err != nil {
		return live, err
	}
	siteNames := map[string]string{}
	for rows.Next() {
		var id string
		var s doc.Site
		var kept bool
		if err := rows.Scan(&id, &s.Name, &s.Kind, &s.Region, &s.IAMRegion, &kept); err != nil {
			rows.Close()
			return live, err
		}
		live.SiteIDs[s.Name], siteNames[id], live.Kept[s.Name] = id, s.Name, kept
		live.Document.Sites = append(live.Document.Sites, s)
	}
	if err := rows.Err(); err != nil {
		return live, err
	}
	rows, err = tx.Query(ctx, `SELECT p.id, p.site_id, p.name, p.class, p.gpu_model, p.gpu_memory_gb, p.sharing, p.agent,
		p.billing_mode, p.policy, EXISTS (SELECT 1 FROM reservations r WHERE r.pool_id = p.id
		  AND r.state IN ('pending', 'placed', 'binding', 'active', 'releasing'))
		FROM pools p WHERE p.tenant_id = $1 AND p.archived_at IS NULL AND p.class <> 'provider' ORDER BY p.name`, tenantID)
	if err != nil {
		return live, err
	}
	defer rows.Close()
	for rows.Next() {
		var id, siteID string
		var p doc.Pool
		var pol []byte
		var busy bool
		if err := rows.Scan(&id, &siteID, &p.Name, &p.Class, &p.GPUModel, &p.GPUMemoryGb, &p.Sharing, &p.Agent,
			&p.BillingMode, &pol, &busy); err != nil {
			return live, err
		}
		var v policy.Policy
		if err := json.Unmarshal(pol, &v); err != nil {
			return live, fmt.Errorf("pool %s policy: %w", id, err)
		}
		p.Site, p.Policy = siteNames[siteID], &v
		live.PoolIDs[p.Name], live.Busy[p.Name] = id, busy
		live.Document.Pools = append(live.Document.Pools, p)
	}
	if err := rows.Err(); err != nil {
		return live, err
	}
	if err := readPoolParts(ctx, tx, tenantID, &live); err != nil {
		return live, err
	}
	if err := readNodes(ctx, tx, tenantID, &live); err != nil {
		return live, err
	}
	doc.Normalize(&live.Document)
	return live, nil
}

// readPoolParts reads the live flavors and offers of the document's pools.
func readPoolParts(ctx context.Context, tx store.Tx, tenantID string, live *doc.Live) error {
	byID := map[string]*doc.Pool{}
	for i := range live.Document.Pools {
		byID[live.PoolIDs[live.Document.Pools[i].Name]] = &live.Document.Pools[i]
	}
	rows, err := tx.Query(ctx, `SELECT f.id, f.pool_id, f.name, f.vcpu, f.memory_mib, f.disk_gib, f.gpus, f.runtime
		FROM flavors f JOIN pools p ON p.id = f.pool_id
		WHERE p.tenant_id = $1 AND p.archived_at IS NULL AND f.deleted_at IS NULL ORDER BY f.name`, tenantID)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id, poolID string
		var f doc.Flavor
		var mib int64
		if err := rows.Scan(&id, &poolID, &f.Name, &f.VCPU, &mib, &f.DiskGiB, &f.GPUs, &f.Runtime); err != nil {
			rows.Close()
			return err
		}
		if p := byID[poolID]; p != nil {
			f.MemoryGiB = float64(mib) / 1024
			p.Flavors = append(p.Flavors, f)
			live.FlavorIDs[p.Name+"/"+f.Name] = id
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = tx.Query(ctx, `SELECT o.pool_id, o.tenant_id, o.quota, o.priority, o.include_descendants,
		o.suspended_at IS NOT NULL, o.excluded_regions
		FROM pool_offers o JOIN pools p ON p.id = o.pool_id WHERE p.tenant_id = $1 AND p.archived_at IS NULL`, tenantID)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var poolID string
		var o doc.Offer
		if err := rows.Scan(&poolID, &o.Tenant, &o.Quota, &o.Priority, &o.IncludeDescendants, &o.Suspended, &o.ExcludedRegions); err != nil {
			return err
		}
		if p := byID[poolID]; p != nil {
			p.Offers = append(p.Offers, o)
		}
	}
	return rows.Err()
}

// readNodes reads every live node's id by name, and the labels and taints
// of those that have some.
func readNodes(ctx context.Context, tx store.Tx, tenantID string, live *doc.Live) error {
	rows, err := tx.Query(ctx, `SELECT id, name, labels, taints FROM nodes WHERE tenant_id = $1 AND deleted_at IS NULL`, tenantID)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var n doc.Node
		if err := rows.Scan(&id, &n.Name, &n.Labels, &n.Taints); err != nil {
			return err
		}
		live.NodeIDs[n.Name] = id
		if len(n.Labels) > 0 || len(n.Taints) > 0 {
			live.Document.Nodes = append(live.Document.Nodes, n)
		}
	}
	return rows.Err()
}

// SavePlan stores a plan of the document against the state of digest.
func SavePlan(ctx context.Context, tx store.Tx, tenantID, createdBy, digest string, d doc.Document, changes []doc.Change) (Plan, error) {
	if changes == nil {
		changes = []doc.Change{}
	}
	p := Plan{ID: core.NewID("fplan"), Digest: digest, Changes: changes}
	err := tx.QueryRow(ctx, `INSERT INTO fleet_plans (id, tenant_id, digest, document, changes, created_by)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING `+store.MsOf("created_at"),
		p.ID, tenantID, digest, d, changes, createdBy).Scan(&p.CreatedAt)
	return p, err
}

// StartApply records an apply of the tenant's plan, one pending row per
// change, if the live state is still the plan's: a different digest is
// CONFLICT (stale). The live state is read in tx, so concurrent plans'
// applies are ordered by the locks the writers take.
func StartApply(ctx context.Context, tx store.Tx, tenantID string, caller Caller, planID, digest string) (Apply, error) {
	var stored string
	var changes []doc.Change
	err := tx.QueryRow(ctx, `SELECT digest, changes FROM fleet_plans WHERE tenant_id = $1 AND id = $2`, tenantID, planID).
		Scan(&stored, &changes)
	if errors.Is(err, pgx.ErrNoRows) {
		return Apply{}, core.Errorf(core.CodeNotFound, "fleet plan %s not found", planID)
	}
	if err != nil {
		return Apply{}, err
	}
	// One apply at a time per tenant: the advisory lock orders them.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('fleet:' || $1))`, tenantID); err != nil {
		return Apply{}, err
	}
	live, err := ReadLive(ctx, tx, tenantID)
	if err != nil {
		return Apply{}, err
	}
	if now := doc.Digest(live.Document); digest != stored || now != stored {
		return Apply{}, core.Errorf(core.CodeConflict, "the live fleet changed since plan %s: plan again", planID).
			WithDetails(map[string]any{"reason": "stale", "planDigest": stored, "liveDigest": now})
	}
	var running int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM fleet_applies WHERE tenant_id = $1 AND state = 'running'`, tenantID).
		Scan(&running); err != nil {
		return Apply{}, err
	}
	if running > 0 {
		return Apply{}, core.Errorf(core.CodeInvalidState, "a fleet apply is running").WithDetails(map[string]any{"reason": "running"})
	}
	id := core.NewID("fapl")
	if _, err := tx.Exec(ctx, `INSERT INTO fleet_applies (id, tenant_id, plan_id, state, created_by, caller)
		VALUES ($1, $2, $3, 'running', $4, $5)`, id, tenantID, planID, caller.IdentityID, caller); err != nil {
		return Apply{}, err
	}
	for i, c := range changes {
		if _, err := tx.Exec(ctx, `INSERT INTO fleet_apply_changes (apply_id, seq, change, state) VALUES ($1, $2, $3, 'pending')`,
			id, i, c); err != nil {
			return Apply{}, err
		}
	}
	return load(ctx, tx, id)
}

// Pending is the seqs of the apply's changes not done yet, in order; none
// once the apply finished.
func Pending(ctx context.Context, tx store.Tx, applyID string) ([]int, error) {
	rows, err := tx.Query(ctx, `SELECT c.seq FROM fleet_apply_changes c JOIN fleet_applies a ON a.id = c.apply_id
		WHERE c.apply_id = $1 AND c.state = 'pending' AND a.state = 'running' ORDER BY c.seq`, applyID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// ApplyChange applies the apply's change seq and marks it done in the same
// transaction; a change already done is kept, so a retried activity is
// idempotent. A refusal from the domain's writer (a core error) marks the
// change and the apply failed and is answered, not returned.
func ApplyChange(ctx context.Context, s *store.Store, t Types, applyID string, seq int) (failed string, err error) {
	err = s.InTx(ctx, pgx.TxOptions{}, func(tx store.Tx) error {
		var tenantID, state, applyState string
		var caller Caller
		var c doc.Change
		err := tx.QueryRow(ctx, `SELECT a.tenant_id, a.caller, c.state, a.state, c.change FROM fleet_apply_changes c
			JOIN fleet_applies a ON a.id = c.apply_id WHERE c.apply_id = $1 AND c.seq = $2 FOR UPDATE`, applyID, seq).
			Scan(&tenantID, &caller, &state, &applyState, &c)
		// Done, or the apply failed: nothing more runs.
		if err != nil || state != "pending" || applyState != "running" {
			return err
		}
		if err := apply(ctx, tx, t, tenantID, caller, c); err != nil {
			var ce *core.Error
			if !errors.As(err, &ce) {
				return err
			}
			failed = ce.Error()
			return nil
		}
		_, err = tx.Exec(ctx, `UPDATE fleet_apply_changes SET state = 'done', done_at = now() WHERE apply_id = $1 AND seq = $2`, applyID, seq)
		return err
	})
	if err != nil || failed == "" {
		return failed, err
	}
	return failed, s.InTx(ctx, pgx.TxOptions{}, func(tx store.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE fleet_apply_changes SET state = 'failed', error = $3 WHERE apply_id = $1 AND seq = $2`,
			applyID, seq, failed); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE fleet_applies SET state = 'failed', error = $2, finished_at = now()
			WHERE id = $1 AND state = 'running'`, applyID, fmt.Sprintf("change %d: %s", seq, failed))
		return err
	})
}

// Running is the ids of running applies, oldest first, at most limit: the
// reconciler (re)starts their workflows, so an apply whose start was lost
// after its commit still runs.
func Running(ctx context.Context, tx store.Tx, limit int) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT id FROM fleet_applies WHERE state = 'running' ORDER BY created_at, id LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// Finish marks a running apply succeeded once no change is pending.
func Finish(ctx context.Context, tx store.Tx, applyID string) error {
	_, err := tx.Exec(ctx, `UPDATE fleet_applies SET state = 'succeeded', finished_at = now() WHERE id = $1 AND state = 'running'
		AND NOT EXISTS (SELECT 1 FROM fleet_apply_changes WHERE apply_id = $1 AND state <> 'done')`, applyID)
	return err
}

// apply is one change through the writer the domain's own method uses, and
// that method's audit row.
func apply(ctx context.Context, tx store.Tx, t Types, tenantID string, caller Caller, c doc.Change) error {
	by := caller.IdentityID
	var method, resourceType, resourceID string
	switch {
	case c.Kind == doc.KindSite && c.Op == doc.OpCreate:
		_, err := sites.Create(ctx, tx, t.Site, tenantID, tenantID, by,
			sites.New{Name: c.Site.Name, Region: c.Site.Region, IAMRegion: c.Site.IAMRegion, Kind: c.Site.Kind})
		if err != nil {
			return err
		}
		method, resourceType, resourceID = "sites.create", "compute-tenant", tenantID
	case c.Kind == doc.KindSite && c.Op == doc.OpUpdate:
		st, err := sites.Update(ctx, tx, t.Site, tenantID, c.ID, sites.Change{Region: &c.Site.Region, IAMRegion: &c.Site.IAMRegion})
		if err != nil {
			return err
		}
		// As sites.update: the pools' rows carry the site's region.
		if err := pools.PutSiteAuthz(ctx, tx, t.Pool, st.ID); err != nil {
			return err
		}
		method, resourceType, resourceID = "sites.update", "compute-site", c.ID
	case c.Kind == doc.KindSite && c.Op == doc.OpDelete:
		if _, err := sites.Delete(ctx, tx, tenantID, c.ID); err != nil {
			return err
		}
		method, resourceType, resourceID = "sites.delete", "compute-site", c.ID
	case c.Kind == doc.KindPool && c.Op == doc.OpCreate:
		siteID, err := siteByName(ctx, tx, tenantID, c.Pool.Site)
		if err != nil {
			return err
		}
		p, err := policy.Validate(c.Pool.Policy, c.Pool.Sharing)
		if err != nil {
			return err
		}
		_, err = pools.Create(ctx, tx, t.Pool, tenantID, by, pools.New{SiteID: siteID, Name: c.Pool.Name, Class: c.Pool.Class,
			GPUModel: c.Pool.GPUModel, GPUMemoryGb: c.Pool.GPUMemoryGb, Sharing: c.Pool.Sharing, Agent: c.Pool.Agent, Policy: p,
			BillingMode: c.Pool.BillingMode})
		if err != nil {
			return err
		}
		method, resourceType, resourceID = "pools.create", "compute-tenant", tenantID
	case c.Kind == doc.KindPool && c.Op == doc.OpUpdate:
		p := c.Pool
		if _, err := pools.Update(ctx, tx, t.Pool, tenantID, c.ID, pools.Change{GPUMemoryGb: &p.GPUMemoryGb, Sharing: &p.Sharing,
			Agent: &p.Agent, Policy: p.Policy, BillingMode: &p.BillingMode}); err != nil {
			return err
		}
		method, resourceType, resourceID = "pools.update", "compute-pool", c.ID
	case c.Kind == doc.KindPool && c.Op == doc.OpDelete:
		if _, err := pools.Archive(ctx, tx, tenantID, c.ID); err != nil {
			return err
		}
		method, resourceType, resourceID = "pools.archive", "compute-pool", c.ID
	case c.Kind == doc.KindFlavor || c.Kind == doc.KindOffer:
		poolID, err := poolByName(ctx, tx, tenantID, c.PoolName)
		if err != nil {
			return err
		}
		if method, err = applyPoolPart(ctx, tx, t, tenantID, poolID, by, c); err != nil {
			return err
		}
		resourceType, resourceID = "compute-pool", poolID
	case c.Kind == doc.KindNode && c.Op == doc.OpUpdate:
		methods, err := applyNode(ctx, tx, tenantID, by, c)
		if err != nil {
			return err
		}
		for _, m := range methods {
			if err := audit(ctx, tx, tenantID, caller, m, "compute-node", c.ID); err != nil {
				return err
			}
		}
		return nil
	default:
		return fmt.Errorf("fleet change %s %s: unknown", c.Op, c.Kind)
	}
	return audit(ctx, tx, tenantID, caller, method, resourceType, resourceID)
}

// applyPoolPart applies a flavor's or an offer's change to its pool and
// answers the method whose writer it used.
func applyPoolPart(ctx context.Context, tx store.Tx, t Types, tenantID, poolID, by string, c doc.Change) (string, error) {
	switch {
	case c.Kind == doc.KindFlavor && c.Op == doc.OpCreate:
		f := c.Flavor
		mib, err := flavors.MemoryMiBOf(f.MemoryGiB)
		if err != nil {
			return "", err
		}
		_, err = flavors.Create(ctx, tx, tenantID, flavors.New{PoolID: poolID, Name: f.Name, Runtime: f.Runtime,
			Shape: flavors.Shape{VCPU: f.VCPU, MemoryMiB: mib, DiskGiB: f.DiskGiB, GPUs: f.GPUs}})
		return "flavors.create", err
	case c.Kind == doc.KindFlavor && c.Op == doc.OpUpdate:
		f := c.Flavor
		mib, err := flavors.MemoryMiBOf(f.MemoryGiB)
		if err != nil {
			return "", err
		}
		_, err = flavors.Update(ctx, tx, tenantID, poolID, c.ID, flavors.Change{VCPU: &f.VCPU, MemoryMiB: &mib, DiskGiB: &f.DiskGiB, GPUs: &f.GPUs})
		return "flavors.update", err
	case c.Kind == doc.KindFlavor && c.Op == doc.OpDelete:
		_, err := flavors.Delete(ctx, tx, tenantID, poolID, c.ID)
		return "flavors.delete", err
	case c.Kind == doc.KindOffer && (c.Op == doc.OpCreate || c.Op == doc.OpUpdate):
		o := c.Offer
		_, err := pools.PutOffer(ctx, tx, t.Pool, tenantID, poolID, o.Tenant, by, pools.OfferTerms{Quota: o.Quota, Priority: o.Priority,
			IncludeDescendants: o.IncludeDescendants, Suspended: o.Suspended, ExcludedRegions: o.ExcludedRegions})
		return "pools.offer", err
	case c.Kind == doc.KindOffer && c.Op == doc.OpDelete:
		_, err := pools.Unoffer(ctx, tx, t.Pool, tenantID, poolID, c.Offer.Tenant)
		return "pools.unoffer", err
	}
	return "", fmt.Errorf("fleet change %s %s: unknown", c.Op, c.Kind)
}

// applyNode brings a node's labels and taints to the declared ones, from
// what they are now (so a retry or a change made since the plan converges),
// and answers the methods whose writers it used.
func applyNode(ctx context.Context, tx store.Tx, tenantID, by string, c doc.Change) ([]string, error) {
	n, err := nodes.Get(ctx, tx, tenantID, c.ID, true)
	if err != nil {
		return nil, err
	}
	var used []string
	set := map[string]string{}
	for k, v := range c.Node.Labels {
		if cur, ok := n.Labels[k]; !ok || cur != v {
			set[k] = v
		}
	}
	var remove []string
	for k := range n.Labels {
		if _, keep := c.Node.Labels[k]; !keep {
			remove = append(remove, k)
		}
	}
	if len(set) > 0 || len(remove) > 0 {
		if _, err := nodes.Label(ctx, tx, tenantID, n.ID, set, remove, by); err != nil {
			return nil, err
		}
		used = append(used, "nodes.label")
	}
	var add []nodes.Taint
	for _, t := range c.Node.Taints {
		add = append(add, nodes.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
	}
	var drop []nodes.TaintRef
	for _, t := range n.Taints {
		drop = append(drop, nodes.TaintRef{Key: t.Key, Effect: t.Effect})
	}
	if !slices.Equal(add, n.Taints) && (len(add) > 0 || len(drop) > 0) {
		if _, err := nodes.SetTaints(ctx, tx, tenantID, n.ID, add, drop, by); err != nil {
			return nil, err
		}
		used = append(used, "nodes.taint")
	}
	return used, nil
}

// audit writes the audit row the change's own method writes, under the
// apply's caller and request.
func audit(ctx context.Context, tx store.Tx, tenantID string, k Caller, method, resourceType, resourceID string) error {
	return store.WriteAudit(ctx, tx, store.Audit{TenantID: tenantID, Method: method, ResourceType: resourceType,
		ResourceID: resourceID, Caller: k})
}

func poolByName(ctx context.Context, tx store.Tx, tenantID, name string) (string, error) {
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM pools WHERE tenant_id = $1 AND name = $2 AND archived_at IS NULL`, tenantID, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", core.Errorf(core.CodeNotFound, "pool %s not found", name)
	}
	return id, err
}

func siteByName(ctx context.Context, tx store.Tx, tenantID, name string) (string, error) {
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM sites WHERE tenant_id = $1 AND name = $2 AND deleted_at IS NULL`, tenantID, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", core.Errorf(core.CodeNotFound, "site %s not found", name)
	}
	return id, err
}

// Applies reads the tenant's last applies, newest first, with their changes.
func Applies(ctx context.Context, tx store.Tx, tenantID string, limit int) ([]Apply, error) {
	rows, err := tx.Query(ctx, `SELECT id FROM fleet_applies WHERE tenant_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2`,
		tenantID, limit)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := make([]Apply, 0, len(ids))
	for _, id := range ids {
		a, err := load(ctx, tx, id)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// LastApplied is the document of the tenant's last succeeded apply; nil
// when none.
func LastApplied(ctx context.Context, tx store.Tx, tenantID string) (*doc.Document, error) {
	var d doc.Document
	err := tx.QueryRow(ctx, `SELECT p.document FROM fleet_applies a JOIN fleet_plans p ON p.id = a.plan_id
		WHERE a.tenant_id = $1 AND a.state = 'succeeded' ORDER BY a.created_at DESC, a.id DESC LIMIT 1`, tenantID).Scan(&d)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	return &d, err
}

// Load reads one apply.
func Load(ctx context.Context, tx store.Tx, id string) (Apply, error) { return load(ctx, tx, id) }

func load(ctx context.Context, tx store.Tx, id string) (Apply, error) {
	a := Apply{Changes: []ChangeState{}}
	err := tx.QueryRow(ctx, `SELECT id, plan_id, state, error, `+store.MsOf("created_at")+`,
		CASE WHEN finished_at IS NULL THEN NULL ELSE `+store.MsOf("finished_at")+` END FROM fleet_applies WHERE id = $1`, id).
		Scan(&a.ID, &a.PlanID, &a.State, &a.Error, &a.CreatedAt, &a.FinishedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Apply{}, core.Errorf(core.CodeNotFound, "fleet apply %s not found", id)
	}
	if err != nil {
		return Apply{}, err
	}
	rows, err := tx.Query(ctx, `SELECT seq, state, error, change FROM fleet_apply_changes WHERE apply_id = $1 ORDER BY seq`, id)
	if err != nil {
		return Apply{}, err
	}
	defer rows.Close()
	for rows.Next() {
		var c ChangeState
		if err := rows.Scan(&c.Seq, &c.State, &c.Error, &c.Change); err != nil {
			return Apply{}, err
		}
		a.Changes = append(a.Changes, c)
	}
	return a, rows.Err()
}

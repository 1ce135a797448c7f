// Package fleet stores fleet plans and applies (docs/fleet-as-code.md),
// reads the live state a fleet document is diffed against, and applies one
// change through the sites and pools domains' own writers.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	doc "github.com/better-compute/better-compute/core/fleet"
	policy "github.com/better-compute/better-compute/core/pools"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/store/sites"
)

// Types are the authorization rows' full type names the writers need.
// Applies are the root tenant's only (the methods check it), so a site is
// created with its tenant as the root.
type Types struct {
	Site, Pool string
}

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
	live := doc.Live{SiteIDs: map[string]string{}, PoolIDs: map[string]string{}, Busy: map[string]bool{}, Kept: map[string]bool{}}
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
	doc.Normalize(&live.Document)
	return live, nil
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
func StartApply(ctx context.Context, tx store.Tx, tenantID, createdBy, planID, digest string) (Apply, error) {
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
	if _, err := tx.Exec(ctx, `INSERT INTO fleet_applies (id, tenant_id, plan_id, state, created_by) VALUES ($1, $2, $3, 'running', $4)`,
		id, tenantID, planID, createdBy); err != nil {
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
		var tenantID, createdBy, state, applyState string
		var c doc.Change
		err := tx.QueryRow(ctx, `SELECT a.tenant_id, a.created_by, c.state, a.state, c.change FROM fleet_apply_changes c
			JOIN fleet_applies a ON a.id = c.apply_id WHERE c.apply_id = $1 AND c.seq = $2 FOR UPDATE`, applyID, seq).
			Scan(&tenantID, &createdBy, &state, &applyState, &c)
		// Done, or the apply failed: nothing more runs.
		if err != nil || state != "pending" || applyState != "running" {
			return err
		}
		if err := apply(ctx, tx, t, tenantID, createdBy, c); err != nil {
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

// Finish marks a running apply succeeded once no change is pending.
func Finish(ctx context.Context, tx store.Tx, applyID string) error {
	_, err := tx.Exec(ctx, `UPDATE fleet_applies SET state = 'succeeded', finished_at = now() WHERE id = $1 AND state = 'running'
		AND NOT EXISTS (SELECT 1 FROM fleet_apply_changes WHERE apply_id = $1 AND state <> 'done')`, applyID)
	return err
}

// apply is one change through the writer the domain's own method uses.
func apply(ctx context.Context, tx store.Tx, t Types, tenantID, createdBy string, c doc.Change) error {
	switch {
	case c.Kind == doc.KindSite && c.Op == doc.OpCreate:
		_, err := sites.Create(ctx, tx, t.Site, tenantID, tenantID, createdBy,
			sites.New{Name: c.Site.Name, Region: c.Site.Region, IAMRegion: c.Site.IAMRegion, Kind: c.Site.Kind})
		return err
	case c.Kind == doc.KindSite && c.Op == doc.OpUpdate:
		st, err := sites.Update(ctx, tx, t.Site, tenantID, c.ID, sites.Change{Region: &c.Site.Region, IAMRegion: &c.Site.IAMRegion})
		if err != nil {
			return err
		}
		// As sites.update: the pools' rows carry the site's region.
		return pools.PutSiteAuthz(ctx, tx, t.Pool, st.ID)
	case c.Kind == doc.KindSite && c.Op == doc.OpDelete:
		_, err := sites.Delete(ctx, tx, tenantID, c.ID)
		return err
	case c.Kind == doc.KindPool && c.Op == doc.OpCreate:
		siteID, err := siteByName(ctx, tx, tenantID, c.Pool.Site)
		if err != nil {
			return err
		}
		p, err := policy.Validate(c.Pool.Policy, c.Pool.Sharing)
		if err != nil {
			return err
		}
		_, err = pools.Create(ctx, tx, t.Pool, tenantID, createdBy, pools.New{SiteID: siteID, Name: c.Pool.Name, Class: c.Pool.Class,
			GPUModel: c.Pool.GPUModel, GPUMemoryGb: c.Pool.GPUMemoryGb, Sharing: c.Pool.Sharing, Agent: c.Pool.Agent, Policy: p,
			BillingMode: c.Pool.BillingMode})
		return err
	case c.Kind == doc.KindPool && c.Op == doc.OpUpdate:
		p := c.Pool
		_, err := pools.Update(ctx, tx, t.Pool, tenantID, c.ID, pools.Change{GPUMemoryGb: &p.GPUMemoryGb, Sharing: &p.Sharing,
			Agent: &p.Agent, Policy: p.Policy, BillingMode: &p.BillingMode})
		return err
	case c.Kind == doc.KindPool && c.Op == doc.OpDelete:
		_, err := pools.Archive(ctx, tx, tenantID, c.ID)
		return err
	}
	return fmt.Errorf("fleet change %s %s: unknown", c.Op, c.Kind)
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

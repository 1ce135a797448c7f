package sandboxes

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	instancestates "github.com/better-compute/better-compute/core/instances"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/instances"
)

// Warm pools: a template with warmPoolSize N keeps N workloads started
// ahead of any create (instances rows with warm_template_id set, each
// under an id of its own, owned by the template's owner and counted
// against its tenant's quota). A create claims one that its node reports
// running (Complete), so its start is a claim, not a boot. The pool's
// workflow tops it up after each claim and replaces what a template
// update made stale.

// workloadRuntime is the instance runtime a template's runtime runs on.
func workloadRuntime(templateRuntime string) string {
	if templateRuntime == string(coresandboxes.RuntimeGVisor) {
		return "gvisor"
	}
	return ""
}

// TopUp is one step of a template's warm pool, in one transaction: stale
// warm workloads (another template version, failed) are deleted, and
// missing ones placed (PlaceWorkload: a full pool or the quota stops the
// top-up, recorded in Warm.Refused). It answers the workloads it placed
// (whose workflows the caller starts) and those it deleted (to signal);
// Ended when the pool's size is 0 (or the template is deleted), its warm
// workloads being deleted.
func TopUp(ctx context.Context, tx store.Tx, templateID string) (Warm, error) {
	var tenantID string
	err := tx.QueryRow(ctx, `SELECT tenant_id FROM sandbox_templates WHERE id = $1 FOR UPDATE`, templateID).Scan(&tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Warm{Ended: true}, nil
	}
	if err != nil {
		return Warm{}, err
	}
	var deleted bool
	if err := tx.QueryRow(ctx, `SELECT deleted_at IS NOT NULL FROM sandbox_templates WHERE id = $1`, templateID).Scan(&deleted); err != nil {
		return Warm{}, err
	}
	var t Template
	size := 0
	if !deleted {
		if t, err = GetTemplate(ctx, tx, tenantID, templateID); err != nil {
			return Warm{}, err
		}
		size = t.WarmPoolSize
	}
	have, err := instances.WarmWorkloads(ctx, tx, templateID)
	if err != nil {
		return Warm{}, err
	}
	var out Warm
	kept := 0
	for _, w := range have {
		stale := w.Version != t.Version || w.State == string(instancestates.Failed) || kept >= size
		if w.State == string(instancestates.Deleting) {
			continue
		}
		if !stale {
			kept++
			continue
		}
		if _, _, err := instances.Change(ctx, tx, tenantID, w.ID, instancestates.MethodDelete); err != nil {
			return Warm{}, err
		}
		out.Deleted = append(out.Deleted, w.ID)
	}
	// A pool of size 0 has nothing to keep: what was deleted finishes
	// under its own workflows, and an update that sizes it starts it again.
	out.Ended = size == 0
	host, mounts, err := workloadMounts(ctx, tx, t) // a deleted template's zero value mounts nothing
	if err != nil {
		return Warm{}, err
	}
	for ; kept < size; kept++ {
		id := core.NewID("inst")
		sp, err := tx.Begin(ctx) // a refusal keeps what was placed before it
		if err != nil {
			return Warm{}, err
		}
		_, err = instances.PlaceWorkload(ctx, sp, tenantID, instances.Workload{ID: id, OwnerID: t.OwnerIdentityID,
			PoolID: t.PoolID, FlavorID: t.FlavorID, ImageID: t.ImageID, Name: "warm-" + strings.TrimPrefix(id, "inst_"),
			Runtime: workloadRuntime(t.Runtime), Command: t.Command, WarmTemplateID: t.ID, WarmVersion: t.Version,
			NodeID: host, Mounts: mounts, Env: t.Env})
		if err != nil {
			if rerr := sp.Rollback(ctx); rerr != nil {
				return Warm{}, rerr
			}
			ce := core.AsError(err)
			if ce.Code == core.CodeQuotaExceeded || ce.Code == core.CodeInvalidState || ce.Code == core.CodeUnavailable {
				out.Refused = ce.Message
				break
			}
			return Warm{}, err
		}
		if err := sp.Commit(ctx); err != nil {
			return Warm{}, err
		}
		out.Placed = append(out.Placed, id)
	}
	out.TenantID, out.PoolID = tenantID, t.PoolID
	return out, nil
}

// Warm is what a warm pool's step did.
type Warm struct {
	TenantID, PoolID string
	Placed, Deleted  []string
	// Refused says why the pool could not be filled (no capacity, the
	// quota); the next step tries again.
	Refused string
	Ended   bool
}

// WarmTemplates lists the templates (after afterID, up to limit) whose
// pools need a workflow: a warm pool size, or warm workloads left.
func WarmTemplates(ctx context.Context, tx store.Tx, afterID string, limit int) ([]WarmPool, error) {
	rows, err := tx.Query(ctx, `SELECT t.tenant_id, t.id, t.pool_id FROM sandbox_templates t
		WHERE t.id > $1 AND ((t.deleted_at IS NULL AND t.warm_pool_size > 0)
			OR EXISTS (SELECT 1 FROM instances i WHERE i.warm_template_id = t.id AND i.sandbox_id IS NULL AND i.state <> 'deleted'))
		ORDER BY t.id LIMIT $2`, afterID, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (WarmPool, error) {
		var w WarmPool
		return w, r.Scan(&w.TenantID, &w.TemplateID, &w.PoolID)
	})
}

// WarmPool names a template whose warm pool's workflow should run.
type WarmPool struct{ TenantID, TemplateID, PoolID string }

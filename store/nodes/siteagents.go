package nodes

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
)

// Site agents: a `bcd site` instance (its holder) registered for a site is
// itself a nodes row with role site, as the domain model has it. It serves
// the whole site, so it has no pool (pool_id NULL, site_id its site), its
// tenant is the site's owner and its name is the holder; it is connected
// while it holds the site's boot lease (its liveness lease is the boot
// lease's expiry, so the liveness sweep marks a silent one unreachable).
// It is never a GPU host: core/nodes.Schedulable refuses role site, it has
// no devices and no pool, so capacity, placement and pools' node lists
// never count it. Its site_agents row keeps the registration's bookkeeping:
// the site token it used and the boot lease epoch it took.

// notSiteNode refuses what only a machine of a pool can be (drained, sent
// node commands): a site agent's node is neither, as no node session
// serves it.
func notSiteNode(n Node, verb string) error {
	if n.Role != string(nodestate.RoleSite) {
		return nil
	}
	return core.Errorf(core.CodeInvalidState, "node %s is a site agent: it cannot be %s", n.ID, verb).
		WithDetails(map[string]any{"reason": "siteNode"})
}

// SiteAgent is one registration or renewal of a site agent.
type SiteAgent struct {
	SiteID, Holder string
	// TokenID is the site token it presented; LeaseEpoch and
	// LeaseExpiresAt the boot lease it holds.
	TokenID        string
	LeaseEpoch     int64
	LeaseExpiresAt time.Time
}

// RegisterSiteAgent records a site agent's registration: its node (made
// at its first registration) connected until the lease expires, and its
// site_agents row with the token and the lease epoch.
func RegisterSiteAgent(ctx context.Context, tx store.Tx, t Types, a SiteAgent) (Node, error) {
	n, err := siteNode(ctx, tx, t, a)
	if err != nil {
		return Node{}, err
	}
	_, err = tx.Exec(ctx, `INSERT INTO site_agents (site_id, holder, tenant_id, site_token_id, lease_epoch, node_id)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (site_id, holder) DO UPDATE SET site_token_id = EXCLUDED.site_token_id,
			lease_epoch = EXCLUDED.lease_epoch, node_id = EXCLUDED.node_id, last_seen_at = now()`,
		a.SiteID, a.Holder, n.TenantID, a.TokenID, a.LeaseEpoch, n.ID)
	return n, err
}

// RenewSiteAgent records a renewal of the site agent's boot lease: last
// seen now, its node connected until the lease's new expiry. An agent
// registered before site agents had nodes gets its node here.
func RenewSiteAgent(ctx context.Context, tx store.Tx, t Types, a SiteAgent) error {
	n, err := siteNode(ctx, tx, t, a)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE site_agents SET last_seen_at = now(), node_id = $3 WHERE site_id = $1 AND holder = $2`,
		a.SiteID, a.Holder, n.ID)
	return err
}

// siteNode makes or refreshes the site agent's node: connected, its
// liveness lease the boot lease's expiry, with its projection row.
func siteNode(ctx context.Context, tx store.Tx, t Types, a SiteAgent) (Node, error) {
	var tenantID string
	err := tx.QueryRow(ctx, `SELECT tenant_id FROM sites WHERE id = $1 AND deleted_at IS NULL`, a.SiteID).Scan(&tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Node{}, core.Errorf(core.CodeNotFound, "site %s not found", a.SiteID)
	}
	if err != nil {
		return Node{}, err
	}
	var id, prev string
	var conds []byte
	err = tx.QueryRow(ctx, `SELECT id, connectivity, conditions FROM nodes
		WHERE site_id = $1 AND name = $2 AND role = 'site' AND deleted_at IS NULL FOR UPDATE`, a.SiteID, a.Holder).Scan(&id, &prev, &conds)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		id, prev = core.NewID("node"), ""
		if _, err := tx.Exec(ctx, `INSERT INTO nodes (id, tenant_id, pool_id, site_id, name, provision_state, role, trust,
				adapter, power, connectivity)
			VALUES ($1, $2, NULL, $3, $4, $5, $6, $7, $8, $9, $10)`,
			id, tenantID, a.SiteID, a.Holder, string(nodestate.Adopted), string(nodestate.RoleSite),
			string(nodestate.TrustPlatform), string(nodestate.AdapterBCD), string(nodestate.PowerOn),
			string(nodestate.Connected)); err != nil {
			return Node{}, err
		}
		if err := putSiteLiveness(ctx, tx, id, a.LeaseExpiresAt); err != nil {
			return Node{}, err
		}
		if err := AddEvent(ctx, tx, id, EventCreated, "site agent "+a.Holder+" registered for site "+a.SiteID,
			map[string]any{"siteId": a.SiteID}); err != nil {
			return Node{}, err
		}
	case err != nil:
		return Node{}, err
	default:
		if _, err := tx.Exec(ctx, `UPDATE nodes SET connectivity = $2,
				updated_at = CASE WHEN connectivity <> $2 THEN now() ELSE updated_at END
			WHERE id = $1 AND connectivity <> $2`, id, string(nodestate.Connected)); err != nil {
			return Node{}, err
		}
		if err := putSiteLiveness(ctx, tx, id, a.LeaseExpiresAt); err != nil {
			return Node{}, err
		}
		if prev != string(nodestate.Connected) {
			if err := connectivityChanged(ctx, tx, id, prev, string(nodestate.Connected), 0); err != nil {
				return Node{}, err
			}
			if err := setLivenessConditions(ctx, tx, id, conds, 0); err != nil { // heard from: NodeUnreachable goes
				return Node{}, err
			}
		}
	}
	n, err := Get(ctx, tx, tenantID, id, false)
	if err != nil {
		return Node{}, err
	}
	if prev != "" {
		return n, nil // its projection row is written once: nothing it holds changes
	}
	return n, PutAuthz(ctx, tx, t, n)
}

// putSiteLiveness sets a site agent's liveness lease to its boot lease's
// expiry. A site agent has no session, so its epoch stays 0.
func putSiteLiveness(ctx context.Context, tx store.Tx, nodeID string, expiresAt time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO node_liveness (node_id, expires_at, last_heartbeat_at) VALUES ($1, $2, now())
		ON CONFLICT (node_id) DO UPDATE SET expires_at = EXCLUDED.expires_at, last_heartbeat_at = EXCLUDED.last_heartbeat_at`,
		nodeID, expiresAt)
	return err
}

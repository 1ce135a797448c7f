package agentgateway

import (
	"context"
	"errors"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
	sitedomain "github.com/better-compute/better-compute/store/sites"
)

// The site agent's endpoints: `bcd site` posts its site token and an
// instance id (the holder) to POST /agent/v1/site/register, which takes the
// site's boot lease (store.SiteBootLease, "site:<siteId>:boot") for the
// holder and tells the agent its task queue and how to reach Temporal; the
// agent then renews the lease with POST /agent/v1/site/renew and serves
// the queue only while it holds the lease. Both live on the API listener,
// outside the method table; the site token is their only credential, and
// it is never logged or stored (only its SHA-256 is looked up).

// siteHolderMaxLength bounds a holder (an instance id).
const siteHolderMaxLength = 200

// checkSiteAgent validates the credential and holder before any query.
func (g *Gateway) checkSiteAgent(token, holder string) error {
	if g.deps.Store == nil {
		return core.Errorf(core.CodeUnavailable, "no database configured")
	}
	if token == "" {
		return core.Errorf(core.CodeUnauthn, "a site token is required")
	}
	if holder == "" || len(holder) > siteHolderMaxLength {
		return badField("holder", "invalid", "holder must be 1 to %d characters", siteHolderMaxLength)
	}
	for _, r := range holder {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return badField("holder", "invalid", "holder must be printable, without spaces")
		}
	}
	return nil
}

// siteAgent is who a site token authenticates.
type siteAgent struct {
	tokenID, siteID, tenantID string
}

// authenticateSiteToken looks a site token up by its hash: an unknown one,
// a revoked one and one of a deleted site are all UNAUTHENTICATED, told
// apart by nothing.
func authenticateSiteToken(ctx context.Context, tx store.Tx, token string) (siteAgent, error) {
	var a siteAgent
	err := tx.QueryRow(ctx, `SELECT t.id, t.site_id, t.tenant_id FROM site_tokens t JOIN sites s ON s.id = t.site_id
		WHERE t.token_hash = $1 AND t.revoked_at IS NULL AND s.deleted_at IS NULL`, sitedomain.HashToken(token)).
		Scan(&a.tokenID, &a.siteID, &a.tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return siteAgent{}, core.Errorf(core.CodeUnauthn, "unknown or revoked site token")
	}
	return a, err
}

func (g *Gateway) siteResult(siteID string, l store.Lease, ttl time.Duration) protocol.SiteResult {
	return protocol.SiteResult{
		SiteID: siteID, TaskQueue: protocol.SiteTaskQueue(siteID),
		Temporal: protocol.SiteTemporal{Address: g.deps.TemporalAddress, Namespace: g.deps.TemporalNamespace},
		Lease:    protocol.SiteLease{Name: l.Name, Epoch: l.Epoch, ExpiresAt: l.ExpiresAt.UnixMilli(), TTLMs: ttl.Milliseconds()},
	}
}

// SiteRegister serves a site agent's registration: it authenticates the
// site token, takes the site's boot lease for the holder and records the
// agent (store/nodes.RegisterSiteAgent: its nodes row, role site, and its
// registration).
// A lease another live holder has is CONFLICT: the agent retries later.
func (g *Gateway) SiteRegister(ctx context.Context, in protocol.SiteRegisterRequest) (protocol.SiteResult, error) {
	if err := g.checkSiteAgent(in.Token, in.Holder); err != nil {
		return protocol.SiteResult{}, err
	}
	if g.deps.TemporalAddress == "" || g.deps.TemporalNamespace == "" {
		return protocol.SiteResult{}, core.Errorf(core.CodeUnavailable, "no Temporal address configured for site agents")
	}
	ttl := g.deps.SiteLease
	var out protocol.SiteResult
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		a, err := authenticateSiteToken(ctx, tx, in.Token)
		if err != nil {
			return err
		}
		l, err := store.AcquireLease(ctx, tx, store.SiteBootLease(a.siteID), in.Holder, ttl)
		if err != nil {
			return err
		}
		if _, err := domain.RegisterSiteAgent(ctx, tx, g.types, domain.SiteAgent{SiteID: a.siteID, Holder: in.Holder,
			TokenID: a.tokenID, LeaseEpoch: l.Epoch, LeaseExpiresAt: l.ExpiresAt}); err != nil {
			return err
		}
		out = g.siteResult(a.siteID, l, ttl)
		return nil
	})
	return out, err
}

// SiteRenew renews a site agent's boot lease at its epoch; a lease the
// holder lost (expired, or taken by another) is CONFLICT "lease lost".
func (g *Gateway) SiteRenew(ctx context.Context, in protocol.SiteRenewRequest) (protocol.SiteResult, error) {
	if err := g.checkSiteAgent(in.Token, in.Holder); err != nil {
		return protocol.SiteResult{}, err
	}
	if in.Epoch < 1 {
		return protocol.SiteResult{}, badField("epoch", "invalid", "epoch must be the one register answered")
	}
	ttl := g.deps.SiteLease
	var out protocol.SiteResult
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		a, err := authenticateSiteToken(ctx, tx, in.Token)
		if err != nil {
			return err
		}
		l, err := store.RenewLease(ctx, tx, store.SiteBootLease(a.siteID), in.Holder, in.Epoch, ttl)
		if err != nil {
			return err
		}
		if err := domain.RenewSiteAgent(ctx, tx, g.types, domain.SiteAgent{SiteID: a.siteID, Holder: in.Holder,
			TokenID: a.tokenID, LeaseEpoch: l.Epoch, LeaseExpiresAt: l.ExpiresAt}); err != nil {
			return err
		}
		out = g.siteResult(a.siteID, l, ttl)
		return nil
	})
	return out, err
}

package api

import (
	"context"
	"errors"
	"net/http"
	"time"
	"unicode"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
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

// DefaultSiteLease is the site boot lease's ttl unless Deps.SiteLease
// says otherwise; the agent renews every third of it.
const DefaultSiteLease = 30 * time.Second

// siteHolderMaxLength bounds a holder (an instance id).
const siteHolderMaxLength = 200

func (s *Server) siteLease() time.Duration {
	if s.deps.SiteLease > 0 {
		return s.deps.SiteLease
	}
	return DefaultSiteLease
}

// agentJSON serves an agent endpoint: the bounded JSON body (unknown
// fields refused) into In, fn's answer as JSON, errors in the API's shape.
func agentJSON[In, Out any](fn func(context.Context, In) (Out, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		var in In
		if err := readAgentJSON(c, &in); err != nil {
			writeError(c, err)
			return
		}
		out, err := fn(c.Request.Context(), in)
		if err != nil {
			writeError(c, err)
			return
		}
		c.JSON(http.StatusOK, out)
	}
}

// checkSiteAgent validates the credential and holder before any query.
func (s *Server) checkSiteAgent(token, holder string) error {
	if s.store == nil {
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

func (s *Server) siteResult(siteID string, l store.Lease, ttl time.Duration) protocol.SiteResult {
	return protocol.SiteResult{
		SiteID: siteID, TaskQueue: protocol.SiteTaskQueue(siteID),
		Temporal: protocol.SiteTemporal{Address: s.deps.TemporalAddress, Namespace: s.deps.TemporalNamespace},
		Lease:    protocol.SiteLease{Name: l.Name, Epoch: l.Epoch, ExpiresAt: l.ExpiresAt.UnixMilli(), TTLMs: ttl.Milliseconds()},
	}
}

// SiteRegister serves a site agent's registration: it authenticates the
// site token, records the agent (site_agents: a site agent is no nodes row,
// which belongs to a pool) and takes the site's boot lease for the holder.
// A lease another live holder has is CONFLICT: the agent retries later.
func (s *Server) SiteRegister(ctx context.Context, in protocol.SiteRegisterRequest) (protocol.SiteResult, error) {
	if err := s.checkSiteAgent(in.Token, in.Holder); err != nil {
		return protocol.SiteResult{}, err
	}
	if s.deps.TemporalAddress == "" || s.deps.TemporalNamespace == "" {
		return protocol.SiteResult{}, core.Errorf(core.CodeUnavailable, "no Temporal address configured for site agents")
	}
	ttl := s.siteLease()
	var out protocol.SiteResult
	err := s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		a, err := authenticateSiteToken(ctx, tx, in.Token)
		if err != nil {
			return err
		}
		l, err := store.AcquireLease(ctx, tx, store.SiteBootLease(a.siteID), in.Holder, ttl)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO site_agents (site_id, holder, tenant_id, site_token_id, lease_epoch)
			VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (site_id, holder) DO UPDATE SET site_token_id = EXCLUDED.site_token_id,
				lease_epoch = EXCLUDED.lease_epoch, last_seen_at = now()`,
			a.siteID, in.Holder, a.tenantID, a.tokenID, l.Epoch); err != nil {
			return err
		}
		out = s.siteResult(a.siteID, l, ttl)
		return nil
	})
	return out, err
}

// SiteRenew renews a site agent's boot lease at its epoch; a lease the
// holder lost (expired, or taken by another) is CONFLICT "lease lost".
func (s *Server) SiteRenew(ctx context.Context, in protocol.SiteRenewRequest) (protocol.SiteResult, error) {
	if err := s.checkSiteAgent(in.Token, in.Holder); err != nil {
		return protocol.SiteResult{}, err
	}
	if in.Epoch < 1 {
		return protocol.SiteResult{}, badField("epoch", "invalid", "epoch must be the one register answered")
	}
	ttl := s.siteLease()
	var out protocol.SiteResult
	err := s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		a, err := authenticateSiteToken(ctx, tx, in.Token)
		if err != nil {
			return err
		}
		l, err := store.RenewLease(ctx, tx, store.SiteBootLease(a.siteID), in.Holder, in.Epoch, ttl)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE site_agents SET last_seen_at = now() WHERE site_id = $1 AND holder = $2`,
			a.siteID, in.Holder); err != nil {
			return err
		}
		out = s.siteResult(a.siteID, l, ttl)
		return nil
	})
	return out, err
}

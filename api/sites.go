package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	pooldomain "github.com/better-compute/better-compute/store/pools"
)

// Site is a site as the API returns it.
type Site struct {
	ID        string `json:"id"`
	TenantID  string `json:"tenantId"`
	Name      string `json:"name"`
	Region    string `json:"region"`
	IAMRegion string `json:"iamRegion"`
	Kind      string `json:"kind"`
	CreatedBy string `json:"createdBy"`
	CreatedAt int64  `json:"createdAt"`
	UpdatedAt int64  `json:"updatedAt"`
	DeletedAt *int64 `json:"deletedAt,omitempty"`
}

// SiteList is sites.list's answer.
type SiteList struct {
	Items []Site `json:"items"`
}

// SiteToken is a site token as the API returns it. Token is set only in
// siteTokens.create's answer: it is shown once and stored only as SHA-256.
type SiteToken struct {
	ID        string `json:"id"`
	SiteID    string `json:"siteId"`
	TenantID  string `json:"tenantId"`
	Name      string `json:"name"`
	Token     string `json:"token,omitempty"`
	CreatedBy string `json:"createdBy"`
	CreatedAt int64  `json:"createdAt"`
	RevokedAt *int64 `json:"revokedAt,omitempty"`
}

// Site kinds: shared and dedicated are the platform's own, in the root
// tenant; custom is a tenant's own hardware.
const (
	siteShared    = "shared"
	siteDedicated = "dedicated"
	siteCustom    = "custom"
)

// SiteTokenPrefix starts every site token.
const SiteTokenPrefix = "bcst_"

// siteTokenEncoding is lower-case base32 (RFC 4648 alphabet), no padding.
var siteTokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newSiteToken returns a token ("bcst_" and 32 random bytes in lower-case
// base32) and its SHA-256, the only form stored.
func newSiteToken() (string, []byte, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, err
	}
	tok := SiteTokenPrefix + siteTokenEncoding.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(tok))
	return tok, sum[:], nil
}

// HashSiteToken is the stored form of a site token (for the agent's
// authentication, which looks a token up by its hash).
func HashSiteToken(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

const siteColumns = `id, tenant_id, name, region, iam_region, kind, created_by, created_at, updated_at, deleted_at`

func scanSite(row pgx.Row) (Site, error) {
	var s Site
	var created, updated time.Time
	var deleted *time.Time
	if err := row.Scan(&s.ID, &s.TenantID, &s.Name, &s.Region, &s.IAMRegion, &s.Kind, &s.CreatedBy, &created, &updated, &deleted); err != nil {
		return Site{}, err
	}
	s.CreatedAt, s.UpdatedAt, s.DeletedAt = created.UnixMilli(), updated.UnixMilli(), msPtr(deleted)
	return s, nil
}

const siteTokenColumns = `id, site_id, tenant_id, name, created_by, created_at, revoked_at`

func scanSiteToken(row pgx.Row) (SiteToken, error) {
	var t SiteToken
	var created time.Time
	var revoked *time.Time
	if err := row.Scan(&t.ID, &t.SiteID, &t.TenantID, &t.Name, &t.CreatedBy, &created, &revoked); err != nil {
		return SiteToken{}, err
	}
	t.CreatedAt, t.RevokedAt = created.UnixMilli(), msPtr(revoked)
	return t, nil
}

func msPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	ms := t.UnixMilli()
	return &ms
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

func (s *Server) siteResource(id string) iam.Resource {
	return iam.Resource{Type: s.catalog.FullName("site"), ID: id}
}

// putSiteAuthz writes the site's projection row, in the site's transaction.
func (s *Server) putSiteAuthz(ctx context.Context, tx store.Tx, st Site) error {
	return store.PutAuthzResource(ctx, tx, store.AuthzResource{
		Type: s.catalog.FullName("site"), ID: st.ID, TenantID: st.TenantID,
		Attributes: map[string]any{"region": st.Region, "iamRegion": st.IAMRegion, "kind": st.Kind},
	})
}

func (s *Server) sitesCreate(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		Name      string `json:"name"`
		Region    string `json:"region"`
		IAMRegion string `json:"iamRegion"`
		Kind      string `json:"kind"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	// The registry decided shared and dedicated sites on compute-fleet (root
	// tenant only); they are the platform's own, so they live in the root
	// tenant whatever a root caller names.
	if in.Kind != siteCustom && c.TenantID != s.rootTenant {
		return nil, core.Errorf(core.CodeInvalidInput, "a %s site belongs to the platform: create it in the root tenant", in.Kind).
			WithDetails(map[string]any{"field": "kind", "reason": "tenant"})
	}
	st, err := scanSite(tx.QueryRow(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING `+siteColumns,
		core.NewID("site"), c.TenantID, in.Name, in.Region, in.IAMRegion, in.Kind, c.Caller.IdentityID))
	if isUniqueViolation(err) {
		return nil, core.Errorf(core.CodeConflict, "a site named %q exists in this tenant", in.Name).WithDetails(map[string]any{"field": "name"})
	}
	if err != nil {
		return nil, err
	}
	return st, s.putSiteAuthz(ctx, tx, st)
}

// loadSite reads a site of the tenant; another tenant's is NOT_FOUND.
func (s *Server) loadSite(ctx context.Context, tx store.Tx, tenantID, id string, forUpdate bool) (Site, error) {
	q := `SELECT ` + siteColumns + ` FROM sites WHERE tenant_id = $1 AND id = $2`
	if forUpdate {
		q += ` FOR UPDATE`
	}
	st, err := scanSite(tx.QueryRow(ctx, q, tenantID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Site{}, core.Errorf(core.CodeNotFound, "site %s not found", id)
	}
	return st, err
}

// liveSite is loadSite for a change: a deleted site is INVALID_STATE.
func (s *Server) liveSite(ctx context.Context, tx store.Tx, tenantID, id string) (Site, error) {
	st, err := s.loadSite(ctx, tx, tenantID, id, true)
	if err == nil && st.DeletedAt != nil {
		err = core.Errorf(core.CodeInvalidState, "site %s is deleted", id)
	}
	return st, err
}

func (s *Server) sitesGet(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		SiteID string `json:"siteId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return s.loadSite(ctx, tx, c.TenantID, in.SiteID, false)
}

func (s *Server) sitesList(ctx context.Context, c *Call, tx store.Tx) (rpc.Page, error) {
	// The SQL pre-filter: the tenant's live sites the projection holds.
	rows, err := tx.Query(ctx, `SELECT `+siteColumns+` FROM sites s
		WHERE s.tenant_id = $1 AND s.deleted_at IS NULL
		  AND EXISTS (SELECT 1 FROM authz_resources a WHERE a.type = $2 AND a.id = s.id AND a.tenant_id = $1)
		ORDER BY s.created_at, s.id LIMIT $3`, c.TenantID, s.catalog.FullName("site"), listLimit)
	if err != nil {
		return rpc.Page{}, err
	}
	sites, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Site, error) { return scanSite(r) })
	if err != nil {
		return rpc.Page{}, err
	}
	return rpc.PageOf(sites, func(x Site) iam.Resource { return s.siteResource(x.ID) },
		func(kept []Site) any { return SiteList{Items: kept} }), nil
}

// sitesUpdate changes a site's name, region or iamRegion. Its kind never
// changes (the kind chose the create's decision). A new region is also
// written to the projection rows of the site's pools, whose region it is.
func (s *Server) sitesUpdate(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		SiteID    string  `json:"siteId"`
		Name      *string `json:"name"`
		Region    *string `json:"region"`
		IAMRegion *string `json:"iamRegion"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	st, err := s.liveSite(ctx, tx, c.TenantID, in.SiteID)
	if err != nil {
		return nil, err
	}
	st, err = scanSite(tx.QueryRow(ctx, `UPDATE sites SET name = coalesce($2, name), region = coalesce($3, region),
		iam_region = coalesce($4, iam_region), updated_at = now() WHERE id = $1 RETURNING `+siteColumns,
		st.ID, in.Name, in.Region, in.IAMRegion))
	if isUniqueViolation(err) {
		return nil, core.Errorf(core.CodeConflict, "a site named %q exists in this tenant", *in.Name).WithDetails(map[string]any{"field": "name"})
	}
	if err != nil {
		return nil, err
	}
	if err := s.putSiteAuthz(ctx, tx, st); err != nil {
		return nil, err
	}
	if in.Region != nil {
		ids, err := collectStrings(tx.Query(ctx, `SELECT id FROM pools WHERE site_id = $1 FOR UPDATE`, st.ID))
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			p, err := pooldomain.LoadByID(ctx, tx, id)
			if err != nil {
				return nil, err
			}
			if err := pooldomain.PutAuthz(ctx, tx, s.catalog.FullName(pooldomain.ResourceType), p); err != nil {
				return nil, err
			}
		}
	}
	return st, nil
}

// sitesDelete marks a site deleted and revokes its tokens. A site that
// still has live pools is INVALID_STATE. The row (and its projection row)
// stays, so get still answers with deletedAt.
func (s *Server) sitesDelete(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		SiteID string `json:"siteId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	st, err := s.liveSite(ctx, tx, c.TenantID, in.SiteID)
	if err != nil {
		return nil, err
	}
	var pools int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pools WHERE site_id = $1 AND archived_at IS NULL`, st.ID).Scan(&pools); err != nil {
		return nil, err
	}
	if pools > 0 {
		return nil, core.Errorf(core.CodeInvalidState, "site %s has %d live pools; archive them first", st.ID, pools).
			WithDetails(map[string]any{"pools": pools})
	}
	if _, err := tx.Exec(ctx, `UPDATE site_tokens SET revoked_at = now() WHERE site_id = $1 AND revoked_at IS NULL`, st.ID); err != nil {
		return nil, err
	}
	return scanSite(tx.QueryRow(ctx, `UPDATE sites SET deleted_at = now(), updated_at = now() WHERE id = $1 RETURNING `+siteColumns, st.ID))
}

func (s *Server) siteTokensCreate(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		SiteID string `json:"siteId"`
		Name   string `json:"name"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	st, err := s.liveSite(ctx, tx, c.TenantID, in.SiteID)
	if err != nil {
		return nil, err
	}
	tok, hash, err := newSiteToken()
	if err != nil {
		return nil, err
	}
	t, err := scanSiteToken(tx.QueryRow(ctx, `INSERT INTO site_tokens (id, site_id, tenant_id, name, token_hash, created_by)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING `+siteTokenColumns,
		core.NewID("stok"), st.ID, st.TenantID, in.Name, hash, c.Caller.IdentityID))
	if err != nil {
		return nil, err
	}
	t.Token = tok // shown once: this answer is the only place it exists
	return t, nil
}

// siteTokensRevoke revokes a token of the site. Revoking a revoked token
// changes nothing: it keeps its first revokedAt, and nothing un-revokes.
func (s *Server) siteTokensRevoke(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		SiteID  string `json:"siteId"`
		TokenID string `json:"tokenId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if _, err := s.loadSite(ctx, tx, c.TenantID, in.SiteID, true); err != nil {
		return nil, err
	}
	t, err := scanSiteToken(tx.QueryRow(ctx, `UPDATE site_tokens SET revoked_at = coalesce(revoked_at, now())
		WHERE id = $1 AND site_id = $2 AND tenant_id = $3 RETURNING `+siteTokenColumns, in.TokenID, in.SiteID, c.TenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, core.Errorf(core.CodeNotFound, "site token %s not found", in.TokenID)
	}
	return t, err
}

// collectStrings reads a one-column text result.
func collectStrings(rows pgx.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

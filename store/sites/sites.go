// Package sites is the sites domain: sites (where pools' machines are) and
// their site tokens (the site agents' credentials), their rules, their SQL
// and their state writes. It is the only writer of the sites and
// site_tokens tables.
package sites

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// ResourceType is the catalog type a site is decided on.
const ResourceType = "site"

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

// Token is a site token as the API returns it. Token is set only in
// siteTokens.create's answer: it is shown once and stored only as SHA-256.
type Token struct {
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
	KindShared    = "shared"
	KindDedicated = "dedicated"
	KindCustom    = "custom"
)

// TokenPrefix starts every site token.
const TokenPrefix = "bcst_"

// tokenEncoding is lower-case base32 (RFC 4648 alphabet), no padding.
var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newToken returns a token ("bcst_" and 32 random bytes in lower-case
// base32) and its SHA-256, the only form stored.
func newToken() (string, []byte, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, err
	}
	tok := TokenPrefix + tokenEncoding.EncodeToString(b[:])
	return tok, HashToken(tok), nil
}

// HashToken is the stored form of a site token (for the agent's
// authentication, which looks a token up by its hash).
func HashToken(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

const columns = `id, tenant_id, name, region, iam_region, kind, created_by, created_at, updated_at, deleted_at`

func scan(row pgx.Row) (Site, error) {
	var s Site
	var created, updated time.Time
	var deleted *time.Time
	if err := row.Scan(&s.ID, &s.TenantID, &s.Name, &s.Region, &s.IAMRegion, &s.Kind, &s.CreatedBy, &created, &updated, &deleted); err != nil {
		return Site{}, err
	}
	s.CreatedAt, s.UpdatedAt, s.DeletedAt = created.UnixMilli(), updated.UnixMilli(), msPtr(deleted)
	return s, nil
}

const tokenColumns = `id, site_id, tenant_id, name, created_by, created_at, revoked_at`

func scanToken(row pgx.Row) (Token, error) {
	var t Token
	var created time.Time
	var revoked *time.Time
	if err := row.Scan(&t.ID, &t.SiteID, &t.TenantID, &t.Name, &t.CreatedBy, &created, &revoked); err != nil {
		return Token{}, err
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

func nameTaken(err error, name string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return core.Errorf(core.CodeConflict, "a site named %q exists in this tenant", name).WithDetails(map[string]any{"field": "name"})
	}
	return err
}

// putAuthz writes the site's projection row (typ is the site type's full
// name), in the site's transaction.
func putAuthz(ctx context.Context, tx store.Tx, typ string, st Site) error {
	return store.PutAuthzResource(ctx, tx, store.AuthzResource{
		Type: typ, ID: st.ID, TenantID: st.TenantID,
		Attributes: map[string]any{"region": st.Region, "iamRegion": st.IAMRegion, "kind": st.Kind},
	})
}

// New is what sites.create is given.
type New struct {
	Name      string
	Region    string
	IAMRegion string
	Kind      string
}

// Create inserts a site and its authorization row. Shared and dedicated
// sites are the platform's own, so they live in the root tenant (their
// create was decided on compute-fleet): another tenant is INVALID_INPUT. A
// name taken in the tenant is CONFLICT.
func Create(ctx context.Context, tx store.Tx, typ, rootTenant, tenantID, createdBy string, in New) (Site, error) {
	if in.Kind != KindCustom && tenantID != rootTenant {
		return Site{}, core.Errorf(core.CodeInvalidInput, "a %s site belongs to the platform: create it in the root tenant", in.Kind).
			WithDetails(map[string]any{"field": "kind", "reason": "tenant"})
	}
	st, err := scan(tx.QueryRow(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING `+columns,
		core.NewID("site"), tenantID, in.Name, in.Region, in.IAMRegion, in.Kind, createdBy))
	if err != nil {
		return Site{}, nameTaken(err, in.Name)
	}
	return st, putAuthz(ctx, tx, typ, st)
}

// Load reads a site of the tenant; another tenant's is NOT_FOUND.
func Load(ctx context.Context, tx store.Tx, tenantID, id string, forUpdate bool) (Site, error) {
	q := loadSQL
	if forUpdate {
		q += ` FOR UPDATE`
	}
	return scanLoaded(tx.QueryRow(ctx, q, tenantID, id), id)
}

// QueueLoad queues Load's read (unlocked) in b (store.Read); the answer is
// valid once b has run.
func QueueLoad(b *store.Batch, tenantID, id string) func() (Site, error) {
	return store.QueueRow(b, func(row pgx.Row) (Site, error) { return scanLoaded(row, id) }, loadSQL, tenantID, id)
}

const loadSQL = `SELECT ` + columns + ` FROM sites WHERE tenant_id = $1 AND id = $2`

func scanLoaded(row pgx.Row, id string) (Site, error) {
	st, err := scan(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return Site{}, core.Errorf(core.CodeNotFound, "site %s not found", id)
	}
	return st, err
}

// Live is Load for a change, locked: a deleted site is INVALID_STATE.
func Live(ctx context.Context, tx store.Tx, tenantID, id string) (Site, error) {
	st, err := Load(ctx, tx, tenantID, id, true)
	if err == nil && st.DeletedAt != nil {
		err = core.Errorf(core.CodeInvalidState, "site %s is deleted", id)
	}
	return st, err
}

// List reads the tenant's live sites the projection holds (typ is the site
// type's full name), at most limit, oldest first.
func List(ctx context.Context, tx store.Tx, typ, tenantID string, page store.PageQuery) ([]Site, error) {
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM sites s
		WHERE s.tenant_id = $1 AND s.deleted_at IS NULL AND `+store.VisibleIn("s.id", "$1", "$2", false)+`
		  AND (`+store.MsOf("s.created_at")+`, s.id) > ($4, $5)
		ORDER BY `+store.MsOf("s.created_at")+`, s.id LIMIT $3`, tenantID, typ, page.Fetch(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Site, error) { return scan(r) })
}

// Change is what sites.update changes; nil fields are kept. A site's kind
// never changes (the kind chose the create's decision).
type Change struct {
	Name      *string
	Region    *string
	IAMRegion *string
}

// Update changes the tenant's live site and its projection row. The rows
// of the site's pools, whose region is the site's, are the pools domain's
// to rewrite when the region changed.
func Update(ctx context.Context, tx store.Tx, typ, tenantID, id string, ch Change) (Site, error) {
	st, err := Live(ctx, tx, tenantID, id)
	if err != nil {
		return Site{}, err
	}
	st, err = scan(tx.QueryRow(ctx, `UPDATE sites SET name = coalesce($2, name), region = coalesce($3, region),
		iam_region = coalesce($4, iam_region), updated_at = now() WHERE id = $1 RETURNING `+columns,
		st.ID, ch.Name, ch.Region, ch.IAMRegion))
	if err != nil {
		name := ""
		if ch.Name != nil {
			name = *ch.Name
		}
		return Site{}, nameTaken(err, name)
	}
	return st, putAuthz(ctx, tx, typ, st)
}

// Delete marks the tenant's live site deleted and revokes its tokens. A
// site that still has live pools is INVALID_STATE. The row (and its
// projection row) stays, so get still answers with deletedAt.
func Delete(ctx context.Context, tx store.Tx, tenantID, id string) (Site, error) {
	st, err := Live(ctx, tx, tenantID, id)
	if err != nil {
		return Site{}, err
	}
	var pools int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pools WHERE site_id = $1 AND archived_at IS NULL`, st.ID).Scan(&pools); err != nil {
		return Site{}, err
	}
	if pools > 0 {
		return Site{}, core.Errorf(core.CodeInvalidState, "site %s has %d live pools; archive them first", st.ID, pools).
			WithDetails(map[string]any{"pools": pools})
	}
	if _, err := tx.Exec(ctx, `UPDATE site_tokens SET revoked_at = now() WHERE site_id = $1 AND revoked_at IS NULL`, st.ID); err != nil {
		return Site{}, err
	}
	return scan(tx.QueryRow(ctx, `UPDATE sites SET deleted_at = now(), updated_at = now() WHERE id = $1 RETURNING `+columns, st.ID))
}

// CreateToken makes a token of the tenant's live site. The answer is the
// only place the token exists: only its hash is stored.
func CreateToken(ctx context.Context, tx store.Tx, tenantID, siteID, name, createdBy string) (Token, error) {
	st, err := Live(ctx, tx, tenantID, siteID)
	if err != nil {
		return Token{}, err
	}
	tok, hash, err := newToken()
	if err != nil {
		return Token{}, err
	}
	t, err := scanToken(tx.QueryRow(ctx, `INSERT INTO site_tokens (id, site_id, tenant_id, name, token_hash, created_by)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING `+tokenColumns,
		core.NewID("stok"), st.ID, st.TenantID, name, hash, createdBy))
	if err != nil {
		return Token{}, err
	}
	t.Token = tok
	return t, nil
}

// RevokeToken revokes a token of the tenant's site. Revoking a revoked
// token changes nothing: it keeps its first revokedAt, and nothing
// un-revokes.
func RevokeToken(ctx context.Context, tx store.Tx, tenantID, siteID, tokenID string) (Token, error) {
	if _, err := Load(ctx, tx, tenantID, siteID, true); err != nil {
		return Token{}, err
	}
	t, err := scanToken(tx.QueryRow(ctx, `UPDATE site_tokens SET revoked_at = coalesce(revoked_at, now())
		WHERE id = $1 AND site_id = $2 AND tenant_id = $3 RETURNING `+tokenColumns, tokenID, siteID, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, core.Errorf(core.CodeNotFound, "site token %s not found", tokenID)
	}
	return t, err
}

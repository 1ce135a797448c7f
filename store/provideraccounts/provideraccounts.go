// Package provideraccounts is the provider accounts domain's store: an
// account with a capacity provider (provider_accounts), whose credential is
// a secret:// reference resolved only when a Provider is opened. It is the
// only writer of provider_accounts.
//
// An account is its tenant's: another tenant's reads as NOT_FOUND exactly
// like a missing one. The root tenant's accounts back the fleet's provider
// pools; a tenant's own back its own.
package provideraccounts

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/secrets"
)

// IDPrefix starts every account id; ResourceType and AuthzType are the
// catalog type an account is decided on and its full name.
const (
	IDPrefix     = "pacct"
	ResourceType = "provider-account"
	AuthzType    = "compute-provider-account"
)

// Providers an account may name.
const (
	ProviderDigitalOcean = "digitalocean"
)

// Account is a provider account as the API answers it (never the token).
type Account struct {
	ID            string   `json:"id"`
	TenantID      string   `json:"tenantId"`
	Provider      string   `json:"provider"`
	Name          string   `json:"name"`
	CredentialRef string   `json:"credentialRef"`
	BaseURL       string   `json:"baseUrl,omitempty"`
	Regions       []string `json:"regions"`
	Previews      bool     `json:"previews"`
	CreatedBy     string   `json:"createdBy"`
	CreatedAt     int64    `json:"createdAt"`
	UpdatedAt     int64    `json:"updatedAt"`
	// DeletedAt is set only in delete's answer: a deleted account is
	// NOT_FOUND to every read.
	DeletedAt int64 `json:"deletedAt,omitempty"`
}

const columns = `id, tenant_id, provider, name, credential_ref, base_url, regions, previews, created_by,
	(floor(extract(epoch FROM created_at) * 1000)::bigint), (floor(extract(epoch FROM updated_at) * 1000)::bigint),
	COALESCE((floor(extract(epoch FROM deleted_at) * 1000)::bigint), 0)`

func scan(row pgx.Row) (Account, error) {
	var a Account
	err := row.Scan(&a.ID, &a.TenantID, &a.Provider, &a.Name, &a.CredentialRef, &a.BaseURL, &a.Regions, &a.Previews,
		&a.CreatedBy, &a.CreatedAt, &a.UpdatedAt, &a.DeletedAt)
	if a.Regions == nil {
		a.Regions = []string{}
	}
	return a, err
}

// NotFound is the error of an account that is missing, deleted or another
// tenant's: the same for all three.
func NotFound(id string) error {
	return core.Errorf(core.CodeNotFound, "provider account %s not found", id)
}

// Get reads a live account by id, whatever its tenant: callers decide on
// it first (the API) or reach it through a pool they already hold.
func Get(ctx context.Context, tx store.DBTX, id string) (Account, error) {
	a, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM provider_accounts WHERE id = $1 AND deleted_at IS NULL`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Account{}, NotFound(id)
	}
	if err != nil {
		return Account{}, fmt.Errorf("provideraccounts: reading %s: %w", id, err)
	}
	return a, nil
}

// Load reads the tenant's live account; lock takes its row for a change.
// Another tenant's, or a deleted one, is NOT_FOUND.
func Load(ctx context.Context, tx store.DBTX, tenantID, id string, lock bool) (Account, error) {
	q := `SELECT ` + columns + ` FROM provider_accounts WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL`
	if lock {
		q += ` FOR UPDATE`
	}
	a, err := scan(tx.QueryRow(ctx, q, id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Account{}, NotFound(id)
	}
	if err != nil {
		return Account{}, fmt.Errorf("provideraccounts: reading %s: %w", id, err)
	}
	return a, nil
}

// ForPool is the account a pool of poolTenantID may name: the tenant's
// own live account, its row share-locked to the caller's commit, so a
// concurrent delete waits for the pool (and then refuses) or the pool's
// write sees the account gone. Any other is NOT_FOUND naming the field
// providerAccountId. The pools domain calls it when a provider pool is
// created or its account changes.
func ForPool(ctx context.Context, tx store.Tx, poolTenantID, id string) (Account, error) {
	a, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM provider_accounts
		WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL FOR SHARE`, id, poolTenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Account{}, core.Errorf(core.CodeNotFound, "provider account %s not found", id).
			WithDetails(map[string]any{"field": "providerAccountId"})
	}
	if err != nil {
		return Account{}, fmt.Errorf("provideraccounts: reading %s: %w", id, err)
	}
	return a, nil
}

// Token resolves the account's credential for use (recorded in
// secret_resolutions), in the caller's read-write transaction; the caller
// (an activity) opens the Provider with it (providers.Credential{Kind:
// a.Provider, Token: token, BaseURL: a.BaseURL}) after the commit and never
// keeps it.
func Token(ctx context.Context, tx store.Tx, vault *secrets.Vault, a Account, use secrets.Use) (string, error) {
	use.TenantID = a.TenantID
	if use.ResourceType == "" {
		use.ResourceType, use.ResourceID = AuthzType, a.ID
	}
	return vault.Resolve(ctx, tx, a.CredentialRef, use)
}

// New is what providerAccounts.create is given.
type New struct {
	TenantID      string
	Provider      string
	Name          string
	CredentialRef string
	BaseURL       string
	Regions       []string
	Previews      bool
	CreatedBy     string
}

// Accounts is the domain's writes in a deployment whose platform tenant is
// root (the only tenant whose accounts may override the provider's
// address), with secrets in vault, deciding on the authorization type typ
// (the catalog's full name of "provider-account").
type Accounts struct {
	vault *secrets.Vault
	root  string
	typ   string
}

// NewAccounts is the domain's writes; typ "" is AuthzType.
func NewAccounts(vault *secrets.Vault, root, typ string) *Accounts {
	if typ == "" {
		typ = AuthzType
	}
	return &Accounts{vault: vault, root: root, typ: typ}
}

func (m *Accounts) putAuthz(ctx context.Context, tx store.Tx, a Account) error {
	return store.PutAuthzResource(ctx, tx, store.AuthzResource{Type: m.typ, ID: a.ID, TenantID: a.TenantID})
}

// Create checks n (see Check and checkCredential) and inserts the account
// with its authorization row. A live account's name taken in the tenant is
// CONFLICT naming the field name.
func (m *Accounts) Create(ctx context.Context, tx store.Tx, n New) (Account, error) {
	if n.Regions == nil {
		n.Regions = []string{}
	}
	if err := m.check(ctx, tx, n.TenantID, n.Provider, n.Name, n.CredentialRef, n.BaseURL, n.Regions); err != nil {
		return Account{}, err
	}
	a, err := scan(tx.QueryRow(ctx, `INSERT INTO provider_accounts
		(id, tenant_id, provider, name, credential_ref, base_url, regions, previews, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING `+columns,
		core.NewID(IDPrefix), n.TenantID, n.Provider, n.Name, n.CredentialRef, n.BaseURL, n.Regions, n.Previews, n.CreatedBy))
	if err != nil {
		return Account{}, nameTaken(err, n.Name)
	}
	return a, m.putAuthz(ctx, tx, a)
}

// Change is what providerAccounts.update changes; nil fields are kept.
type Change struct {
	Name          *string
	CredentialRef *string
	BaseURL       *string
	Regions       []string // nil keeps them; empty allows every region
	Previews      *bool
}

// Update changes the tenant's live account, checked as Create checks a
// new one.
func (m *Accounts) Update(ctx context.Context, tx store.Tx, tenantID, id string, ch Change) (Account, error) {
	a, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Account{}, err
	}
	set := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	set(&a.Name, ch.Name)
	set(&a.CredentialRef, ch.CredentialRef)
	set(&a.BaseURL, ch.BaseURL)
	if ch.Regions != nil {
		a.Regions = ch.Regions
	}
	if ch.Previews != nil {
		a.Previews = *ch.Previews
	}
	if err := m.check(ctx, tx, a.TenantID, a.Provider, a.Name, a.CredentialRef, a.BaseURL, a.Regions); err != nil {
		return Account{}, err
	}
	out, err := scan(tx.QueryRow(ctx, `UPDATE provider_accounts SET name = $2, credential_ref = $3, base_url = $4,
		regions = $5, previews = $6, updated_at = now() WHERE id = $1 RETURNING `+columns,
		a.ID, a.Name, a.CredentialRef, a.BaseURL, a.Regions, a.Previews))
	if err != nil {
		return Account{}, nameTaken(err, a.Name)
	}
	return out, nil
}

// Delete marks the tenant's live account deleted. While a live pool names
// it, it is INVALID_STATE (details.reason "pools", details.pools the
// count): archive the pools first. Its row is locked first, so a pool
// being created with it (ForPool) either commits before the count or sees
// the account gone.
func (m *Accounts) Delete(ctx context.Context, tx store.Tx, tenantID, id string) (Account, error) {
	a, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Account{}, err
	}
	var pools int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pools WHERE provider_account_id = $1 AND archived_at IS NULL`, a.ID).
		Scan(&pools); err != nil {
		return Account{}, fmt.Errorf("provideraccounts: counting the pools of %s: %w", a.ID, err)
	}
	if pools > 0 {
		return Account{}, core.Errorf(core.CodeInvalidState, "provider account %s backs %d live pools; archive them first", a.ID, pools).
			WithDetails(map[string]any{"reason": "pools", "pools": pools})
	}
	return scan(tx.QueryRow(ctx, `UPDATE provider_accounts SET deleted_at = now(), updated_at = now()
		WHERE id = $1 RETURNING `+columns, a.ID))
}

// List reads the tenant's live accounts the projection holds (typ is the
// account type's full name), oldest first.
func List(ctx context.Context, tx store.DBTX, typ, tenantID string, page store.PageQuery) ([]Account, error) {
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM provider_accounts p
		WHERE p.tenant_id = $1 AND p.deleted_at IS NULL AND `+store.VisibleIn("p.id", "$1", "$2", false)+`
		  AND (`+store.MsOf("p.created_at")+`, p.id) > ($4, $5)
		ORDER BY `+store.MsOf("p.created_at")+`, p.id LIMIT $3`, tenantID, typ, page.Fetch(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Account, error) { return scan(r) })
}

func nameTaken(err error, name string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return core.Errorf(core.CodeConflict, "a provider account named %q exists in this tenant", name).
			WithDetails(map[string]any{"field": "name"})
	}
	return err
}

// check is every rule of an account's fields: Check's, then that the
// credential names a secret of the account's own tenant.
func (m *Accounts) check(ctx context.Context, tx store.Tx, tenantID, provider, name, ref, baseURL string, regions []string) error {
	if err := Check(tenantID, m.root, provider, name, ref, baseURL, regions); err != nil {
		return err
	}
	return m.checkCredential(ctx, tx, tenantID, ref)
}

// checkCredential refuses a reference to a secret the account's tenant
// does not own. A fleet secret of the root tenant is refused for other
// tenants too: it is the platform's credential, and an account of a
// tenant would spend it on the tenant's behalf.
func (m *Accounts) checkCredential(ctx context.Context, tx store.Tx, tenantID, ref string) error {
	refTenant, err := refTenantOf(ref)
	if err != nil {
		return err
	}
	if !m.vault.Configured() {
		return core.Errorf(core.CodeUnavailable, "no secret store is configured")
	}
	ok := refTenant == tenantID
	if ok {
		if ok, err = m.vault.Exists(ctx, tx, tenantID, ref); err != nil {
			return err
		}
	}
	if !ok {
		return core.Errorf(core.CodeInvalidInput, "credentialRef names no secret of this tenant").
			WithDetails(map[string]any{"field": "credentialRef", "reason": "secretNotFound"})
	}
	return nil
}

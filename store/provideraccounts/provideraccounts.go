// Package provideraccounts is the provider accounts domain's store: an
// account with a capacity provider (provider_accounts), whose credential is
// a secret:// reference resolved only when a Provider is opened. It is the
// only writer of provider_accounts.
package provideraccounts

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

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
}

const columns = `id, tenant_id, provider, name, credential_ref, base_url, regions, previews, created_by,
	(floor(extract(epoch FROM created_at) * 1000)::bigint), (floor(extract(epoch FROM updated_at) * 1000)::bigint)`

func scan(row pgx.Row) (Account, error) {
	var a Account
	err := row.Scan(&a.ID, &a.TenantID, &a.Provider, &a.Name, &a.CredentialRef, &a.BaseURL, &a.Regions, &a.Previews,
		&a.CreatedBy, &a.CreatedAt, &a.UpdatedAt)
	return a, err
}

// Get reads a live account by id, whatever its tenant: callers decide on
// it first (the API) or reach it through a pool they already hold.
func Get(ctx context.Context, tx store.DBTX, id string) (Account, error) {
	a, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM provider_accounts WHERE id = $1 AND deleted_at IS NULL`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Account{}, core.Errorf(core.CodeNotFound, "provider account %s not found", id)
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

// Package secrets is the sealed secret store: secrets.put and
// secrets.delete write it, and Resolve hands a value, just before its use,
// to the one party entitled to it (the site agent that drives a node's
// BMC), recording the resolution.
//
// Values are sealed by envelope encryption with tink: each value under a
// fresh AES-256-GCM data key, the data key wrapped by the key-encryption
// key (the keyring's primary, whose id each row keeps), and the ciphertext
// bound to its tenant, name and version as associated data, so a row copied
// to another tenant, another name or another version does not open.
package secrets

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/tink-crypto/tink-go/v2/aead"

	"github.com/better-compute/better-compute/core"
	coresecrets "github.com/better-compute/better-compute/core/secrets"
	"github.com/better-compute/better-compute/store"
)

// Secret is a secret as the methods answer it: its reference and
// bookkeeping, never its value.
type Secret struct {
	Ref         string `json:"ref"`
	TenantID    string `json:"tenantId"`
	Name        string `json:"name"`
	Scope       string `json:"scope"`
	Description string `json:"description,omitempty"`
	Version     int64  `json:"version"`
	CreatedBy   string `json:"createdBy"`
	UpdatedBy   string `json:"updatedBy"`
	CreatedAt   int64  `json:"createdAt"`
	UpdatedAt   int64  `json:"updatedAt"`
}

// Vault seals, stores and resolves secrets with a keyring. A vault without
// one refuses every put and resolution with UNAVAILABLE: nothing is ever
// stored in clear.
type Vault struct {
	keys       *Keyring
	rootTenant string
}

// NewVault is the vault of keys (nil: none configured) in a deployment whose
// platform tenant is rootTenant (where fleet secrets live).
func NewVault(keys *Keyring, rootTenant string) *Vault {
	return &Vault{keys: keys, rootTenant: rootTenant}
}

// Configured reports whether the vault has a key-encryption key.
func (v *Vault) Configured() bool { return v != nil && v.keys != nil }

func (v *Vault) keyring() (*Keyring, error) {
	if !v.Configured() {
		return nil, core.Errorf(core.CodeUnavailable,
			"the secret store has no key-encryption key: start the server with --secrets-kek-file or %s", EnvKEK).
			WithDetails(map[string]any{"reason": "noKek"})
	}
	return v.keys, nil
}

// PutRequest is one secrets.put.
type PutRequest struct {
	TenantID    string
	Name        string
	Scope       string
	Value       string
	Description string
	// IdempotencyKey, optional: a retry with it answers the put it made;
	// with another request it is CONFLICT.
	IdempotencyKey string
	By             string // the caller's identity
}

// Put creates the secret or replaces its value by a new version, in the
// caller's transaction. A fleet secret lives in the root tenant only.
func (v *Vault) Put(ctx context.Context, tx store.Tx, p PutRequest) (Secret, error) {
	keys, err := v.keyring()
	if err != nil {
		return Secret{}, err
	}
	if err := v.checkScope(p.TenantID, p.Scope); err != nil {
		return Secret{}, err
	}
	if !coresecrets.ValidName(p.Name) {
		return Secret{}, core.Errorf(core.CodeInvalidInput, "name must match %s", coresecrets.NamePattern).
			WithDetails(map[string]any{"field": "name", "reason": "pattern"})
	}
	digest := requestDigest(p)
	if p.IdempotencyKey != "" {
		if err := lock(ctx, tx, "secret-put-key", p.TenantID, p.By, p.IdempotencyKey); err != nil {
			return Secret{}, err
		}
		if s, found, err := v.replay(ctx, tx, p, digest); found || err != nil {
			return s, err
		}
	}
	if err := lock(ctx, tx, "secret", p.TenantID, p.Name); err != nil {
		return Secret{}, err
	}
	var version int64
	var scope string
	err = tx.QueryRow(ctx, `SELECT version, scope FROM secrets WHERE tenant_id = $1 AND name = $2 FOR UPDATE`,
		p.TenantID, p.Name).Scan(&version, &scope)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return Secret{}, fmt.Errorf("secrets: reading %s: %w", p.Name, err)
	case scope != p.Scope:
		return Secret{}, core.Errorf(core.CodeConflict, "secret %s exists as a %s secret", p.Name, scope).
			WithDetails(map[string]any{"field": "scope"})
	}
	version++
	sealed, err := seal(keys.primary, []byte(p.Value), valueAD(p.TenantID, p.Name, version))
	if err != nil {
		return Secret{}, err
	}
	s, err := scan(tx.QueryRow(ctx, `INSERT INTO secrets
		(tenant_id, name, scope, description, version, kek_id, sealed, created_by, updated_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)
		ON CONFLICT (tenant_id, name) DO UPDATE SET description = EXCLUDED.description, version = EXCLUDED.version,
			kek_id = EXCLUDED.kek_id, sealed = EXCLUDED.sealed, updated_by = EXCLUDED.updated_by, updated_at = now()
		RETURNING `+columns,
		p.TenantID, p.Name, p.Scope, p.Description, version, keys.primary.ID(), sealed, p.By))
	if err != nil {
		return Secret{}, fmt.Errorf("secrets: writing %s: %w", p.Name, err)
	}
	if p.IdempotencyKey == "" {
		return s, nil
	}
	sealedRequest, err := seal(keys.primary, digest[:], keyAD(p.TenantID, p.By, p.IdempotencyKey))
	if err != nil {
		return Secret{}, err
	}
	answer, err := json.Marshal(s)
	if err != nil {
		return Secret{}, fmt.Errorf("secrets: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO secret_put_keys
		(tenant_id, identity_id, idempotency_key, name, kek_id, sealed_request, answer) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		p.TenantID, p.By, p.IdempotencyKey, p.Name, keys.primary.ID(), sealedRequest, answer); err != nil {
		return Secret{}, fmt.Errorf("secrets: recording the idempotency key: %w", err)
	}
	return s, nil
}

// replay answers the put an idempotency key already made: the same request
// answers what it answered, another one is CONFLICT.
func (v *Vault) replay(ctx context.Context, tx store.Tx, p PutRequest, digest [sha256.Size]byte) (Secret, bool, error) {
	var kekID string
	var sealed, answer []byte
	err := tx.QueryRow(ctx, `SELECT kek_id, sealed_request, answer FROM secret_put_keys
		WHERE tenant_id = $1 AND identity_id = $2 AND idempotency_key = $3`, p.TenantID, p.By, p.IdempotencyKey).
		Scan(&kekID, &sealed, &answer)
	if errors.Is(err, pgx.ErrNoRows) {
		return Secret{}, false, nil
	}
	if err != nil {
		return Secret{}, false, fmt.Errorf("secrets: reading the idempotency key: %w", err)
	}
	stored, err := v.open(kekID, sealed, keyAD(p.TenantID, p.By, p.IdempotencyKey))
	if err != nil {
		return Secret{}, false, err
	}
	if subtle.ConstantTimeCompare(stored, digest[:]) != 1 {
		return Secret{}, false, core.Errorf(core.CodeConflict, "idempotencyKey %q was used with another request", p.IdempotencyKey).
			WithDetails(map[string]any{"field": "idempotencyKey"})
	}
	var s Secret
	if err := json.Unmarshal(answer, &s); err != nil {
		return Secret{}, false, fmt.Errorf("secrets: the idempotency key's answer: %w", err)
	}
	return s, true, nil
}

// Delete removes the secret name of the tenant with its value and its
// idempotency keys; an unknown name, or one of the other scope, is
// NOT_FOUND.
func (v *Vault) Delete(ctx context.Context, tx store.Tx, tenantID, scope, name string) (Secret, error) {
	s, err := scan(tx.QueryRow(ctx, `DELETE FROM secrets WHERE tenant_id = $1 AND name = $2 AND scope = $3 RETURNING `+columns,
		tenantID, name, scope))
	if errors.Is(err, pgx.ErrNoRows) {
		return Secret{}, notFound(name)
	}
	if err != nil {
		return Secret{}, fmt.Errorf("secrets: deleting %s: %w", name, err)
	}
	return s, nil
}

// Use says who receives a resolved value and for what; it is the
// resolution's record (secret_resolutions), never the value.
type Use struct {
	// TenantID is the tenant the value is used for (the node's): only its
	// own secrets and the fleet's (the root tenant's) resolve for it.
	TenantID string
	// Purpose is what the value is for ("bmc-credentials").
	Purpose string
	// IdentityKind and IdentityID name the receiver ("site", the site id).
	IdentityKind, IdentityID string
	// ResourceType and ResourceID name what it is used on (the node).
	ResourceType, ResourceID string
	RequestID                string
}

// Resolve opens the value a reference names, for use, in the caller's
// (read-write) transaction, and records the resolution in it. Only
// use.TenantID's own secrets and the fleet's resolve: another tenant's
// secret, or the root tenant's own, is the NOT_FOUND of a missing one, so
// resolving tells nothing across tenants.
func (v *Vault) Resolve(ctx context.Context, tx store.Tx, ref string, use Use) (string, error) {
	tenantID, name, err := coresecrets.ParseRef(ref)
	if err != nil {
		return "", err
	}
	if use.Purpose == "" || use.IdentityKind == "" || use.IdentityID == "" || use.TenantID == "" {
		return "", errors.New("secrets: a resolution names its tenant, purpose and receiver")
	}
	if _, err := v.keyring(); err != nil {
		return "", err
	}
	if tenantID != use.TenantID && tenantID != v.rootTenant {
		return "", notFound(name)
	}
	var version int64
	var kekID, scope string
	var sealed []byte
	err = tx.QueryRow(ctx, `SELECT version, kek_id, sealed, scope FROM secrets WHERE tenant_id = $1 AND name = $2`, tenantID, name).
		Scan(&version, &kekID, &sealed, &scope)
	// The root tenant's own (tenant-scope) secrets are its own; only its
	// fleet secrets serve other tenants.
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && tenantID != use.TenantID && scope != coresecrets.ScopeFleet) {
		return "", notFound(name)
	}
	if err != nil {
		return "", fmt.Errorf("secrets: reading %s: %w", name, err)
	}
	value, err := v.open(kekID, sealed, valueAD(tenantID, name, version))
	if err != nil {
		return "", err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO secret_resolutions
		(id, tenant_id, name, version, purpose, identity_kind, identity_id, resource_type, resource_id, request_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		core.NewID("sres"), tenantID, name, version, use.Purpose, use.IdentityKind, use.IdentityID,
		use.ResourceType, use.ResourceID, use.RequestID); err != nil {
		return "", fmt.Errorf("secrets: recording the resolution: %w", err)
	}
	return string(value), nil
}

// Exists reports whether the reference names a secret of tenantID or a
// fleet secret (the check a method that takes a reference makes before
// storing it); another tenant's is false, as a missing one.
func (v *Vault) Exists(ctx context.Context, tx store.Tx, tenantID, ref string) (bool, error) {
	refTenant, name, err := coresecrets.ParseRef(ref)
	if err != nil {
		return false, err
	}
	if refTenant != tenantID && refTenant != v.rootTenant {
		return false, nil
	}
	var found bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM secrets WHERE tenant_id = $1 AND name = $2 AND ($1 = $3 OR scope = 'fleet'))`,
		refTenant, name, tenantID).Scan(&found); err != nil {
		return false, fmt.Errorf("secrets: %w", err)
	}
	return found, nil
}

// Rewrap seals again, under the keyring's primary KEK, every value sealed
// by an older one (after a rotation), one transaction per secret; it
// answers how many it resealed. Once it has run, the older keys can be
// dropped from the keyring.
func (v *Vault) Rewrap(ctx context.Context, st *store.Store) (int, error) {
	keys, err := v.keyring()
	if err != nil {
		return 0, err
	}
	n := 0
	for {
		done := false
		err := st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			var tenantID, name, kekID string
			var version int64
			var sealed []byte
			err := tx.QueryRow(ctx, `SELECT tenant_id, name, version, kek_id, sealed FROM secrets
				WHERE kek_id <> $1 LIMIT 1 FOR UPDATE SKIP LOCKED`, keys.primary.ID()).Scan(&tenantID, &name, &version, &kekID, &sealed)
			if errors.Is(err, pgx.ErrNoRows) {
				done = true
				return nil
			}
			if err != nil {
				return fmt.Errorf("secrets: rewrap: %w", err)
			}
			ad := valueAD(tenantID, name, version)
			value, err := v.open(kekID, sealed, ad)
			if err != nil {
				return err
			}
			if sealed, err = seal(keys.primary, value, ad); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE secrets SET kek_id = $3, sealed = $4 WHERE tenant_id = $1 AND name = $2`,
				tenantID, name, keys.primary.ID(), sealed)
			return err
		})
		if err != nil || done {
			return n, err
		}
		n++
	}
}

// seal encrypts plaintext under a fresh AES-256-GCM data key wrapped by kek
// (tink's envelope AEAD), bound to ad.
func seal(kek KEK, plaintext, ad []byte) ([]byte, error) {
	out, err := aead.NewKMSEnvelopeAEAD2(aead.AES256GCMKeyTemplate(), kek).Encrypt(plaintext, ad)
	if err != nil {
		return nil, core.Wrap(core.CodeUnavailable, err, "sealing the secret failed")
	}
	return out, nil
}

// open decrypts what seal sealed with the KEK kekID. A row that does not
// open (tampered, copied, or sealed by a key the keyring lacks) is an
// internal error whose message names the key, never the value.
func (v *Vault) open(kekID string, sealed, ad []byte) ([]byte, error) {
	keys, err := v.keyring()
	if err != nil {
		return nil, err
	}
	kek, ok := keys.byID[kekID]
	if !ok {
		return nil, core.Errorf(core.CodeUnavailable, "the secret was sealed by key-encryption key %s, which this process does not have", kekID).
			WithDetails(map[string]any{"reason": "unknownKek", "kekId": kekID})
	}
	out, err := aead.NewKMSEnvelopeAEAD2(aead.AES256GCMKeyTemplate(), kek).Decrypt(sealed, ad)
	if err != nil {
		return nil, core.Wrap(core.CodeInternal, err, "the sealed secret does not open")
	}
	return out, nil
}

// valueAD binds a value's ciphertext to where it belongs. Tenant ids and
// names contain no NUL, so the encoding is unambiguous.
func valueAD(tenantID, name string, version int64) []byte {
	ad := []byte("better-compute secret v1\x00" + tenantID + "\x00" + name + "\x00")
	return binary.BigEndian.AppendUint64(ad, uint64(version))
}

// keyAD binds a sealed request digest to its idempotency key.
func keyAD(tenantID, identityID, key string) []byte {
	return []byte("better-compute secret put key v1\x00" + tenantID + "\x00" + identityID + "\x00" + key)
}

// requestDigest is SHA-256 over the fields of a put, each length-prefixed.
func requestDigest(p PutRequest) [sha256.Size]byte {
	var b []byte
	for _, f := range []string{p.TenantID, p.Scope, p.Name, p.Description, p.Value} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(f)))
		b = append(b, f...)
	}
	return sha256.Sum256(b)
}

// lock takes a transaction advisory lock on the parts' key, so concurrent
// puts of one secret (or one idempotency key) queue instead of racing.
func lock(ctx context.Context, tx store.Tx, parts ...string) error {
	key, err := json.Marshal(parts)
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, string(key)); err != nil {
		return fmt.Errorf("secrets: lock: %w", err)
	}
	return nil
}

func (v *Vault) checkScope(tenantID, scope string) error {
	switch {
	case scope != coresecrets.ScopeTenant && scope != coresecrets.ScopeFleet:
		return core.Errorf(core.CodeInvalidInput, "scope must be %s or %s", coresecrets.ScopeTenant, coresecrets.ScopeFleet).
			WithDetails(map[string]any{"field": "scope", "reason": "enum"})
	case scope == coresecrets.ScopeFleet && tenantID != v.rootTenant:
		return core.Errorf(core.CodeInvalidInput, "a fleet secret belongs to the platform: put it in the root tenant").
			WithDetails(map[string]any{"field": "scope", "reason": "tenant"})
	}
	return nil
}

func notFound(name string) error {
	return core.Errorf(core.CodeNotFound, "secret %s not found", name)
}

const columns = `tenant_id, name, scope, description, version, created_by, updated_by, created_at, updated_at`

func scan(row pgx.Row) (Secret, error) {
	var s Secret
	var created, updated time.Time
	if err := row.Scan(&s.TenantID, &s.Name, &s.Scope, &s.Description, &s.Version, &s.CreatedBy, &s.UpdatedBy, &created, &updated); err != nil {
		return Secret{}, err
	}
	s.Ref = coresecrets.Ref(s.TenantID, s.Name)
	s.CreatedAt, s.UpdatedAt = created.UnixMilli(), updated.UnixMilli()
	return s, nil
}

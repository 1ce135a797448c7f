package iam

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// An approver key is an SSH public key registered for a person who may
// approve command batches (docs/command-batches.md): an approval is an
// SSHSIG signature made with the private half. Keys are registered on the
// admin surface, by the platform's operators, so no tenant administrator can
// mint approvers of its own; each change is on the tenant's audit chain.

// MaxApproverKeys bounds an identity's live approver keys.
const MaxApproverKeys = 8

// ApproverKey is a registered key (its public half only).
type ApproverKey struct {
	ID          string `json:"id"`
	TenantID    string `json:"tenantId"`
	IdentityID  string `json:"identityId"`
	Fingerprint string `json:"fingerprint"`
	PublicKey   string `json:"publicKey"`
	Comment     string `json:"comment,omitempty"`
	CreatedAt   int64  `json:"createdAt"`
}

// AddApproverKeyInput is the input of AddApproverKey: publicKey in
// authorized_keys form (ssh-ed25519 AAAA… comment).
type AddApproverKeyInput struct {
	TenantID   string `json:"tenantId"`
	IdentityID string `json:"identityId"`
	PublicKey  string `json:"publicKey"`
}

// ApproverKeyRef names a key of a tenant (RemoveApproverKey).
type ApproverKeyRef struct {
	TenantID string `json:"tenantId"`
	KeyID    string `json:"keyId"`
}

// ListApproverKeysInput is the input of ListApproverKeys; identityId
// narrows it to one identity.
type ListApproverKeysInput struct {
	TenantID   string `json:"tenantId"`
	IdentityID string `json:"identityId,omitempty"`
}

const approverKeyColumns = `id, tenant_id, identity_id, fingerprint, authorized_key, comment, created_at`

func scanApproverKey(row pgx.Row) (ApproverKey, error) {
	var k ApproverKey
	var at time.Time
	err := row.Scan(&k.ID, &k.TenantID, &k.IdentityID, &k.Fingerprint, &k.PublicKey, &k.Comment, &at)
	k.CreatedAt = at.UnixMilli()
	return k, err
}

// AddApproverKey registers a public key for a live person of the tenant.
// A key already registered (for anyone) is CONFLICT; a service or agent
// identity, or a disabled one, is INVALID_INPUT.
func (a *Admin) AddApproverKey(ctx context.Context, in AddApproverKeyInput) (ApproverKey, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return ApproverKey{}, err
	}
	if err := admIdentityID("identityId", in.IdentityID); err != nil {
		return ApproverKey{}, err
	}
	if len(in.PublicKey) > 16<<10 {
		return ApproverKey{}, admInvalid("publicKey", "publicKey is at most 16 KiB")
	}
	pub, comment, _, rest, err := ssh.ParseAuthorizedKey([]byte(in.PublicKey))
	if err != nil || len(strings.TrimSpace(string(rest))) > 0 {
		return ApproverKey{}, admInvalid("publicKey", "publicKey must be one SSH public key in authorized_keys form")
	}
	if _, isCert := pub.(*ssh.Certificate); isCert {
		return ApproverKey{}, admInvalid("publicKey", "publicKey must be a plain key, not a certificate")
	}
	if len(comment) > 200 {
		comment = comment[:200]
	}
	now := a.now()
	k := ApproverKey{ID: core.NewID("apk"), TenantID: in.TenantID, IdentityID: in.IdentityID,
		Fingerprint: ssh.FingerprintSHA256(pub), PublicKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))),
		Comment: comment, CreatedAt: now.UnixMilli()}
	err = a.change(ctx, func(tx store.Tx) ([]auditRecord, error) {
		var kind string
		var disabled *time.Time
		err := tx.QueryRow(ctx, `SELECT kind, disabled_at FROM iam_identities WHERE tenant_id = $1 AND id = $2`,
			in.TenantID, in.IdentityID).Scan(&kind, &disabled)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, admNotFound("identityId", "identity %q not found in tenant %q", in.IdentityID, in.TenantID)
		}
		if err != nil {
			return nil, err
		}
		if kind != KindPerson || disabled != nil {
			return nil, admInvalid("identityId", "approver keys are for live persons (identity %q is a %s%s)",
				in.IdentityID, kind, map[bool]string{true: ", disabled"}[disabled != nil])
		}
		var live int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM iam_approver_keys WHERE tenant_id = $1 AND identity_id = $2 AND removed_at IS NULL`,
			in.TenantID, in.IdentityID).Scan(&live); err != nil {
			return nil, err
		}
		if live >= MaxApproverKeys {
			return nil, admInvalid("identityId", "identity %q holds %d approver keys, the most it may", in.IdentityID, MaxApproverKeys)
		}
		_, err = tx.Exec(ctx, `INSERT INTO iam_approver_keys (id, tenant_id, identity_id, fingerprint, authorized_key, comment, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, k.ID, k.TenantID, k.IdentityID, k.Fingerprint, k.PublicKey, k.Comment, now)
		if admPgCode(err) == "23505" {
			return nil, core.Errorf(core.CodeConflict, "the key %s is already registered", k.Fingerprint).
				WithDetails(map[string]any{"field": "publicKey"})
		}
		if err != nil {
			return nil, err
		}
		return []auditRecord{a.record(ctx, in.TenantID, "addApproverKey", "iam-approver-key", k.ID, map[string]string{
			"identityId": k.IdentityID, "fingerprint": k.Fingerprint})}, nil
	})
	return k, err
}

// RemoveApproverKey removes a key: approvals it made stay recorded, and it
// approves nothing more.
func (a *Admin) RemoveApproverKey(ctx context.Context, in ApproverKeyRef) (ApproverKey, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return ApproverKey{}, err
	}
	var k ApproverKey
	err := a.change(ctx, func(tx store.Tx) ([]auditRecord, error) {
		var err error
		k, err = scanApproverKey(tx.QueryRow(ctx, `UPDATE iam_approver_keys SET removed_at = $3
			WHERE tenant_id = $1 AND id = $2 AND removed_at IS NULL RETURNING `+approverKeyColumns, in.TenantID, in.KeyID, a.now()))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, admNotFound("keyId", "approver key %q not found in tenant %q", in.KeyID, in.TenantID)
		}
		if err != nil {
			return nil, err
		}
		return []auditRecord{a.record(ctx, in.TenantID, "removeApproverKey", "iam-approver-key", k.ID, map[string]string{
			"identityId": k.IdentityID, "fingerprint": k.Fingerprint})}, nil
	})
	return k, err
}

// ListApproverKeys lists a tenant's live keys, oldest first.
func (a *Admin) ListApproverKeys(ctx context.Context, in ListApproverKeysInput) ([]ApproverKey, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return nil, err
	}
	if in.IdentityID != "" {
		if err := admIdentityID("identityId", in.IdentityID); err != nil {
			return nil, err
		}
	}
	return a.approverKeys(ctx, in.TenantID, in.IdentityID)
}

// ApproverKeys answers the live keys of a live person of the tenant (none
// for anyone else): what commandBatches.approve verifies a signature with.
func (a *Admin) ApproverKeys(ctx context.Context, tenantID, identityID string) ([]ApproverKey, error) {
	if identityID == "" {
		return nil, nil
	}
	return a.approverKeys(ctx, tenantID, identityID)
}

func (a *Admin) approverKeys(ctx context.Context, tenantID, identityID string) ([]ApproverKey, error) {
	rows, err := a.db.Pool.Query(ctx, `SELECT k.id, k.tenant_id, k.identity_id, k.fingerprint, k.authorized_key, k.comment, k.created_at
		FROM iam_approver_keys k JOIN iam_identities i ON i.tenant_id = k.tenant_id AND i.id = k.identity_id
		WHERE k.tenant_id = $1 AND ($2 = '' OR k.identity_id = $2) AND k.removed_at IS NULL
			AND i.disabled_at IS NULL AND i.kind = 'person'
		ORDER BY k.created_at, k.id`, tenantID, identityID)
	if err != nil {
		return nil, admDB(err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ApproverKey, error) { return scanApproverKey(r) })
	if err != nil {
		return nil, admDB(err)
	}
	return keys, nil
}

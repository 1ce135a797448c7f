package images

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hiddeco/sshsig"
	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
)

// Signer is one key of a signer allowlist: a tenant's, or the fleet's (the
// root tenant's rows).
type Signer struct {
	TenantID string `json:"tenantId"`
	// Fingerprint is as ssh-keygen prints it (SHA256:...).
	Fingerprint   string    `json:"fingerprint"`
	AuthorizedKey string    `json:"authorizedKey"`
	Comment       string    `json:"comment,omitempty"`
	CreatedAt     time.Time `json:"createdAt"`
}

// maxSignature bounds an armored signature: an SSH signature of any key
// type ssh-keygen makes is well under 2 KiB.
const maxSignature = 16 << 10

// parseSignature reads an armored SSH signature (ssh-keygen -Y sign's
// output); anything else is INVALID_INPUT naming the field signature.
func parseSignature(text string) (*sshsig.Signature, error) {
	bad := func(reason string) error {
		return core.Errorf(core.CodeInvalidInput, "signature must be an armored SSH signature (ssh-keygen -Y sign -n %s): %s",
			coreimages.SignatureNamespace, reason).WithDetails(map[string]any{"field": "signature", "reason": "malformed"})
	}
	if len(text) > maxSignature {
		return nil, bad("too long")
	}
	sig, err := sshsig.Unarmor([]byte(strings.TrimSpace(text)))
	if err != nil {
		return nil, bad(err.Error())
	}
	return sig, nil
}

// signedBy is the fingerprint of the key a signature names ("" without a
// signature).
func signedBy(text string) (string, error) {
	if text == "" {
		return "", nil
	}
	sig, err := parseSignature(text)
	if err != nil {
		return "", err
	}
	return ssh.FingerprintSHA256(sig.PublicKey), nil
}

// verify checks an image's signature over its bytes against the signers of
// its tenant and of the fleet, in tx (the signer row is read FOR SHARE, so
// a concurrent removal waits for this transaction, then unverifies what it
// verified). It answers the allowed signer's fingerprint, or "" when there
// is no signature, the key is on no allowlist, or the signature does not
// check out over these bytes (in this namespace): not an error.
func (m *Images) verify(ctx context.Context, tx store.Tx, tenantID, signature, sha256 string) (string, error) {
	if signature == "" {
		return "", nil
	}
	sig, err := parseSignature(signature)
	if err != nil {
		return "", err
	}
	fp := ssh.FingerprintSHA256(sig.PublicKey)
	var authorized string
	err = tx.QueryRow(ctx, `SELECT authorized_key FROM image_signers
		WHERE fingerprint = $1 AND tenant_id IN ($2, $3) ORDER BY tenant_id = $2 DESC LIMIT 1 FOR SHARE`,
		fp, tenantID, m.root).Scan(&authorized)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("images: reading the signers: %w", err)
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(authorized))
	if err != nil {
		return "", fmt.Errorf("images: signer %s: %w", fp, err)
	}
	obj, err := m.blobs.Open(ctx, blobs.Key{TenantID: tenantID, SHA256: sha256})
	if err != nil {
		return "", fmt.Errorf("images: opening the bytes to verify: %w", err)
	}
	defer obj.Close()
	if err := sshsig.Verify(ctxReader{ctx, obj}, sig, pub, sig.HashAlgorithm, coreimages.SignatureNamespace); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return "", nil
	}
	return fp, nil
}

// ctxReader stops a read once its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// signerTenant is the tenant whose allowlist "fleet" or a tenant id names.
func (m *Images) signerTenant(tenant string) (string, error) {
	switch tenant {
	case "":
		return "", core.Errorf(core.CodeInvalidInput, "a signer belongs to a tenant, or to the fleet")
	case "fleet":
		return m.root, nil
	}
	return tenant, nil
}

// AddSigner puts an authorized_keys line on the allowlist of tenant
// ("fleet": the fleet's), and verifies, in the same transaction, the
// available images that key had signed and that it may now verify (the
// tenant's, or every tenant's for a fleet signer). Adding a key that is
// there already changes nothing.
func (m *Images) AddSigner(ctx context.Context, tx store.Tx, tenant, authorizedKey string) (Signer, int, error) {
	tenantID, err := m.signerTenant(tenant)
	if err != nil {
		return Signer{}, 0, err
	}
	pub, comment, _, _, err := ssh.ParseAuthorizedKey([]byte(authorizedKey))
	if err != nil {
		return Signer{}, 0, core.Errorf(core.CodeInvalidInput, "key must be an authorized_keys line (ssh-ed25519 AAAA... comment): %v", err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
	fp := ssh.FingerprintSHA256(pub)
	var s Signer
	err = tx.QueryRow(ctx, `INSERT INTO image_signers (tenant_id, fingerprint, authorized_key, comment) VALUES ($1, $2, $3, $4)
		ON CONFLICT (tenant_id, fingerprint) DO UPDATE SET comment = image_signers.comment
		RETURNING tenant_id, fingerprint, authorized_key, comment, created_at`, tenantID, fp, line, comment).
		Scan(&s.TenantID, &s.Fingerprint, &s.AuthorizedKey, &s.Comment, &s.CreatedAt)
	if err != nil {
		return Signer{}, 0, fmt.Errorf("images: adding signer %s: %w", fp, err)
	}
	rows, err := tx.Query(ctx, `SELECT `+columns+`, signature FROM images
		WHERE signed_by = $1 AND NOT verified AND state = 'available' AND (tenant_id = $2 OR $2 = $3) ORDER BY id FOR UPDATE`,
		fp, tenantID, m.root)
	if err != nil {
		return Signer{}, 0, fmt.Errorf("images: %w", err)
	}
	type candidate struct {
		im  coreimages.Image
		sig string
	}
	cands, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
		var c candidate
		err := r.Scan(&c.im.ID, &c.im.TenantID, &c.im.Name, &c.im.Version, &c.im.Format, &c.im.SHA256, &c.im.SizeBytes,
			&c.im.Visibility, &c.im.State, &c.im.Verified, &c.im.SignerFingerprint, &c.im.Description,
			&c.im.CreatedAt, &c.im.UploadedAt, &c.im.PromotedAt, &c.sig)
		return c, err
	})
	if err != nil {
		return Signer{}, 0, fmt.Errorf("images: %w", err)
	}
	verified := 0
	for _, c := range cands {
		got, err := m.verify(ctx, tx, c.im.TenantID, c.sig, c.im.SHA256)
		if err != nil {
			return Signer{}, 0, err
		}
		if got == "" {
			continue
		}
		if err := m.setVerified(ctx, tx, c.im.ID, got); err != nil {
			return Signer{}, 0, err
		}
		verified++
	}
	return s, verified, nil
}

// ListSigners lists the allowlist of tenant ("fleet": the fleet's).
func (m *Images) ListSigners(ctx context.Context, tx store.Tx, tenant string) ([]Signer, error) {
	tenantID, err := m.signerTenant(tenant)
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT tenant_id, fingerprint, authorized_key, comment, created_at FROM image_signers
		WHERE tenant_id = $1 ORDER BY created_at, fingerprint`, tenantID)
	if err != nil {
		return nil, fmt.Errorf("images: listing signers: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Signer, error) {
		var s Signer
		err := r.Scan(&s.TenantID, &s.Fingerprint, &s.AuthorizedKey, &s.Comment, &s.CreatedAt)
		return s, err
	})
}

// RemoveSigner takes a key (its fingerprint, or an authorized_keys line)
// off the allowlist of tenant ("fleet": the fleet's) and, in the same
// transaction, makes every image it verified, and no remaining signer of
// the image's tenant or the fleet still verifies, verified: false, with
// its authorization row. It answers how many images it unverified; an
// unknown key is NOT_FOUND.
func (m *Images) RemoveSigner(ctx context.Context, tx store.Tx, tenant, key string) (int, error) {
	tenantID, err := m.signerTenant(tenant)
	if err != nil {
		return 0, err
	}
	fp := strings.TrimSpace(key)
	if !strings.HasPrefix(fp, "SHA256:") {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(key))
		if err != nil {
			return 0, core.Errorf(core.CodeInvalidInput, "key must be a fingerprint (SHA256:...) or an authorized_keys line: %v", err)
		}
		fp = ssh.FingerprintSHA256(pub)
	}
	tag, err := tx.Exec(ctx, `DELETE FROM image_signers WHERE tenant_id = $1 AND fingerprint = $2`, tenantID, fp)
	if err != nil {
		return 0, fmt.Errorf("images: removing signer %s: %w", fp, err)
	}
	if tag.RowsAffected() == 0 {
		return 0, core.Errorf(core.CodeNotFound, "signer %s not found", fp)
	}
	rows, err := tx.Query(ctx, `UPDATE images i SET verified = false, signer_fingerprint = '', updated_at = now()
		WHERE i.signer_fingerprint = $1 AND (i.tenant_id = $2 OR $2 = $3)
		  AND NOT EXISTS (SELECT 1 FROM image_signers s WHERE s.fingerprint = $1 AND s.tenant_id IN (i.tenant_id, $3))
		RETURNING `+prefixed, fp, tenantID, m.root)
	if err != nil {
		return 0, fmt.Errorf("images: unverifying the images of %s: %w", fp, err)
	}
	changed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (coreimages.Image, error) { return scan(r) })
	if err != nil {
		return 0, fmt.Errorf("images: %w", err)
	}
	for _, im := range changed {
		if err := m.putAuthz(ctx, tx, im); err != nil {
			return 0, err
		}
	}
	return len(changed), nil
}

// setVerified records that signer verified the image, with its
// authorization row.
func (m *Images) setVerified(ctx context.Context, tx store.Tx, id, signer string) error {
	im, err := scan(tx.QueryRow(ctx, `UPDATE images SET verified = $2 <> '', signer_fingerprint = $2, updated_at = now()
		WHERE id = $1 RETURNING `+columns, id, signer))
	if err != nil {
		return fmt.Errorf("images: recording the verification of %s: %w", id, err)
	}
	return m.putAuthz(ctx, tx, im)
}

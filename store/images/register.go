package images

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
)

// UploadPath is where an image's bytes are uploaded: PUT with the upload
// token as "Authorization: Bearer <token>" and the bytes as the body.
const UploadPath = "/api/compute/images/upload"

// UploadTokenPrefix starts every upload token.
const UploadTokenPrefix = "bcimgup_"

// Upload tells a caller how to upload a pending image's bytes. The token
// is shown once; only its SHA-256 is stored.
type Upload struct {
	Method    string `json:"method"`
	Path      string `json:"path"`
	Token     string `json:"token"`
	ExpiresAt int64  `json:"expiresAt"`
}

// Registered is images.register's answer: the image, and how to upload its
// bytes while it is pending.
type Registered struct {
	Image  coreimages.Image `json:"image"`
	Upload *Upload          `json:"upload,omitempty"`
}

// RegisterRequest is one images.register.
type RegisterRequest struct {
	TenantID    string
	Name        string
	Version     string
	Format      string
	SHA256      string
	SizeBytes   int64
	Signature   string
	Description string
	// IdempotencyKey, optional: a retry with it answers the image it made
	// (with a fresh upload token while it is pending); the key with
	// another request is CONFLICT.
	IdempotencyKey string
	By             string
}

func invalid(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

func (p RegisterRequest) check() error {
	switch {
	case !coreimages.ValidName(p.Name):
		return invalid("name", "pattern", "name must match %s", coreimages.NamePattern)
	case !coreimages.ValidVersion(p.Version):
		return invalid("version", "pattern", "version must match %s", coreimages.VersionPattern)
	case !slices.Contains(coreimages.Formats, p.Format):
		return invalid("format", "enum", "format must be one of %s", strings.Join(coreimages.Formats, ", "))
	case !coreimages.ValidSHA256(p.SHA256):
		return invalid("sha256", "pattern", "sha256 must be 64 lower-case hex digits")
	case p.SizeBytes < 0:
		return invalid("sizeBytes", "minimum", "sizeBytes must not be negative")
	}
	return nil
}

// digest is SHA-256 over the request's fields that make the image, each
// length-prefixed.
func (p RegisterRequest) digest() string {
	var b []byte
	for _, f := range []string{p.Name, p.Version, p.Format, p.SHA256, fmt.Sprint(p.SizeBytes), p.Signature, p.Description} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(f)))
		b = append(b, f...)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func (m *Images) ready() error {
	if m == nil || m.blobs == nil {
		return core.Errorf(core.CodeUnavailable, "no blob store is configured: start the server with --blob-dir")
	}
	return nil
}

// Register records an image of the tenant, pending, and answers how to
// upload its bytes; when the tenant's blob store already holds bytes of
// that digest and size, the image is available at once and its signature
// checked. Registering name@version again with the same digest, size,
// format and signature answers the image (a fresh upload token while it
// is pending); with anything else it is CONFLICT.
func (m *Images) Register(ctx context.Context, tx store.Tx, p RegisterRequest) (Registered, error) {
	if err := m.ready(); err != nil {
		return Registered{}, err
	}
	if err := p.check(); err != nil {
		return Registered{}, err
	}
	signer, err := signedBy(p.Signature)
	if err != nil {
		return Registered{}, err
	}
	digest := p.digest()
	if err := lock(ctx, tx, "image", p.TenantID, p.Name, p.Version); err != nil {
		return Registered{}, err
	}
	if p.IdempotencyKey != "" {
		if err := lock(ctx, tx, "image-key", p.TenantID, p.By, p.IdempotencyKey); err != nil {
			return Registered{}, err
		}
		var id, seen string
		err := tx.QueryRow(ctx, `SELECT id, request_digest FROM images WHERE tenant_id = $1 AND created_by = $2 AND idempotency_key = $3`,
			p.TenantID, p.By, p.IdempotencyKey).Scan(&id, &seen)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return Registered{}, fmt.Errorf("images: reading the idempotency key: %w", err)
		case seen != digest:
			return Registered{}, core.Errorf(core.CodeConflict, "idempotencyKey %q was used with another request", p.IdempotencyKey).
				WithDetails(map[string]any{"field": "idempotencyKey"})
		default:
			return m.again(ctx, tx, id)
		}
	}
	var id, format, sha, sig string
	var size int64
	err = tx.QueryRow(ctx, `SELECT id, format, sha256, size_bytes, signature FROM images WHERE tenant_id = $1 AND name = $2 AND version = $3`,
		p.TenantID, p.Name, p.Version).Scan(&id, &format, &sha, &size, &sig)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return Registered{}, fmt.Errorf("images: reading %s@%s: %w", p.Name, p.Version, err)
	case format == p.Format && sha == p.SHA256 && size == p.SizeBytes && sig == p.Signature:
		return m.again(ctx, tx, id)
	default:
		return Registered{}, core.Errorf(core.CodeConflict, "image %s@%s exists with other bytes or another signature; register another version",
			p.Name, p.Version).WithDetails(map[string]any{"reason": "exists", "imageId": id})
	}
	im, err := scan(tx.QueryRow(ctx, `INSERT INTO images
		(id, tenant_id, name, version, format, sha256, size_bytes, signature, signed_by, description, created_by, idempotency_key, request_digest)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING `+columns,
		core.NewID(IDPrefix), p.TenantID, p.Name, p.Version, p.Format, p.SHA256, p.SizeBytes, p.Signature, signer,
		p.Description, p.By, p.IdempotencyKey, digest))
	if err != nil {
		return Registered{}, fmt.Errorf("images: registering %s@%s: %w", p.Name, p.Version, err)
	}
	if err := m.putAuthz(ctx, tx, im); err != nil {
		return Registered{}, err
	}
	return m.again(ctx, tx, im.ID)
}

// again answers a registered image: available at once when its bytes are
// in the tenant's blob store, else with a fresh upload token.
func (m *Images) again(ctx context.Context, tx store.Tx, id string) (Registered, error) {
	im, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM images WHERE id = $1 FOR UPDATE`, id))
	if err != nil {
		return Registered{}, fmt.Errorf("images: reading %s: %w", id, err)
	}
	if im.State != coreimages.StatePending {
		return Registered{Image: im}, nil
	}
	info, err := m.blobs.Stat(ctx, blobs.Key{TenantID: im.TenantID, SHA256: im.SHA256})
	switch {
	case err == nil && info.Size == im.SizeBytes:
		im, err = m.makeAvailable(ctx, tx, im.ID)
		return Registered{Image: im}, err
	case err != nil && !errors.Is(err, blobs.ErrNotFound):
		return Registered{}, fmt.Errorf("images: %w", err)
	}
	token, err := newToken()
	if err != nil {
		return Registered{}, err
	}
	var expires time.Time
	if err := tx.QueryRow(ctx, `INSERT INTO image_uploads (token_hash, image_id, expires_at)
		VALUES ($1, $2, now() + make_interval(secs => $3)) RETURNING expires_at`,
		HashToken(token), im.ID, m.uploadTTL.Seconds()).Scan(&expires); err != nil {
		return Registered{}, fmt.Errorf("images: minting an upload token: %w", err)
	}
	// Expired tokens of the image go with each new one.
	if _, err := tx.Exec(ctx, `DELETE FROM image_uploads WHERE image_id = $1 AND expires_at <= now()`, im.ID); err != nil {
		return Registered{}, fmt.Errorf("images: %w", err)
	}
	return Registered{Image: im, Upload: &Upload{Method: "PUT", Path: UploadPath, Token: token, ExpiresAt: expires.UnixMilli()}}, nil
}

// makeAvailable makes the pending image available once its bytes are in
// the blob store: its signature is checked and its authorization row
// rewritten, in tx.
func (m *Images) makeAvailable(ctx context.Context, tx store.Tx, id string) (coreimages.Image, error) {
	var tenantID, sha, sig string
	if err := tx.QueryRow(ctx, `SELECT tenant_id, sha256, signature FROM images WHERE id = $1 FOR UPDATE`, id).
		Scan(&tenantID, &sha, &sig); err != nil {
		return coreimages.Image{}, fmt.Errorf("images: reading %s: %w", id, err)
	}
	signer, err := m.verify(ctx, tx, tenantID, sig, sha)
	if err != nil {
		return coreimages.Image{}, err
	}
	im, err := scan(tx.QueryRow(ctx, `UPDATE images SET state = 'available', verified = $2 <> '', signer_fingerprint = $2,
		uploaded_at = now(), updated_at = now() WHERE id = $1 RETURNING `+columns, id, signer))
	if err != nil {
		return coreimages.Image{}, fmt.Errorf("images: making %s available: %w", id, err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM image_uploads WHERE image_id = $1`, id); err != nil {
		return coreimages.Image{}, fmt.Errorf("images: %w", err)
	}
	return im, m.putAuthz(ctx, tx, im)
}

// newToken is a fresh upload token: the prefix and 32 random bytes.
func newToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("images: %w", err)
	}
	return UploadTokenPrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:])), nil
}

// HashToken is the stored form of an upload token.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// badToken is the one answer to an upload token that is unknown, expired,
// used, or of an image no longer pending: they are told apart by nothing.
func badToken() error {
	return core.Errorf(core.CodeUnauthn, "unknown or expired upload token")
}

// Uploading is the pending image an upload token may upload, read before
// the bytes are streamed (the token is consumed only by FinishUpload).
func (m *Images) Uploading(ctx context.Context, tx store.Tx, token string) (coreimages.Image, error) {
	if err := m.ready(); err != nil {
		return coreimages.Image{}, err
	}
	if !strings.HasPrefix(token, UploadTokenPrefix) {
		return coreimages.Image{}, badToken()
	}
	im, err := scan(tx.QueryRow(ctx, `SELECT `+prefixed+` FROM image_uploads u JOIN images i ON i.id = u.image_id
		WHERE u.token_hash = $1 AND u.expires_at > now() AND i.state = 'pending'`, HashToken(token)))
	if errors.Is(err, pgx.ErrNoRows) {
		return coreimages.Image{}, badToken()
	}
	if err != nil {
		return coreimages.Image{}, fmt.Errorf("images: reading the upload token: %w", err)
	}
	return im, nil
}

// PutBytes streams an upload's body into the tenant's blob store; bytes
// that do not match the image's digest and size are INVALID_INPUT, reason
// digestMismatch, and nothing is kept.
func (m *Images) PutBytes(ctx context.Context, im coreimages.Image, body io.Reader) error {
	if err := m.ready(); err != nil {
		return err
	}
	_, err := m.blobs.Put(ctx, blobs.Key{TenantID: im.TenantID, SHA256: im.SHA256}, im.SizeBytes, body)
	if errors.Is(err, blobs.ErrDigestMismatch) {
		return core.Errorf(core.CodeInvalidInput, "the uploaded bytes are not the %d bytes of SHA-256 %s that image %s was registered with",
			im.SizeBytes, im.SHA256, im.ID).WithDetails(map[string]any{"reason": "digestMismatch"})
	}
	if errors.Is(err, blobs.ErrBody) {
		return core.Wrap(core.CodeInvalidInput, err, "reading the uploaded bytes failed")
	}
	if err != nil {
		return fmt.Errorf("images: storing the bytes of %s: %w", im.ID, err)
	}
	return nil
}

// FinishUpload consumes the upload token once its image's bytes are in
// the blob store, checks the signature and makes the image available, in
// tx.
func (m *Images) FinishUpload(ctx context.Context, tx store.Tx, token string) (coreimages.Image, error) {
	im, err := m.Uploading(ctx, tx, token)
	if err != nil {
		return coreimages.Image{}, err
	}
	tag, err := tx.Exec(ctx, `DELETE FROM image_uploads WHERE token_hash = $1 AND expires_at > now()`, HashToken(token))
	if err != nil {
		return coreimages.Image{}, fmt.Errorf("images: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return coreimages.Image{}, badToken()
	}
	info, err := m.blobs.Stat(ctx, blobs.Key{TenantID: im.TenantID, SHA256: im.SHA256})
	if err != nil || info.Size != im.SizeBytes {
		return coreimages.Image{}, fmt.Errorf("images: the bytes of %s are not in the blob store: %w", im.ID, err)
	}
	return m.makeAvailable(ctx, tx, im.ID)
}

// Promote makes the tenant's available private image public: visible
// fleet-wide, and immutable from then on (a public image is never promoted
// again nor uploaded again). Another tenant's private image is NOT_FOUND.
func (m *Images) Promote(ctx context.Context, tx store.Tx, tenantID, id string) (coreimages.Image, error) {
	im, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM images WHERE id = $1 AND (tenant_id = $2 OR visibility = 'public') FOR UPDATE`,
		id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return coreimages.Image{}, NotFound(id)
	}
	if err != nil {
		return coreimages.Image{}, fmt.Errorf("images: reading %s: %w", id, err)
	}
	switch {
	case im.Visibility == coreimages.Public:
		return coreimages.Image{}, core.Errorf(core.CodeInvalidState, "image %s is public: it is immutable", id).
			WithDetails(map[string]any{"reason": "immutable", "visibility": im.Visibility})
	case im.State != coreimages.StateAvailable:
		return coreimages.Image{}, core.Errorf(core.CodeInvalidState, "image %s is %s: only an available image is promoted", id, im.State).
			WithDetails(map[string]any{"reason": "notAvailable", "state": im.State})
	}
	im, err = scan(tx.QueryRow(ctx, `UPDATE images SET visibility = 'public', promoted_at = now(), updated_at = now()
		WHERE id = $1 RETURNING `+columns, id))
	if err != nil {
		return coreimages.Image{}, fmt.Errorf("images: promoting %s: %w", id, err)
	}
	return im, m.putAuthz(ctx, tx, im)
}

// Filter narrows images.list; empty fields match everything.
type Filter struct {
	Name       string
	Visibility string
	Verified   *bool
}

// List reads the images tenantID sees (its own and the public ones) that
// the projection holds in its view, at most page.Fetch(), oldest first.
func List(ctx context.Context, tx store.Tx, typ, tenantID string, f Filter, page store.PageQuery) ([]coreimages.Image, error) {
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+prefixed+` FROM images i
		WHERE (i.tenant_id = $1 OR i.visibility = 'public') AND `+store.VisibleIn("i.id", "$1", "$2", true)+`
		  AND ($6 = '' OR i.name = $6) AND ($7 = '' OR i.visibility = $7) AND ($8::boolean IS NULL OR i.verified = $8)
		  AND (`+store.MsOf("i.created_at")+`, i.id) > ($4, $5)
		ORDER BY `+store.MsOf("i.created_at")+`, i.id LIMIT $3`,
		tenantID, typ, page.Fetch(), after.At, after.ID, f.Name, f.Visibility, f.Verified)
	if err != nil {
		return nil, fmt.Errorf("images: listing: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (coreimages.Image, error) { return scan(r) })
}

// lock takes a transaction advisory lock on the parts' key, so concurrent
// registrations of one name@version queue instead of racing.
func lock(ctx context.Context, tx store.Tx, parts ...string) error {
	key, err := json.Marshal(parts)
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, string(key)); err != nil {
		return fmt.Errorf("images: lock: %w", err)
	}
	return nil
}

// Package images is the images domain's store: the images table (signed,
// content-addressed artifacts named name@version), their one-time upload
// tokens and the signer allowlists, with the authorization rows that
// describe each image written in the same transaction. It is the only
// writer of images, image_uploads and image_signers.
//
// An image is visible to its own tenant, and once public to every tenant;
// another tenant's private image reads as NOT_FOUND exactly like a missing
// one, so no read tells whether it exists.
package images

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
)

// ResourceType is the catalog type an image is decided on; AuthzType its
// full name in authz_resources.
const (
	ResourceType = "image"
	AuthzType    = "compute-image"
)

// IDPrefix starts every image id.
const IDPrefix = "img"

// columns are the columns scan reads, in its order; instants in epoch
// milliseconds (store.MsOf), as the API answers them.
const columns = `id, tenant_id, name, version, format, sha256, size_bytes, visibility, state, verified,
	signer_fingerprint, description, (floor(extract(epoch FROM created_at) * 1000)::bigint),
	(floor(extract(epoch FROM uploaded_at) * 1000)::bigint), (floor(extract(epoch FROM promoted_at) * 1000)::bigint)`

// prefixed is columns qualified by the alias i.
const prefixed = `i.id, i.tenant_id, i.name, i.version, i.format, i.sha256, i.size_bytes, i.visibility, i.state, i.verified,
	i.signer_fingerprint, i.description, (floor(extract(epoch FROM i.created_at) * 1000)::bigint),
	(floor(extract(epoch FROM i.uploaded_at) * 1000)::bigint), (floor(extract(epoch FROM i.promoted_at) * 1000)::bigint)`

func scan(row pgx.Row) (coreimages.Image, error) {
	var im coreimages.Image
	err := row.Scan(&im.ID, &im.TenantID, &im.Name, &im.Version, &im.Format, &im.SHA256, &im.SizeBytes,
		&im.Visibility, &im.State, &im.Verified, &im.SignerFingerprint, &im.Description,
		&im.CreatedAt, &im.UploadedAt, &im.PromotedAt)
	return im, err
}

// NotFound is the error of an image that is missing or that the tenant may
// not see: the same for both.
func NotFound(ref string) error {
	return core.Errorf(core.CodeNotFound, "image %s not found", ref)
}

// Get reads the image id as tenantID sees it: its own, or a public one;
// anything else is NOT_FOUND.
func Get(ctx context.Context, tx store.DBTX, tenantID, id string) (coreimages.Image, error) {
	im, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM images
		WHERE id = $1 AND (tenant_id = $2 OR visibility = 'public')`, id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return coreimages.Image{}, NotFound(id)
	}
	if err != nil {
		return coreimages.Image{}, fmt.Errorf("images: reading %s: %w", id, err)
	}
	return im, nil
}

// Resolve finds the image a profile's reference names, as tenantID sees
// it: by id (its own or a public one), or by name and version (the
// tenant's own first, else a public one). A reference that is neither, or
// names nothing the tenant may see, is NOT_FOUND.
func Resolve(ctx context.Context, tx store.DBTX, tenantID string, ref coreimages.Ref) (coreimages.Image, error) {
	switch {
	case ref.ID != "" && ref.Name == "" && ref.Version == "":
		return Get(ctx, tx, tenantID, ref.ID)
	case ref.ID == "" && ref.Name != "" && ref.Version != "":
		name := ref.Name + "@" + ref.Version
		// Own first; among public ones of another tenant the oldest, so
		// the answer does not change when a later tenant publishes the
		// same name and version.
		im, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM images
			WHERE name = $2 AND version = $3 AND (tenant_id = $1 OR visibility = 'public')
			ORDER BY tenant_id = $1 DESC, created_at, id LIMIT 1`, tenantID, ref.Name, ref.Version))
		if errors.Is(err, pgx.ErrNoRows) {
			return coreimages.Image{}, NotFound(name)
		}
		if err != nil {
			return coreimages.Image{}, fmt.Errorf("images: resolving %s: %w", name, err)
		}
		return im, nil
	default:
		return coreimages.Image{}, core.Errorf(core.CodeNotFound, "an image reference names an id, or a name and a version")
	}
}

// Images is the images domain's writes: registration, upload, promotion
// and the signer allowlists, over the tenant's blobs.
type Images struct {
	blobs     blobs.Store
	root      string
	typ       string
	uploadTTL time.Duration
}

// DefaultUploadTTL is how long an upload token lasts.
const DefaultUploadTTL = time.Hour

// New is the domain over the blob store bs (nil: uploads and registrations
// answer UNAVAILABLE), in a deployment whose platform tenant is root (its
// signers are the fleet's, its images the fleet's), deciding on the
// authorization type typ (the catalog's full name of "image"); uploadTTL 0
// is DefaultUploadTTL.
func New(bs blobs.Store, root, typ string, uploadTTL time.Duration) *Images {
	if uploadTTL <= 0 {
		uploadTTL = DefaultUploadTTL
	}
	if typ == "" {
		typ = AuthzType
	}
	return &Images{blobs: bs, root: root, typ: typ, uploadTTL: uploadTTL}
}

// RootTenant is the platform's tenant, whose images are the fleet's.
func (m *Images) RootTenant() string { return m.root }

// authzRow is the image's authorization row: its visibility and verified
// attributes, and, once public, the wildcard that makes it resolve in
// every tenant's view (store.SharedWithAll).
func (m *Images) authzRow(im coreimages.Image) store.AuthzResource {
	r := store.AuthzResource{
		Type: m.typ, ID: im.ID, TenantID: im.TenantID,
		Attributes: map[string]any{"visibility": im.Visibility, "verified": im.Verified},
	}
	if im.Visibility == coreimages.Public {
		r.SharedWith = []string{store.SharedWithAll}
	}
	return r
}

// putAuthz writes the image's authorization row in tx.
func (m *Images) putAuthz(ctx context.Context, tx store.Tx, im coreimages.Image) error {
	return store.PutAuthzResource(ctx, tx, m.authzRow(im))
}

// Signature answers the armored signature text of the tenant's image id
// (public: what an agent checks the bytes against).
func Signature(ctx context.Context, tx store.DBTX, tenantID, id string) (string, error) {
	var sig string
	err := tx.QueryRow(ctx, `SELECT signature FROM images WHERE id = $1 AND tenant_id = $2`, id, tenantID).Scan(&sig)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", NotFound(id)
	}
	return sig, err
}

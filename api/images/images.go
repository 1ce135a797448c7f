// Package images describes the images.* methods (register, get, list,
// promote) and serves the upload of an image's bytes (PUT UploadPath,
// authorized by the one-time upload token images.register answers).
package images

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/images"
)

// Image is an image as the methods answer it.
type Image = coreimages.Image

// Registered is images.register's answer: the image, and while it is
// pending how to upload its bytes (a one-time token, shown once).
type Registered = domain.Registered

// ImageList is images.list's answer.
type ImageList struct {
	Items      []Image `json:"items"`
	NextCursor string  `json:"nextCursor,omitempty"`
}

// UploadPath is where a pending image's bytes are PUT.
const UploadPath = domain.UploadPath

// RegisterInput is images.register's input. A tenant image (the default
// scope) is decided on compute-tenant; a fleet image is the platform's,
// kept in the root tenant and decided on compute-fleet.
type RegisterInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	Scope     string `json:"scope,omitempty" jsonschema:"enum=tenant,enum=fleet" jsonschema_description:"tenant (the default): the tenant's own image, decided on compute-tenant; fleet: the platform's, in the root tenant, decided on compute-fleet."`
	Name      string `json:"name" jsonschema:"required,maxLength=64,pattern=^[a-z0-9]([a-z0-9._-]{0\\,62}[a-z0-9])?$"`
	Version   string `json:"version" jsonschema:"required,maxLength=64,pattern=^[A-Za-z0-9]([A-Za-z0-9._+-]{0\\,62}[A-Za-z0-9])?$"`
	Format    string `json:"format" jsonschema:"required,enum=raw,enum=qcow2,enum=iso,enum=binary"`
	SHA256    string `json:"sha256" jsonschema:"required,pattern=^[0-9a-f]{64}$" jsonschema_description:"The SHA-256 of the bytes, 64 lower-case hex digits."`
	SizeBytes int64  `json:"sizeBytes" jsonschema:"required,minimum=0"`
	// Signature is public: an armored SSH signature over the bytes.
	Signature      string `json:"signature,omitempty" jsonschema:"maxLength=16384" jsonschema_description:"An armored SSH signature of the bytes (ssh-keygen -Y sign -n better-compute-image -f key file); verified against the tenant's and the fleet's signers."`
	Description    string `json:"description,omitempty" jsonschema:"maxLength=1024"`
	IdempotencyKey string `json:"idempotencyKey,omitempty" id:"tenant"`
}

// ImageInput names one image.
type ImageInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ImageID  string `json:"imageId" jsonschema:"required" id:"img"`
}

// ListInput is images.list's input: the tenant's images and the public
// ones, oldest first, narrowed by the filters given.
type ListInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	Name       string `json:"name,omitempty" jsonschema:"maxLength=64,pattern=^[a-z0-9]([a-z0-9._-]{0\\,62}[a-z0-9])?$"`
	Visibility string `json:"visibility,omitempty" jsonschema:"enum=private,enum=public"`
	Verified   *bool  `json:"verified,omitempty"`
	rpc.ListInput
}

// The methods.
const (
	Register rpc.Ref[RegisterInput, Registered] = "images.register"
	Get      rpc.Ref[ImageInput, Image]         = "images.get"
	List     rpc.Ref[ListInput, ImageList]      = "images.list"
	Promote  rpc.Ref[ImageInput, Image]         = "images.promote"
)

// Scopes of images.register.
const (
	ScopeTenant = "tenant"
	ScopeFleet  = "fleet"
)

func scopeOf(s string) string {
	if s == "" {
		return ScopeTenant
	}
	return s
}

// domainOf is the images domain over the deployment's blob store (made
// per call: the registry builds descriptors from empty Deps).
func domainOf(d rpc.Deps) *domain.Images {
	typ := domain.AuthzType
	if d.Catalog != nil {
		typ = d.Catalog.FullName(domain.ResourceType)
	}
	return domain.New(d.Blobs, d.RootTenant, typ, 0)
}

// Methods describes the images.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	m := func() *domain.Images { return domainOf(d) }
	typ := func() string { return d.Catalog.FullName(domain.ResourceType) }
	return []rpc.Descriptor{
		&rpc.Method[RegisterInput, Registered]{Name: Register, Action: "compute:images:publish", DecidedOn: "compute-tenant or compute-fleet",
			Phase: "v0.2", Kind: core.KindMutation,
			DecideOn: func(_ context.Context, _ *rpc.Call, _ store.Tx, in RegisterInput) (string, error) {
				if scopeOf(in.Scope) == ScopeFleet {
					return "fleet", nil
				}
				return "tenant", nil
			},
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in RegisterInput) (Registered, error) {
				if scopeOf(in.Scope) == ScopeFleet && c.TenantID != d.RootTenant {
					return Registered{}, core.Errorf(core.CodeInvalidInput, "a fleet image belongs to the platform: register it in the root tenant").
						WithDetails(map[string]any{"field": "scope", "reason": "tenant"})
				}
				return m().Register(ctx, tx, domain.RegisterRequest{TenantID: c.TenantID, Name: in.Name, Version: in.Version,
					Format: in.Format, SHA256: in.SHA256, SizeBytes: in.SizeBytes, Signature: in.Signature,
					Description: in.Description, IdempotencyKey: in.IdempotencyKey, By: c.Caller.IdentityID})
			}},
		&rpc.Method[ImageInput, Image]{Name: Get, Action: "compute:images:read", DecidedOn: "compute-image",
			Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ImageInput) (Image, error) {
				return domain.Get(ctx, tx, c.TenantID, in.ImageID)
			}},
		// Oldest first: creation millisecond, then id.
		&rpc.Method[ListInput, ImageList]{Name: List, Action: "compute:images:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.2", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				rows, err := domain.List(ctx, tx, typ(), c.TenantID,
					domain.Filter{Name: in.Name, Visibility: in.Visibility, Verified: in.Verified}, q)
				return rpc.PageOf(rows, q, func(im Image) store.Key { return store.Key{At: im.CreatedAt, ID: im.ID} },
					func(im Image) iam.Resource { return d.Resource(domain.ResourceType, im.ID) },
					func(kept []Image, next string) any { return ImageList{Items: kept, NextCursor: next} }), err
			}},
		&rpc.Method[ImageInput, Image]{Name: Promote, Action: "compute:images:publish", DecidedOn: "compute-image",
			Phase: "v0.2", Kind: core.KindMutation, Refresh: true,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ImageInput) (Image, error) {
				return m().Promote(ctx, tx, c.TenantID, in.ImageID)
			}},
	}
}

// bearer is the token of an "Authorization: Bearer <token>" header.
func bearer(h string) string {
	if token, ok := strings.CutPrefix(h, "Bearer "); ok {
		return strings.TrimSpace(token)
	}
	return ""
}

// Upload serves PUT UploadPath: the body is the bytes of the pending
// image whose one-time upload token is the bearer token. The bytes stream
// into the tenant's blob store, which keeps them only when their SHA-256
// and size are the image's (else 400 INVALID_INPUT, reason digestMismatch,
// and the image stays pending); then, in one transaction, the token is
// spent, the signature checked and the image made available. The token is
// never logged, and only its SHA-256 is stored.
func Upload(d rpc.Deps) gin.HandlerFunc {
	m := domainOf(d)
	return func(c *gin.Context) {
		c.Header("Cache-Control", "no-store")
		ctx := c.Request.Context()
		token := bearer(c.GetHeader("Authorization"))
		if token == "" {
			httpx.WriteError(c, core.Errorf(core.CodeUnauthn, "an upload token is required (Authorization: Bearer <token>)"))
			return
		}
		if d.Store == nil {
			httpx.WriteError(c, core.Errorf(core.CodeUnavailable, "no database configured"))
			return
		}
		var im Image
		if err := d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
			im, err = m.Uploading(ctx, tx, token)
			return err
		}); err != nil {
			httpx.WriteError(c, err)
			return
		}
		if n := c.Request.ContentLength; n >= 0 && n != im.SizeBytes {
			c.Header("Connection", "close")
			httpx.WriteError(c, core.Errorf(core.CodeInvalidInput, "the body is %d bytes; image %s has %d", n, im.ID, im.SizeBytes).
				WithDetails(map[string]any{"reason": "digestMismatch"}))
			return
		}
		// The listener bounds a request's read to seconds; an image's
		// bytes take as long as the token lasts.
		if err := http.NewResponseController(c.Writer).SetReadDeadline(time.Now().Add(domain.DefaultUploadTTL)); err != nil {
			httpx.Logger(c).Warn("image upload: the listener's read deadline stays", "error", err.Error())
		}
		if err := m.PutBytes(ctx, im, c.Request.Body); err != nil {
			// The rest of a refused body is not read: the connection closes.
			c.Header("Connection", "close")
			httpx.WriteError(c, err)
			return
		}
		err := d.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			im, err = m.FinishUpload(ctx, tx, token)
			return err
		})
		if err != nil {
			httpx.WriteError(c, err)
			return
		}
		c.JSON(http.StatusOK, im)
	}
}

// UploadBytes PUTs an image's bytes to the API at baseURL as u (a
// register's answer) says: the client half of Upload. An error answer is
// a *core.Error with the server's code.
func UploadBytes(ctx context.Context, hc *http.Client, baseURL string, u domain.Upload, body io.Reader, size int64) (Image, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, u.Method, strings.TrimRight(baseURL, "/")+u.Path, body)
	if err != nil {
		return Image{}, err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Authorization", "Bearer "+u.Token)
	resp, err := hc.Do(req)
	if err != nil {
		return Image{}, fmt.Errorf("uploading the image: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, httpx.MaxBody))
	if err != nil {
		return Image{}, fmt.Errorf("uploading the image: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e httpx.ErrorBody
		if json.Unmarshal(raw, &e) == nil && e.Error != nil {
			return Image{}, e.Error
		}
		return Image{}, fmt.Errorf("uploading the image: HTTP %d", resp.StatusCode)
	}
	var im Image
	if err := json.Unmarshal(raw, &im); err != nil {
		return Image{}, fmt.Errorf("uploading the image: %w", err)
	}
	return im, nil
}

package agentgateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	metaldomain "github.com/better-compute/better-compute/store/metal"
)

// ImageForSite answers the image imageID when a workflow in flight on the
// node nodeID of the site siteID writes it, and an error otherwise (which
// the endpoint answers as NOT_FOUND, whatever it is). It runs in the
// endpoint's read-only transaction, after the site agent and the node
// were checked.
type ImageForSite func(ctx context.Context, tx store.Tx, siteID, nodeID, imageID string) (coreimages.Image, error)

// MountImages puts the site image endpoint on r (the API listener).
func (g *Gateway) MountImages(r gin.IRoutes) {
	r.GET(protocol.SiteImagePathPrefix+":imageId", g.handleSiteImage)
	r.HEAD(protocol.SiteImagePathPrefix+":imageId", g.handleSiteImage)
}

// imageNotFound is the one answer for an image the site may not fetch: a
// node of another site, a missing node, an image no workflow on the node
// writes, a pending one, and bytes not in the blob store are told apart
// by nothing.
func imageNotFound() error { return core.Errorf(core.CodeNotFound, "image not found") }

// handleSiteImage serves GET SiteImagePathPrefix + imageId + "?node=" +
// nodeId to the site agent that holds its site's boot lease: the bytes of
// an image a workflow in flight on that node of the site writes, with
// http.ServeContent (Range and If-Range honoured, so an interrupted fetch
// resumes; the ETag is the image's digest).
func (g *Gateway) handleSiteImage(c *gin.Context) {
	c.Header("Cache-Control", "no-store")
	ctx := c.Request.Context()
	if g.deps.ImageForSite == nil || g.deps.Blobs == nil || g.deps.Store == nil {
		httpx.WriteError(c, core.Errorf(core.CodeUnavailable, "the site image endpoint is not configured"))
		return
	}
	token, _ := strings.CutPrefix(c.GetHeader(protocol.SiteTokenHeader), "Bearer ")
	epoch, err := strconv.ParseInt(c.GetHeader(protocol.SiteEpochHeader), 10, 64)
	if err != nil {
		httpx.WriteError(c, badField(protocol.SiteEpochHeader, "invalid", "%s must be the boot lease's epoch", protocol.SiteEpochHeader))
		return
	}
	imageID, nodeID := c.Param("imageId"), c.Query("node")
	var im coreimages.Image
	var authErr error
	err = g.deps.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		a, err := g.siteHolder(ctx, tx, protocol.SiteAuth{Token: strings.TrimSpace(token), Epoch: epoch})
		if err != nil {
			authErr = err
			return err
		}
		n, err := metaldomain.NodeOfSite(ctx, tx, a.siteID, nodeID)
		if err != nil {
			return err
		}
		if im, err = g.deps.ImageForSite(ctx, tx, a.siteID, nodeID, imageID); err != nil {
			return err
		}
		// Whatever the check answered, only an available image the node's
		// tenant may see is served.
		if im.ID != imageID || im.State != coreimages.StateAvailable ||
			(im.TenantID != n.TenantID && im.Visibility != coreimages.Public) {
			return imageNotFound()
		}
		return nil
	})
	if authErr != nil {
		httpx.WriteError(c, authErr)
		return
	}
	if err != nil {
		if !errors.As(err, new(*core.Error)) {
			g.deps.Logger.Warn("site image refused", "imageId", imageID, "nodeId", nodeID, "error", err.Error())
		}
		httpx.WriteError(c, imageNotFound())
		return
	}
	obj, err := g.deps.Blobs.Open(ctx, blobs.Key{TenantID: im.TenantID, SHA256: im.SHA256})
	if err != nil {
		if !errors.Is(err, blobs.ErrNotFound) {
			g.deps.Logger.Warn("site image unreadable", "imageId", imageID, "error", err.Error())
		}
		httpx.WriteError(c, imageNotFound())
		return
	}
	defer obj.Close()
	if obj.Info().Size != im.SizeBytes {
		httpx.WriteError(c, imageNotFound())
		return
	}
	c.Header("Content-Type", "application/octet-stream")
	c.Header("ETag", `"sha256:`+im.SHA256+`"`)
	http.ServeContent(c.Writer, c.Request, "", obj.Info().ModTime, obj)
}

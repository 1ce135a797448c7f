package agentgateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"

	instancesact "github.com/better-compute/better-compute/activities/instances"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	"github.com/better-compute/better-compute/store/images"
	instancesdomain "github.com/better-compute/better-compute/store/instances"
	domain "github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/secrets"
)

// instancesFrame records a node's report of its instances, fenced like
// every write of the session, then (after the commit) signals each
// changed instance's workflow, best effort: a workflow that misses it
// reads the row at its next poll.
func (c *sessionConn) instancesFrame(ctx context.Context, epoch int64, f protocol.Instances) error {
	var changed []string
	err := c.g.inFencedTx(ctx, c.a.nodeID, epoch, func(tx store.Tx) (err error) {
		changed, err = instancesdomain.Observe(ctx, tx, c.a.nodeID, f.Full, f.Statuses)
		return err
	})
	if err != nil {
		if !errors.Is(err, errSuperseded) && ctx.Err() == nil {
			c.log.Warn("agent session: instances report refused", "error", err)
			return nil
		}
		return err
	}
	if c.g.deps.Temporal == nil {
		return nil
	}
	for _, id := range changed {
		if err := instancesact.Signal(ctx, c.g.deps.Temporal, id, instancesact.SignalStatus); err != nil {
			c.log.Warn("agent session: signalling an instance's workflow", "instance", id, "error", err)
		}
	}
	return nil
}

// instanceNotFound is the one answer for an instance the node may not
// read: another node's, a missing one, one with no user data.
func instanceNotFound(w http.ResponseWriter) {
	agentError(w, http.StatusNotFound, string(core.CodeNotFound), "instance not found")
}

// nodeOf authenticates a request of the agent listener by the node's
// client certificate, as the session does: a valid, unrevoked identity.
func (g *Gateway) nodeOf(w http.ResponseWriter, r *http.Request) (string, bool) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		agentError(w, http.StatusUnauthorized, string(core.CodeUnauthn), "a node certificate is required")
		return "", false
	}
	cert := r.TLS.VerifiedChains[0][0]
	nodeID, err := nodeca.NodeID(cert)
	if err != nil {
		agentError(w, http.StatusUnauthorized, string(core.CodeUnauthn), err.Error())
		return "", false
	}
	ok, err := domain.NodeIdentityValid(r.Context(), g.deps.Store.Pool, nodeID, nodeca.Serial(cert.SerialNumber))
	if err != nil {
		agentError(w, http.StatusServiceUnavailable, string(core.CodeUnavailable), "the identity check failed; retry")
		return "", false
	}
	if !ok {
		agentError(w, http.StatusForbidden, string(core.CodeAccessDenied), "the node certificate is revoked, expired or unknown")
		return "", false
	}
	return nodeID, true
}

// placedOn reads the live instance id placed on nodeID (its tenant and
// image), or reports it is not.
func placedOn(ctx context.Context, tx store.Tx, nodeID, id string) (tenantID, imageID string, err error) {
	err = tx.QueryRow(ctx, `SELECT tenant_id, image_id FROM instances
		WHERE id = $1 AND node_id = $2 AND state NOT IN ('draft', 'denied', 'deleted')`, id, nodeID).Scan(&tenantID, &imageID)
	return tenantID, imageID, err
}

// handleInstanceImage serves GET InstanceImagePath + instanceId to the
// node the instance is placed on: the image's bytes from the blob store,
// with http.ServeContent (ranges honoured, the ETag the image's digest).
func (g *Gateway) handleInstanceImage(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	nodeID, ok := g.nodeOf(w, r)
	if !ok {
		return
	}
	if g.deps.Blobs == nil {
		agentError(w, http.StatusServiceUnavailable, string(core.CodeUnavailable), "no blob store configured")
		return
	}
	ctx := r.Context()
	id := strings.TrimPrefix(r.URL.Path, protocol.InstanceImagePath)
	var im coreimages.Image
	err := g.deps.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		tenantID, imageID, err := placedOn(ctx, tx, nodeID, id)
		if err != nil {
			return err
		}
		im, err = images.Get(ctx, tx, tenantID, imageID)
		if err == nil && im.State != coreimages.StateAvailable {
			return imageNotFound()
		}
		return err
	})
	if err != nil {
		instanceNotFound(w)
		return
	}
	g.serveBlob(w, r, blobs.Key{TenantID: im.TenantID, SHA256: im.SHA256}, im.SizeBytes, "application/octet-stream", instanceNotFound)
}

// serveBlob answers key's bytes with http.ServeContent (ranges honoured,
// the ETag its digest), or notFound when the blob is missing or not of
// size.
func (g *Gateway) serveBlob(w http.ResponseWriter, r *http.Request, key blobs.Key, size int64, contentType string,
	notFound func(http.ResponseWriter)) {
	obj, err := g.deps.Blobs.Open(r.Context(), key)
	if err != nil {
		if !errors.Is(err, blobs.ErrNotFound) {
			g.deps.Logger.Warn("a blob is unreadable", "blob", key.String(), "error", err.Error())
		}
		notFound(w)
		return
	}
	defer obj.Close()
	if obj.Info().Size != size {
		notFound(w)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("ETag", `"sha256:`+key.SHA256+`"`)
	http.ServeContent(w, r, "", obj.Info().ModTime, obj)
}

// handleInstanceUserData answers GET InstanceUserDataPath + instanceId to
// the node the instance is placed on: its plain user data as is, or its
// secret:// reference resolved at that moment (recorded, in a read-write
// transaction); 404 when it has none.
func (g *Gateway) handleInstanceUserData(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	nodeID, ok := g.nodeOf(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	id := strings.TrimPrefix(r.URL.Path, protocol.InstanceUserDataPath)
	var value string
	var unavailable bool
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		tenantID, _, err := placedOn(ctx, tx, nodeID, id)
		if err != nil {
			return err
		}
		plain, ref, err := instancesdomain.UserData(ctx, tx, id)
		switch {
		case err != nil:
			return err
		case ref == "" && plain == "":
			return instancesdomain.ErrNoUserData
		case ref == "":
			value = plain
			return nil
		case g.deps.Secrets == nil:
			unavailable = true
			return core.Errorf(core.CodeUnavailable, "no secret store configured")
		}
		value, err = g.deps.Secrets.Resolve(ctx, tx, ref, secrets.Use{TenantID: tenantID, Purpose: "instance-user-data",
			IdentityKind: "node", IdentityID: nodeID, ResourceType: "instance", ResourceID: id})
		return err
	})
	if unavailable {
		agentError(w, http.StatusServiceUnavailable, string(core.CodeUnavailable), "no secret store configured")
		return
	}
	if err != nil {
		if !errors.As(err, new(*core.Error)) && !errors.Is(err, instancesdomain.ErrNoUserData) {
			g.deps.Logger.Warn("instance user data refused", "instance", id, "error", err.Error())
		}
		instanceNotFound(w)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write([]byte(value))
}

// handleInstanceEnv answers GET InstanceEnvPath + instanceId to the node
// the instance is placed on: its environment as a JSON object, each
// secret:// reference resolved at that moment (recorded, in a read-write
// transaction).
func (g *Gateway) handleInstanceEnv(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	nodeID, ok := g.nodeOf(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	id := strings.TrimPrefix(r.URL.Path, protocol.InstanceEnvPath)
	var env map[string]string
	var unavailable bool
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		tenantID, _, err := placedOn(ctx, tx, nodeID, id)
		if err != nil {
			return err
		}
		if env, err = instancesdomain.InstanceEnv(ctx, tx, id); err != nil {
			return err
		}
		for name, value := range env {
			if !instancesdomain.IsSecretRef(value) {
				continue
			}
			if g.deps.Secrets == nil {
				unavailable = true
				return core.Errorf(core.CodeUnavailable, "no secret store configured")
			}
			if env[name], err = g.deps.Secrets.Resolve(ctx, tx, value, secrets.Use{TenantID: tenantID, Purpose: "instance-env",
				IdentityKind: "node", IdentityID: nodeID, ResourceType: "instance", ResourceID: id}); err != nil {
				return err
			}
		}
		return nil
	})
	if unavailable {
		agentError(w, http.StatusServiceUnavailable, string(core.CodeUnavailable), "no secret store configured")
		return
	}
	if err != nil {
		if !errors.As(err, new(*core.Error)) && !errors.Is(err, pgx.ErrNoRows) {
			g.deps.Logger.Warn("instance env refused", "instance", id, "error", err.Error())
		}
		instanceNotFound(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(env)
}

package agentgateway

import (
	"net/http"
	"strings"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	coreimages "github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	"github.com/better-compute/better-compute/store/rollouts"
)

// handleReleaseArtifact serves GET ReleaseArtifactPath +
// "<releaseId>/<artifact>" to a joined node: the artifact's image bytes
// from the blob store, ranges honoured (an agent.update resumes a cut
// download). A release is the platform's build, not a secret, so any
// joined node may fetch any release's artifacts; the agent checks the
// bytes' digest and signature before it runs them.
func (g *Gateway) handleReleaseArtifact(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if _, ok := g.nodeOf(w, r); !ok {
		return
	}
	if g.deps.Blobs == nil {
		agentError(w, http.StatusServiceUnavailable, string(core.CodeUnavailable), "no blob store configured")
		return
	}
	releaseID, name, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, protocol.ReleaseArtifactPath), "/")
	if !ok || releaseID == "" || name == "" || strings.Contains(name, "/") {
		artifactNotFound(w)
		return
	}
	ctx := r.Context()
	var im coreimages.Image
	if err := g.deps.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		im, err = rollouts.ArtifactImage(ctx, tx, releaseID, name)
		return err
	}); err != nil {
		artifactNotFound(w)
		return
	}
	g.serveBlob(w, r, blobs.Key{TenantID: im.TenantID, SHA256: im.SHA256}, im.SizeBytes, "application/octet-stream", artifactNotFound)
}

func artifactNotFound(w http.ResponseWriter) {
	agentError(w, http.StatusNotFound, string(core.CodeNotFound), "no such release artifact")
}

package agentgateway

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	sandboxesact "github.com/better-compute/better-compute/activities/sandboxes"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	sandboxesdomain "github.com/better-compute/better-compute/store/sandboxes"
)

// maxSnapshotBytes bounds one sandbox snapshot's tar.
const maxSnapshotBytes = 64 << 30

// snapshotNotFound is the one answer for a snapshot the node may not
// touch: another node's, a missing one.
func snapshotNotFound(w http.ResponseWriter) {
	agentError(w, http.StatusNotFound, string(core.CodeNotFound), "sandbox snapshot not found")
}

// handleSnapshotPut takes PUT SandboxSnapshotPath + snapshotId from the
// node that was asked for it: the tar (of the declared size and
// X-Content-SHA256) goes into the blob store under the snapshot's tenant,
// then the snapshot is ready (store/sandboxes.SnapshotUploaded) and its
// sandbox's workflow told. A retry of a delivered one answers 204 again.
func (g *Gateway) handleSnapshotPut(w http.ResponseWriter, r *http.Request) {
	nodeID, ok := g.nodeOf(w, r)
	if !ok {
		return
	}
	if g.deps.Blobs == nil {
		agentError(w, http.StatusServiceUnavailable, string(core.CodeUnavailable), "no blob store configured")
		return
	}
	ctx := r.Context()
	id := strings.TrimPrefix(r.URL.Path, protocol.SandboxSnapshotPath)
	sum := strings.ToLower(r.Header.Get("X-Content-SHA256"))
	if r.ContentLength <= 0 || r.ContentLength > maxSnapshotBytes {
		agentError(w, http.StatusBadRequest, string(core.CodeInvalidInput), "a snapshot upload needs its Content-Length, at most 64 GiB")
		return
	}
	t, err := sandboxesdomain.SnapshotOnNode(ctx, g.deps.Store.Pool, nodeID, id)
	if err != nil {
		snapshotNotFound(w)
		return
	}
	if t.State == sandboxesdomain.SnapshotReady && t.SHA256 == sum {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if t.State != sandboxesdomain.SnapshotCreating {
		agentError(w, http.StatusConflict, string(core.CodeInvalidState), "the snapshot is "+t.State)
		return
	}
	// The listener's read timeout is for requests, not a tar of GiBs: the
	// caller is checked, so its body may take a minute plus 8 MiB/s.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(time.Minute + time.Duration(r.ContentLength/(8<<20))*time.Second))
	if _, err := g.deps.Blobs.Put(ctx, blobs.Key{TenantID: t.TenantID, SHA256: sum}, r.ContentLength, r.Body); err != nil {
		switch {
		case errors.Is(err, blobs.ErrDigestMismatch), errors.Is(err, blobs.ErrInvalidKey):
			agentError(w, http.StatusBadRequest, string(core.CodeInvalidInput), err.Error())
		default:
			g.deps.Logger.Warn("sandbox snapshot upload", "snapshot", id, "error", err.Error())
			agentError(w, http.StatusServiceUnavailable, string(core.CodeUnavailable), "the upload failed; retry")
		}
		return
	}
	g.recordSnapshot(w, r, func(tx store.Tx) (sandboxesdomain.SnapshotTarget, error) {
		return sandboxesdomain.SnapshotUploaded(ctx, tx, nodeID, id, sum, r.ContentLength)
	}, func(w http.ResponseWriter, err error) {
		agentError(w, http.StatusConflict, string(core.CodeInvalidState), err.Error())
	})
}

// handleSnapshotFailure takes POST SandboxSnapshotFailurePath + snapshotId:
// the node could not take it (the body says why).
func (g *Gateway) handleSnapshotFailure(w http.ResponseWriter, r *http.Request) {
	nodeID, ok := g.nodeOf(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	id := strings.TrimPrefix(r.URL.Path, protocol.SandboxSnapshotFailurePath)
	reason, _ := io.ReadAll(io.LimitReader(r.Body, 1024))
	g.recordSnapshot(w, r, func(tx store.Tx) (sandboxesdomain.SnapshotTarget, error) {
		return sandboxesdomain.SnapshotFailedOnNode(ctx, tx, nodeID, id, strings.ToValidUTF8(string(reason), "?"))
	}, func(w http.ResponseWriter, _ error) { snapshotNotFound(w) })
}

// recordSnapshot runs a node's report of a snapshot in one transaction,
// then tells its sandbox's workflow and answers 204; a refusal of the
// domain's is answered by refused, any other failure asks for a retry.
func (g *Gateway) recordSnapshot(w http.ResponseWriter, r *http.Request, record func(store.Tx) (sandboxesdomain.SnapshotTarget, error),
	refused func(http.ResponseWriter, error)) {
	var t sandboxesdomain.SnapshotTarget
	err := g.deps.Store.InTx(r.Context(), store.ReadWrite, func(tx store.Tx) (err error) {
		t, err = record(tx)
		return err
	})
	if err != nil {
		if errors.As(err, new(*core.Error)) {
			refused(w, err)
			return
		}
		agentError(w, http.StatusServiceUnavailable, string(core.CodeUnavailable), "recording the snapshot failed; retry")
		return
	}
	g.signalSandbox(r, t.SandboxID)
	w.WriteHeader(http.StatusNoContent)
}

// handleSnapshotGet serves GET SandboxSnapshotPath + snapshotId to a node
// that runs a workload restored from it (store/sandboxes.RestoreBlob).
func (g *Gateway) handleSnapshotGet(w http.ResponseWriter, r *http.Request) {
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
	id := strings.TrimPrefix(r.URL.Path, protocol.SandboxSnapshotPath)
	b, size, err := sandboxesdomain.RestoreBlob(ctx, g.deps.Store.Pool, nodeID, id)
	if err != nil {
		snapshotNotFound(w)
		return
	}
	g.serveBlob(w, r, blobs.Key{TenantID: b.TenantID, SHA256: b.SHA256}, size, "application/x-tar", snapshotNotFound)
}

// signalSandbox tells a sandbox's workflow that one of its snapshots
// ended, best effort: its next step reads the row anyway.
func (g *Gateway) signalSandbox(r *http.Request, sandboxID string) {
	if g.deps.Temporal == nil {
		return
	}
	if err := sandboxesact.Signal(r.Context(), g.deps.Temporal, sandboxID); err != nil {
		g.deps.Logger.Warn("signalling a sandbox's workflow", "sandbox", sandboxID, "error", err.Error())
	}
}

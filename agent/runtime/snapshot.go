package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
)

// A snapshot tar holds rootfs/ (the container's root filesystem) and, for
// a memory snapshot, checkpoint/ (runsc's checkpoint image).
const (
	snapRootfs     = "rootfs"
	snapCheckpoint = "checkpoint"
)

func (r *Runtime) snapshotsDir() string { return filepath.Join(r.o.StateDir, "snapshots") }

// SnapshotPath is where a snapshot's tar is kept: written by Checkpoint,
// fetched there for a restore.
func (r *Runtime) SnapshotPath(snapshotID string) string {
	return filepath.Join(r.snapshotsDir(), snapshotID+".tar")
}

// Checkpoint writes a snapshot of a running container or gvisor instance
// to one tar (SnapshotPath) and answers its path, SHA-256 and size. With
// includeMemory (gvisor only: runc has no CRIU here) it holds runsc's
// checkpoint image, taken with --leave-running, and the rootfs; without,
// the rootfs alone. The rootfs is copied live, right after the
// checkpoint (runsc cannot checkpoint a paused sandbox). The seed's
// user-data, a secret, is left out.
func (r *Runtime) Checkpoint(ctx context.Context, instanceID, snapshotID string, includeMemory bool) (string, string, int64, error) {
	if !idPattern.MatchString(snapshotID) {
		return "", "", 0, fmt.Errorf("snapshot id %q is not a safe name", snapshotID)
	}
	rt, err := r.runningContainer(ctx, instanceID)
	if err != nil {
		return "", "", 0, err
	}
	if includeMemory && rt.kind != KindGVisor {
		return "", "", 0, fmt.Errorf("instance %s: a memory snapshot needs the gvisor runtime (runc has no CRIU here)", instanceID)
	}
	if err := os.MkdirAll(r.snapshotsDir(), 0o700); err != nil {
		return "", "", 0, err
	}
	work, err := os.MkdirTemp(r.snapshotsDir(), ".work-*")
	if err != nil {
		return "", "", 0, err
	}
	defer os.RemoveAll(work)
	tarArgs := []string{"--numeric-owner", "--xattrs", "--exclude=" + snapRootfs + "/" + SeedDir + "/user-data",
		"--exclude=.gvisor.filestore.*", "-C", r.instanceDir(instanceID), snapRootfs}
	if includeMemory {
		img := filepath.Join(work, snapCheckpoint)
		if err := os.Mkdir(img, 0o700); err != nil {
			return "", "", 0, err
		}
		if _, err := rt.run(ctx, "checkpoint", "--image-path", img, "--leave-running", instanceID); err != nil {
			return "", "", 0, err
		}
		tarArgs = append(tarArgs, "-C", work, snapCheckpoint)
	}
	tmp := filepath.Join(work, "snapshot.tar")
	if out, err := exec.CommandContext(ctx, "tar", append([]string{"-cf", tmp}, tarArgs...)...).CombinedOutput(); err != nil {
		return "", "", 0, fmt.Errorf("tar: %w: %s", err, bytes.TrimSpace(out))
	}
	sum, size, err := fileSHA256(tmp)
	if err != nil {
		return "", "", 0, err
	}
	path := r.SnapshotPath(snapshotID)
	if err := os.Rename(tmp, path); err != nil {
		return "", "", 0, err
	}
	r.log.Info("runtime: snapshot written", "instance", instanceID, "snapshot", snapshotID, "memory", includeMemory, "bytes", size)
	return path, sum, size, nil
}

// runningContainer answers the OCI runtime of a container or gvisor
// instance running on this node, or why there is none.
func (r *Runtime) runningContainer(ctx context.Context, instanceID string) (ociRuntime, error) {
	if !idPattern.MatchString(instanceID) {
		return ociRuntime{}, fmt.Errorf("instance id %q is not a safe name", instanceID)
	}
	kept, err := r.readKept(instanceID)
	if err != nil {
		return ociRuntime{}, fmt.Errorf("instance %s is not on this node", instanceID)
	}
	if kept.Runtime != KindContainer && kept.Runtime != KindGVisor {
		return ociRuntime{}, fmt.Errorf("instance %s: runtime %q; this needs a container runtime (container or gvisor)", instanceID, kept.Runtime)
	}
	rt := r.oci(kept.Runtime)
	s, ok, err := r.containerState(ctx, rt, instanceID)
	if err != nil {
		return ociRuntime{}, err
	}
	if !ok || s.Status != runcRunning {
		return ociRuntime{}, fmt.Errorf("instance %s is not running on this node", instanceID)
	}
	return rt, nil
}

func fileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// UploadSnapshot PUTs a snapshot's tar to the agent endpoint
// (protocol.SandboxSnapshotPath + snapshotID) with the node's mutual-TLS
// client, its SHA-256 in X-Content-SHA256.
func (r *Runtime) UploadSnapshot(ctx context.Context, client *http.Client, endpoint, snapshotID, path string) error {
	if client == nil || endpoint == "" {
		return fmt.Errorf("no agent endpoint")
	}
	sum, size, err := fileSHA256(path)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, strings.TrimRight(endpoint, "/")+protocol.SandboxSnapshotPath+snapshotID, f)
	if err != nil {
		return err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/x-tar")
	req.Header.Set("X-Content-SHA256", sum)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("snapshot %s upload: %w", snapshotID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("snapshot %s upload: HTTP %d: %s", snapshotID, resp.StatusCode, bytes.TrimSpace(b))
	}
	return nil
}

// fetchSnapshot answers the kept tar of in's snapshot, fetched from the
// agent endpoint when none with the spec's digest is kept.
func (r *Runtime) fetchSnapshot(ctx context.Context, in nodespec.Instance) (string, error) {
	rs := in.Restore
	if !idPattern.MatchString(rs.SnapshotID) {
		return "", fmt.Errorf("snapshot id %q is not a safe name", rs.SnapshotID)
	}
	digest := strings.ToLower(strings.TrimPrefix(rs.SHA256, "sha256:"))
	if !sha256Pattern.MatchString(digest) {
		return "", fmt.Errorf("snapshot %s: sha256 %q is not a hex SHA-256", rs.SnapshotID, rs.SHA256)
	}
	path := r.SnapshotPath(rs.SnapshotID)
	m := r.imageLock("snapshot:" + rs.SnapshotID)
	m.Lock()
	defer m.Unlock()
	if sum, _, err := fileSHA256(path); err == nil && sum == digest {
		return path, nil
	}
	n, err := r.download(ctx, protocol.SandboxSnapshotPath+rs.SnapshotID, path, digest, rs.SizeBytes)
	if err != nil {
		return "", fmt.Errorf("snapshot %s: %w", rs.SnapshotID, err)
	}
	r.log.Info("runtime: snapshot fetched", "snapshot", rs.SnapshotID, "sha256", digest, "bytes", n)
	return path, nil
}

// prepareRestore makes in's rootfs from its snapshot, once per snapshot
// digest (rootfs.sha256 says which), and answers the directory of the
// checkpoint image to restore ("" for a disk snapshot, or once the memory
// was restored: a later start boots the rootfs).
func (r *Runtime) prepareRestore(ctx context.Context, rt ociRuntime, in nodespec.Instance) (string, error) {
	if in.Restore.Memory && rt.kind != KindGVisor {
		return "", fmt.Errorf("snapshot %s: a memory snapshot restores only into the gvisor runtime", in.Restore.SnapshotID)
	}
	dir := r.instanceDir(in.ID)
	marker := filepath.Join(dir, "rootfs.sha256")
	want := "snapshot:" + strings.ToLower(strings.TrimPrefix(in.Restore.SHA256, "sha256:"))
	checkpoint := filepath.Join(dir, snapCheckpoint)
	if b, err := os.ReadFile(marker); err == nil && strings.TrimSpace(string(b)) == want {
		if _, err := os.Stat(r.rootfsDir(in.ID)); err == nil {
			if _, err := os.Stat(checkpoint); err == nil && in.Restore.Memory {
				return checkpoint, nil
			}
			return "", nil
		}
	}
	tarPath, err := r.fetchSnapshot(ctx, in)
	if err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, "restore.tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if out, err := exec.CommandContext(ctx, "tar", "-xf", tarPath, "--numeric-owner", "--xattrs", "-C", tmp).CombinedOutput(); err != nil {
		return "", fmt.Errorf("snapshot %s: tar: %w: %s", in.Restore.SnapshotID, err, bytes.TrimSpace(out))
	}
	if _, err := os.Stat(filepath.Join(tmp, snapRootfs)); err != nil {
		return "", fmt.Errorf("snapshot %s holds no rootfs", in.Restore.SnapshotID)
	}
	_, err = os.Stat(filepath.Join(tmp, snapCheckpoint))
	hasMemory := err == nil
	if in.Restore.Memory && !hasMemory {
		return "", fmt.Errorf("snapshot %s holds no memory image", in.Restore.SnapshotID)
	}
	for _, p := range []string{r.rootfsDir(in.ID), checkpoint} {
		if err := os.RemoveAll(p); err != nil {
			return "", err
		}
	}
	if err := os.Rename(filepath.Join(tmp, snapRootfs), r.rootfsDir(in.ID)); err != nil {
		return "", err
	}
	if in.Restore.Memory {
		if err := os.Rename(filepath.Join(tmp, snapCheckpoint), checkpoint); err != nil {
			return "", err
		}
	} else {
		checkpoint = ""
	}
	if err := writeFileAtomic(marker, []byte(want+"\n"), 0o600); err != nil {
		return "", err
	}
	return checkpoint, nil
}

// takeSnapshots takes each snapshot the spec asks of the running instance
// in that this node has not sent yet: Checkpoint, then UploadSnapshot to
// the agent endpoint, then the tar is removed (the control plane keeps
// it). A marker (<id>.sent) keeps a restarted agent from taking one
// twice. A checkpoint that fails is reported (SandboxSnapshotFailurePath)
// and not tried again; an upload that fails is tried again at the next
// step (the control plane bounds how long it waits).
func (r *Runtime) takeSnapshots(ctx context.Context, in nodespec.Instance) {
	for _, s := range in.Snapshots {
		if !idPattern.MatchString(s.ID) {
			r.log.Error("runtime: a snapshot id is not a safe name", "instance", in.ID, "snapshot", s.ID)
			continue
		}
		marker := filepath.Join(r.snapshotsDir(), s.ID+".sent")
		if _, err := os.Stat(marker); err == nil {
			continue
		}
		path, _, _, err := r.Checkpoint(ctx, in.ID, s.ID, s.Memory)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.log.Error("runtime: a snapshot failed", "instance", in.ID, "snapshot", s.ID, "error", err)
			if rerr := r.reportSnapshotFailure(ctx, s.ID, err.Error()); rerr != nil {
				r.log.Warn("runtime: reporting a failed snapshot", "snapshot", s.ID, "error", rerr)
				continue
			}
		} else {
			if err := r.UploadSnapshot(ctx, r.o.Client, r.o.Endpoint, s.ID, path); err != nil {
				r.log.Warn("runtime: uploading a snapshot; tried again at the next step", "snapshot", s.ID, "error", err)
				continue
			}
			_ = os.Remove(path)
		}
		if err := writeFileAtomic(marker, nil, 0o600); err != nil {
			r.log.Warn("runtime: marking a snapshot sent", "snapshot", s.ID, "error", err)
		}
	}
}

// reportSnapshotFailure tells the control plane the node could not take
// snapshotID.
func (r *Runtime) reportSnapshotFailure(ctx context.Context, snapshotID, reason string) error {
	if r.o.Client == nil || r.o.Endpoint == "" {
		return fmt.Errorf("no agent endpoint")
	}
	if len(reason) > 1024 {
		reason = reason[:1024]
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		strings.TrimRight(r.o.Endpoint, "/")+protocol.SandboxSnapshotFailurePath+snapshotID, strings.NewReader(reason))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "text/plain")
	resp, err := r.o.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

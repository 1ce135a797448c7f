package runtime

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/better-compute/better-compute/agent/nodespec"
)

// Sandbox volumes (docs/sandboxes.md, "Volumes"): each volume the NodeSpec
// lists is a sparse image file of its size, formatted ext4, under
// <StateDir>/volumes/<id>/disk.img, loop-mounted on
// <StateDir>/volumes/<id>/mnt; instances that mount it get a bind mount of
// that directory (read-only when asked), so what one writes the next
// reads, whoever ran before. A larger size grows the image in place, mounted
// (truncate, losetup -c, resize2fs; offline while nothing mounts it where
// the agent lacks CAP_SYS_RESOURCE). A volume that left the spec is
// unmounted and removed once no instance kept on the node mounts it. Loop
// devices are needed (losetup); without them a volume fails its mounting
// instances with the mount's error.

// volumeState is the volumes the spec lists and the one worker that
// converges them; the mutex serialises every change of a volume's image.
type volumeState struct {
	mu      sync.Mutex
	desired map[string]nodespec.Volume // under the Runtime's mu
	kicks   chan struct{}
	started bool // the worker runs (under the Runtime's mu)
}

func (r *Runtime) volumesDir() string           { return filepath.Join(r.o.StateDir, "volumes") }
func (r *Runtime) volumeImage(id string) string { return filepath.Join(r.volumesDir(), id, "disk.img") }
func (r *Runtime) volumeMount(id string) string { return filepath.Join(r.volumesDir(), id, "mnt") }

// setVolumesLocked records the spec's volumes (r.mu held).
func (r *Runtime) setVolumesLocked(vs []nodespec.Volume) {
	if r.vols == nil {
		r.vols = &volumeState{kicks: make(chan struct{}, 1)}
	}
	r.vols.desired = make(map[string]nodespec.Volume, len(vs))
	for _, v := range vs {
		r.vols.desired[v.ID] = v
	}
}

// kickVolumes wakes the volumes' worker, starting it if it has none.
func (r *Runtime) kickVolumes() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx == nil || r.ctx.Err() != nil || r.vols == nil {
		return
	}
	select {
	case r.vols.kicks <- struct{}{}:
	default:
	}
	if !r.vols.started {
		r.vols.started = true
		r.wg.Add(1)
		go r.volumesWork(r.ctx, r.vols.kicks)
	}
}

func (r *Runtime) volumesWork(ctx context.Context, kicks chan struct{}) {
	defer r.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kicks:
		}
		if err := r.convergeVolumes(ctx); err != nil && ctx.Err() == nil {
			r.log.Error("runtime: volumes", "error", err)
		}
	}
}

// convergeVolumes makes every listed volume (at its size, mounted) and
// removes the unlisted ones no kept instance mounts.
func (r *Runtime) convergeVolumes(ctx context.Context) error {
	r.mu.Lock()
	desired := make(map[string]nodespec.Volume, len(r.vols.desired))
	for id, v := range r.vols.desired {
		desired[id] = v
	}
	r.mu.Unlock()
	var errs []error
	for _, v := range desired {
		if err := r.ensureVolume(ctx, v, ""); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", v.ID, err))
		}
	}
	ents, err := os.ReadDir(r.volumesDir())
	if errors.Is(err, os.ErrNotExist) {
		return errors.Join(errs...)
	}
	if err != nil {
		return err
	}
	mounted := r.mountedVolumes("")
	for _, e := range ents {
		id := e.Name()
		if _, want := desired[id]; want || mounted[id] || !idPattern.MatchString(id) {
			continue
		}
		if err := r.removeVolume(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// mountedVolumes are the volumes the instances kept on the node (but
// except) mount (their kept spec), whether or not they still run.
func (r *Runtime) mountedVolumes(except string) map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir(r.instancesDir())
	for _, e := range ents {
		if e.Name() == except {
			continue
		}
		in, err := r.readKept(e.Name())
		if err != nil {
			continue
		}
		for _, m := range in.Mounts {
			out[m.VolumeID] = true
		}
	}
	return out
}

// ensureVolume makes v's image (sparse, ext4) when it has none, mounts
// it, and grows it to v's size: online (losetup -c, resize2fs on the
// mounted filesystem, which needs CAP_SYS_RESOURCE), else offline while no
// kept instance mounts it (unmount, e2fsck, resize2fs, mount again), but
// starting (the instance whose start asks, not running yet). The size file
// records the GiB the filesystem spans.
func (r *Runtime) ensureVolume(ctx context.Context, v nodespec.Volume, starting string) error {
	if !idPattern.MatchString(v.ID) || v.SizeGiB < 1 {
		return fmt.Errorf("volume %q of %d GiB is not a safe name and size", v.ID, v.SizeGiB)
	}
	r.vols.mu.Lock()
	defer r.vols.mu.Unlock()
	img, mnt := r.volumeImage(v.ID), r.volumeMount(v.ID)
	sizeFile := filepath.Join(r.volumesDir(), v.ID, "size")
	size := int64(v.SizeGiB) << 30
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return err
	}
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		// Made aside and renamed: a crash never leaves a half-made image.
		tmp := img + ".new"
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		err = f.Truncate(size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if err := runCmd(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", tmp); err != nil {
			return err
		}
		if err := writeFileAtomic(sizeFile, []byte(strconv.Itoa(v.SizeGiB)), 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, img); err != nil {
			return err
		}
		r.log.Info("runtime: volume made", "volume", v.ID, "sizeGiB", v.SizeGiB)
	} else if err != nil {
		return err
	}
	if !isMountPoint(mnt) {
		if err := runCmd(ctx, "mount", "-o", "loop", img, mnt); err != nil {
			return err
		}
	}
	b, _ := os.ReadFile(sizeFile)
	if spans, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && spans >= v.SizeGiB {
		return nil
	}
	if st, err := os.Stat(img); err != nil {
		return err
	} else if st.Size() < size {
		if err := os.Truncate(img, size); err != nil {
			return err
		}
	}
	if err := r.growOnline(ctx, img); err != nil {
		if r.mountedVolumes(starting)[v.ID] {
			return fmt.Errorf("growing to %d GiB: %w; it grows once no instance mounts it", v.SizeGiB, err)
		}
		if err := growOffline(ctx, img, mnt); err != nil {
			return fmt.Errorf("growing to %d GiB: %w", v.SizeGiB, err)
		}
	}
	if err := writeFileAtomic(sizeFile, []byte(strconv.Itoa(v.SizeGiB)), 0o600); err != nil {
		return err
	}
	r.log.Info("runtime: volume grown", "volume", v.ID, "sizeGiB", v.SizeGiB)
	return nil
}

// growOnline grows the mounted filesystem of img to the image's size.
func (r *Runtime) growOnline(ctx context.Context, img string) error {
	dev, err := loopDevice(ctx, img)
	if err != nil {
		return err
	}
	if err := runCmd(ctx, "losetup", "-c", dev); err != nil {
		return err
	}
	return runCmd(ctx, "resize2fs", dev)
}

// growOffline unmounts img, checks and grows its filesystem, and mounts
// it again.
func growOffline(ctx context.Context, img, mnt string) error {
	if err := runCmd(ctx, "umount", mnt); err != nil {
		return err
	}
	var errs []error
	// e2fsck exits 1 when it corrected something: still clean for resize2fs.
	if out, err := exec.CommandContext(ctx, "e2fsck", "-f", "-y", img).CombinedOutput(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() > 1 {
			errs = append(errs, fmt.Errorf("e2fsck: %w: %s", err, bytes.TrimSpace(out)))
		}
	}
	if len(errs) == 0 {
		if err := runCmd(ctx, "resize2fs", img); err != nil {
			errs = append(errs, err)
		}
	}
	if err := runCmd(ctx, "mount", "-o", "loop", img, mnt); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeVolume unmounts id's image and deletes it.
func (r *Runtime) removeVolume(ctx context.Context, id string) error {
	r.vols.mu.Lock()
	defer r.vols.mu.Unlock()
	if mnt := r.volumeMount(id); isMountPoint(mnt) {
		if err := runCmd(ctx, "umount", mnt); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(filepath.Join(r.volumesDir(), id)); err != nil {
		return err
	}
	r.log.Info("runtime: volume removed", "volume", id)
	return nil
}

// readyMounts checks that every volume in mounts is listed and mounted
// on the node, making it now when the volumes' worker has not yet.
func (r *Runtime) readyMounts(ctx context.Context, in nodespec.Instance) error {
	for _, m := range in.Mounts {
		r.mu.Lock()
		var v nodespec.Volume
		ok := false
		if r.vols != nil {
			v, ok = r.vols.desired[m.VolumeID]
		}
		r.mu.Unlock()
		if !ok {
			return fmt.Errorf("volume %s is not on this node", m.VolumeID)
		}
		if err := r.ensureVolume(ctx, v, in.ID); err != nil {
			return fmt.Errorf("volume %s: %w", m.VolumeID, err)
		}
	}
	return nil
}

// volumeMounts are in's bind mounts of its volumes.
func (r *Runtime) volumeMounts(in nodespec.Instance) []specs.Mount {
	out := make([]specs.Mount, 0, len(in.Mounts))
	for _, m := range in.Mounts {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		out = append(out, specs.Mount{Destination: m.Path, Type: "bind", Source: r.volumeMount(m.VolumeID),
			Options: []string{"rbind", mode, "nosuid", "nodev"}})
	}
	return out
}

// isMountPoint says whether path is a mount point (/proc/self/mountinfo).
func isMountPoint(path string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && unescapeMountinfo(fields[4]) == path {
			return true
		}
	}
	return false
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// loopDevice is the loop device img is attached to.
func loopDevice(ctx context.Context, img string) (string, error) {
	out, err := exec.CommandContext(ctx, "losetup", "-j", img).Output()
	if err != nil {
		return "", fmt.Errorf("losetup -j %s: %w", img, err)
	}
	dev, _, ok := strings.Cut(string(out), ":")
	if !ok {
		return "", fmt.Errorf("%s is on no loop device", img)
	}
	return dev, nil
}

// runCmd runs a command, its error holding its output.
func runCmd(ctx context.Context, name string, args ...string) error {
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

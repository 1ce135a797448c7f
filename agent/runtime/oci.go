package runtime

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
)

// ociRuntime is the OCI runtime binary a container instance runs under:
// runc ("container") or gVisor's runsc ("gvisor"). Both take the same
// bundle and the same state/kill/delete/exec commands; only the binary,
// its global flags and how a sandbox is set up differ.
type ociRuntime struct {
	kind   string
	bin    string
	global []string
	// hideRootNS wraps the commands that set up a sandbox's network (run,
	// restore, checkpoint) in hideRootNSScript.
	hideRootNS bool
}

// hideRootNSScript runs its arguments in a private mount namespace whose
// /proc/sys lacks net/. runsc 20240729 takes a network namespace holding
// /proc/sys/net/core/rmem_default for the root one (isRootNS), and recent
// kernels have that file in every namespace: --network=sandbox then
// refuses every named namespace. Without net/ the check passes; the rest
// of /proc/sys stays (runsc reads vm/mmap_min_addr and more).
const hideRootNSScript = `set -e
d=$(mktemp -d /run/bc-procsys.XXXXXX)
mount --bind /proc/sys "$d"
mount -t tmpfs -o mode=555 bc-procsys /proc/sys
for p in "$d"/*; do
  n=${p##*/}
  [ "$n" = net ] && continue
  mkdir "/proc/sys/$n"
  mount --bind "$p" "/proc/sys/$n"
done
umount -l "$d"
rmdir "$d"
exec "$@"`

// oci answers the OCI runtime of an instance's runtime kind.
func (r *Runtime) oci(kind string) ociRuntime {
	if kind == KindGVisor {
		// systrap: KVM hangs here and ptrace is slower. overlay2=none: the
		// root's changes go to the rootfs directory (through the gofer), not
		// to a memory overlay, so a disk snapshot is the rootfs and a
		// memory checkpoint holds only memory. The network is gVisor's own
		// netstack over the instance's namespace (hostinet cannot be
		// checkpointed).
		return ociRuntime{kind: kind, bin: r.o.Runsc, hideRootNS: true,
			global: []string{"--root", r.runscRoot(), "--platform=systrap", "--overlay2=none", "--network=sandbox"}}
	}
	return ociRuntime{kind: KindContainer, bin: r.o.Runc, global: []string{"--root", r.runcRoot()}}
}

func (r *Runtime) runscRoot() string { return filepath.Join(r.o.StateDir, "runsc") }

// command is the runtime's command line for args (wrapped when args[0]
// sets up a sandbox's network).
func (o ociRuntime) command(ctx context.Context, args ...string) *exec.Cmd {
	full := append(append([]string(nil), o.global...), args...)
	if o.hideRootNS && len(args) > 0 && (args[0] == "run" || args[0] == "restore" || args[0] == "checkpoint") {
		return exec.CommandContext(ctx, "unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", hideRootNSScript, "sh", o.bin}, full...)...)
	}
	return exec.CommandContext(ctx, o.bin, full...)
}

// run runs args and answers their stdout; the error holds stderr.
func (o ociRuntime) run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := o.command(ctx, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", filepath.Base(o.bin), args[0], err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

package runtime

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
)

// A VM is qemu-system-x86_64 (TCG: there is no usable KVM here),
// daemonized, with its pidfile and QMP socket in the instance's directory:
// a restarted agent finds it by the pidfile and the socket, never starting
// a second one. Its disk is a qcow2 overlay over the cached image, its
// serial console a file, its network QEMU's user mode with one host port
// forward (127.0.0.1:<port> → the guest's VMGuestPort): the address it
// reports is that 127.0.0.1:<port>.

// VMGuestPort is the guest port a VM's host port forwards to.
const VMGuestPort = nodespec.VMGuestPort

func (r *Runtime) vmFile(id, name string) string { return filepath.Join(r.instanceDir(id), name) }

// qmpDir holds the VMs' QMP sockets. A socket's path must be shorter than
// 108 bytes (sun_path), which a state directory and a 60-character
// instance id overrun, so it is named by a digest of both in a short
// directory; /run is emptied at boot, when no VM survives anyway.
const qmpDir = "/run/better-compute/qmp"

func (r *Runtime) qmpSocket(id string) string {
	sum := sha256.Sum256([]byte(r.instanceDir(id)))
	return filepath.Join(qmpDir, hex.EncodeToString(sum[:12])+".sock")
}

// vmLaunch is what a VM was started with (vm.json): a change of limits
// restarts it.
type vmLaunch struct {
	VCPU      int    `json:"vcpu"`
	MemoryMiB int64  `json:"memoryMiB"`
	DiskGiB   int    `json:"diskGiB"`
	Image     string `json:"image"`
}

// vmPid answers the pid of id's running QEMU (0: none): the pidfile's, if
// that process is QEMU with this instance's QMP socket.
func (r *Runtime) vmPid(id string) int {
	b, err := os.ReadFile(r.vmFile(id, "qemu.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || !bytes.Contains(cmdline, []byte(r.qmpSocket(id))) {
		return 0
	}
	if st, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat")); err == nil {
		if f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return 0
		}
	}
	return pid
}

// ConsoleLog is where a VM's serial console (or a container's stdio) is
// written.
func (r *Runtime) ConsoleLog(id string) string { return r.vmFile(id, "console.log") }

func (r *Runtime) convergeVM(ctx context.Context, in nodespec.Instance) (protocol.InstanceStatus, error) {
	st := protocol.InstanceStatus{ID: in.ID, Generation: in.Generation}
	pid := r.vmPid(in.ID)
	if in.Desired == protocol.InstanceStopped {
		if err := r.stopVM(ctx, in.ID); err != nil {
			return st, err
		}
		st.State = protocol.InstanceStopped
		st.Address = r.vmAddress(in.ID)
		return st, nil
	}
	var launched vmLaunch
	if b, err := os.ReadFile(r.vmFile(in.ID, "vm.json")); err == nil {
		_ = json.Unmarshal(b, &launched)
	}
	if pid != 0 && (launched.VCPU != in.VCPU || launched.MemoryMiB != in.MemoryMiB) {
		// QEMU cannot change -smp or -m of a running TCG guest: a resize
		// is a stop and a start with the new limits.
		r.log.Info("runtime: VM resized by a restart", "instance", in.ID, "vcpu", in.VCPU, "memoryMiB", in.MemoryMiB)
		if err := r.stopVM(ctx, in.ID); err != nil {
			return st, err
		}
		pid = 0
	}
	if pid == 0 {
		r.setStatus(protocol.InstanceStatus{ID: in.ID, Generation: in.Generation, State: protocol.InstanceCreating})
		if err := r.startVM(ctx, in); err != nil {
			return st, err
		}
	}
	st.State = protocol.InstanceRunning
	st.VCPU, st.MemoryMiB = in.VCPU, in.MemoryMiB
	st.Address = r.vmAddress(in.ID)
	if fi, err := os.Stat(r.vmFile(in.ID, "qemu.pid")); err == nil {
		st.StartedAt = fi.ModTime().UnixMilli()
	}
	return st, nil
}

func (r *Runtime) vmAddress(id string) string {
	b, err := os.ReadFile(r.vmFile(id, "port"))
	if err != nil {
		return ""
	}
	return "127.0.0.1:" + strings.TrimSpace(string(b))
}

// vmHostPort answers id's forwarded host port, picking a free one once.
func (r *Runtime) vmHostPort(id string) (string, error) {
	r.netMu.Lock()
	defer r.netMu.Unlock()
	if b, err := os.ReadFile(r.vmFile(id, "port")); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	return port, writeFileAtomic(r.vmFile(id, "port"), []byte(port+"\n"), 0o600)
}

func (r *Runtime) startVM(ctx context.Context, in nodespec.Instance) error {
	image, err := r.fetchImage(ctx, in)
	if err != nil {
		return err
	}
	port, err := r.vmHostPort(in.ID)
	if err != nil {
		return err
	}
	launch := vmLaunch{VCPU: in.VCPU, MemoryMiB: in.MemoryMiB, DiskGiB: in.DiskGiB, Image: filepath.Base(image)}
	disk := r.vmFile(in.ID, "disk.qcow2")
	var prev vmLaunch
	if b, err := os.ReadFile(r.vmFile(in.ID, "vm.json")); err == nil {
		_ = json.Unmarshal(b, &prev)
	}
	if _, err := os.Stat(disk); err != nil || prev.Image != launch.Image {
		if err := r.createDisk(ctx, in, image, disk); err != nil {
			return err
		}
	} else if in.DiskGiB > prev.DiskGiB && in.DiskGiB > 0 {
		if out, err := exec.CommandContext(ctx, r.o.QEMUImg, "resize", disk, strconv.Itoa(in.DiskGiB)+"G").CombinedOutput(); err != nil {
			return fmt.Errorf("qemu-img resize: %w: %s", err, bytes.TrimSpace(out))
		}
	}
	args := []string{"-name", in.ID, "-machine", "accel=tcg", "-smp", strconv.Itoa(in.VCPU), "-m", strconv.FormatInt(in.MemoryMiB, 10),
		"-display", "none", "-serial", "file:" + r.ConsoleLog(in.ID), "-monitor", "none",
		"-qmp", "unix:" + r.qmpSocket(in.ID) + ",server=on,wait=off",
		"-pidfile", r.vmFile(in.ID, "qemu.pid"), "-daemonize",
		"-netdev", fmt.Sprintf("user,id=n0,hostfwd=tcp:127.0.0.1:%s-:%d", port, VMGuestPort),
		"-device", "virtio-net-pci,netdev=n0"}
	if in.Image.Format == "iso" {
		args = append(args, "-cdrom", image, "-boot", "order=dc")
		if in.DiskGiB > 0 {
			args = append(args, "-drive", "file="+disk+",if=virtio,format=qcow2")
		}
	} else {
		args = append(args, "-drive", "file="+disk+",if=virtio,format=qcow2")
	}
	seed, err := r.vmSeed(ctx, in)
	if err != nil {
		return err
	}
	if seed != "" {
		args = append(args, "-drive", "file="+seed+",media=cdrom,readonly=on,if=ide,index=1")
	}
	_ = os.Remove(r.vmFile(in.ID, "qemu.pid"))
	if err := os.MkdirAll(qmpDir, 0o700); err != nil {
		return err
	}
	_ = os.Remove(r.qmpSocket(in.ID))
	if out, err := exec.CommandContext(ctx, r.o.QEMU, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("qemu: %w: %s", err, bytes.TrimSpace(out))
	}
	b, _ := json.Marshal(launch)
	if err := writeFileAtomic(r.vmFile(in.ID, "vm.json"), b, 0o600); err != nil {
		return err
	}
	if r.vmPid(in.ID) == 0 {
		return errors.New("qemu daemonized but its pidfile names no running QEMU")
	}
	r.log.Info("runtime: VM running", "instance", in.ID, "generation", in.Generation, "address", r.vmAddress(in.ID))
	return nil
}

// createDisk makes the VM's disk: a qcow2 overlay backed by the cached
// image (raw or qcow2), of DiskGiB when set; an ISO gets a blank disk.
func (r *Runtime) createDisk(ctx context.Context, in nodespec.Instance, image, disk string) error {
	_ = os.Remove(disk)
	args := []string{"create", "-q", "-f", "qcow2"}
	switch in.Image.Format {
	case "raw", "", "qcow2":
		format := in.Image.Format
		if format == "" {
			format = "raw"
		}
		args = append(args, "-F", format, "-b", image, disk)
		if in.DiskGiB > 0 {
			args = append(args, strconv.Itoa(in.DiskGiB)+"G")
		}
	case "iso":
		if in.DiskGiB <= 0 {
			return nil
		}
		args = append(args, disk, strconv.Itoa(in.DiskGiB)+"G")
	default:
		return fmt.Errorf("a VM cannot boot a %q image: raw, qcow2 or iso", in.Image.Format)
	}
	if out, err := exec.CommandContext(ctx, r.o.QEMUImg, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("qemu-img create: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// vmSeed writes the VM's NoCloud seed, an ISO labelled cidata (xorriso),
// when it has user data: fetched now, kept 0600 in the instance's
// directory only.
func (r *Runtime) vmSeed(ctx context.Context, in nodespec.Instance) (string, error) {
	seed := r.vmFile(in.ID, "seed.iso")
	userData, err := r.fetchUserData(ctx, in)
	if err != nil {
		return "", err
	}
	if userData == nil {
		_ = os.Remove(seed)
		return "", nil
	}
	dir, err := os.MkdirTemp(r.instanceDir(in.ID), ".seed-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "root")
	if err := writeSeed(root, in.ID, hostname(in.ID), userData); err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, "seed.iso")
	if out, err := exec.CommandContext(ctx, "xorriso", "-as", "mkisofs", "-quiet", "-V", "cidata", "-J", "-r", "-o", tmp,
		filepath.Join(root, SeedDir)).CombinedOutput(); err != nil {
		return "", fmt.Errorf("the VM's seed (xorriso): %w: %s", err, bytes.TrimSpace(out))
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return "", err
	}
	return seed, os.Rename(tmp, seed)
}

// stopVM powers the VM down (ACPI), kills it after the grace, and keeps
// its disk.
func (r *Runtime) stopVM(ctx context.Context, id string) error {
	pid := r.vmPid(id)
	if pid == 0 {
		return nil
	}
	if err := qmp(ctx, r.qmpSocket(id), "system_powerdown"); err != nil {
		r.log.Warn("runtime: VM power-down", "instance", id, "error", err)
	}
	if !r.waitVMGone(ctx, id, r.o.StopGrace) {
		if err := qmp(ctx, r.qmpSocket(id), "quit"); err != nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if !r.waitVMGone(ctx, id, 5*time.Second) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			if !r.waitVMGone(ctx, id, 5*time.Second) {
				return fmt.Errorf("QEMU (pid %d) does not end", pid)
			}
		}
	}
	_ = os.Remove(r.vmFile(id, "qemu.pid"))
	_ = os.Remove(r.qmpSocket(id))
	r.log.Info("runtime: VM stopped", "instance", id)
	return nil
}

func (r *Runtime) waitVMGone(ctx context.Context, id string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for r.vmPid(id) != 0 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

// qmp runs one QMP command (no arguments) on the socket.
func qmp(ctx context.Context, sock, command string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	rd := bufio.NewReader(c)
	reply := func() error {
		for {
			line, err := rd.ReadBytes('\n')
			if err != nil {
				return err
			}
			var m map[string]json.RawMessage
			if json.Unmarshal(line, &m) != nil {
				continue
			}
			if e, ok := m["error"]; ok {
				return fmt.Errorf("qmp: %s", e)
			}
			if _, ok := m["return"]; ok {
				return nil
			}
		}
	}
	if _, err := rd.ReadBytes('\n'); err != nil { // the greeting
		return err
	}
	for _, cmd := range []string{"qmp_capabilities", command} {
		if _, err := fmt.Fprintf(c, "{\"execute\":%q}\n", cmd); err != nil {
			return err
		}
		if err := reply(); err != nil {
			if cmd == "quit" && errors.Is(err, os.ErrDeadlineExceeded) {
				return nil
			}
			if cmd == "quit" {
				return nil // QEMU closes the socket as it quits
			}
			return err
		}
	}
	return nil
}

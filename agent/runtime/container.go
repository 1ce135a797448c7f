package runtime

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
)

// runc's container states (`runc state`).
const (
	runcRunning = "running"
	runcCreated = "created"
	runcStopped = "stopped"
	runcPaused  = "paused"
)

// SeedDir is where a container's rootfs gets its NoCloud seed.
const SeedDir = "var/lib/cloud/seed/nocloud"

func (r *Runtime) runcRoot() string           { return filepath.Join(r.o.StateDir, "runc") }
func (r *Runtime) bundleDir(id string) string { return filepath.Join(r.instanceDir(id), "bundle") }
func (r *Runtime) rootfsDir(id string) string { return filepath.Join(r.instanceDir(id), "rootfs") }

// CgroupPath is a container's cgroup, under each v1 hierarchy
// (/sys/fs/cgroup/<controller>/better-compute/<id>).
func CgroupPath(id string) string { return "/better-compute/" + id }

// runcState is what `runc state` answers.
type runcState struct {
	Status  string    `json:"status"`
	Pid     int       `json:"pid"`
	Created time.Time `json:"created"`
}

// containerState answers id's state under rt; ok false: there is no
// container.
func (r *Runtime) containerState(ctx context.Context, rt ociRuntime, id string) (runcState, bool, error) {
	out, err := rt.run(ctx, "state", id)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return runcState{}, false, nil
		}
		return runcState{}, false, err
	}
	var s runcState
	if err := json.Unmarshal(out, &s); err != nil {
		return runcState{}, false, fmt.Errorf("%s state: %w", rt.kind, err)
	}
	return s, true, nil
}

// convergeContainer makes the container match in: running with in's
// limits, or stopped with its rootfs kept.
func (r *Runtime) convergeContainer(ctx context.Context, in nodespec.Instance) (protocol.InstanceStatus, error) {
	st := protocol.InstanceStatus{ID: in.ID, Generation: in.Generation}
	rt := r.oci(in.Runtime)
	state, exists, err := r.containerState(ctx, rt, in.ID)
	if err != nil {
		return st, err
	}
	if in.Desired == protocol.InstanceStopped {
		if exists {
			if err := r.stopContainer(ctx, rt, in.ID); err != nil {
				return st, err
			}
		}
		if a, err := r.readAddress(in.ID); err == nil {
			st.Address = a
		}
		st.State = protocol.InstanceStopped
		return st, nil
	}
	if exists && state.Status == runcRunning {
		// Found again (a restarted agent finds its containers the same
		// way): re-limit it if the spec's limits changed.
		relimited, err := r.relimitContainer(ctx, rt, in)
		if err != nil {
			return st, err
		}
		if relimited {
			return r.runningStatus(in, state), nil
		}
		// runsc has no update: a gVisor instance restarts with its new
		// limits (about 250 ms).
		if err := r.stopContainer(ctx, rt, in.ID); err != nil {
			return st, err
		}
		exists = false
	}
	if exists {
		// Created but never started, exited by itself, or paused: start
		// it again from the bundle.
		if _, err := rt.run(ctx, "delete", "--force", in.ID); err != nil {
			return st, err
		}
	}
	r.setStatus(protocol.InstanceStatus{ID: in.ID, Generation: in.Generation, State: protocol.InstanceCreating})
	if err := r.createContainer(ctx, rt, in); err != nil {
		return st, err
	}
	state, exists, err = r.containerState(ctx, rt, in.ID)
	if err != nil {
		return st, err
	}
	if !exists || state.Status != runcRunning {
		return st, fmt.Errorf("the container is %q right after its start (see %s)", state.Status, filepath.Join(r.instanceDir(in.ID), "console.log"))
	}
	r.log.Info("runtime: container running", "instance", in.ID, "generation", in.Generation, "runtime", rt.kind)
	return r.runningStatus(in, state), nil
}

func (r *Runtime) runningStatus(in nodespec.Instance, s runcState) protocol.InstanceStatus {
	st := protocol.InstanceStatus{ID: in.ID, Generation: in.Generation, State: protocol.InstanceRunning,
		VCPU: in.VCPU, MemoryMiB: in.MemoryMiB, StartedAt: r.epochMs(s.Created)}
	if cfg, err := r.readConfig(in.ID); err == nil {
		st.VCPU, st.MemoryMiB = appliedLimits(cfg)
	}
	if a, err := r.readAddress(in.ID); err == nil {
		st.Address = a
	}
	return st
}

// appliedLimits reads vCPU and MiB back from a config's resources.
func appliedLimits(cfg *specs.Spec) (int, int64) {
	var vcpu int
	var mib int64
	if res := cfg.Linux.Resources; res != nil {
		if res.CPU != nil && res.CPU.Quota != nil && res.CPU.Period != nil && *res.CPU.Period > 0 {
			vcpu = int(*res.CPU.Quota / int64(*res.CPU.Period))
		}
		if res.Memory != nil && res.Memory.Limit != nil {
			mib = *res.Memory.Limit >> 20
		}
	}
	return vcpu, mib
}

// createContainer prepares the rootfs (the image's, or a snapshot's), the
// network, the seed and the bundle, and runs the container detached (or
// restores a memory snapshot into it).
func (r *Runtime) createContainer(ctx context.Context, rt ociRuntime, in nodespec.Instance) error {
	checkpoint := ""
	if in.Restore != nil {
		var err error
		if checkpoint, err = r.prepareRestore(ctx, rt, in); err != nil {
			return err
		}
	} else {
		image, err := r.fetchImage(ctx, in)
		if err != nil {
			return err
		}
		if err := r.prepareRootfs(ctx, in, image); err != nil {
			return err
		}
	}
	if err := r.readyMounts(ctx, in); err != nil {
		return err
	}
	if _, err := r.ensureNetwork(ctx, in.ID); err != nil {
		return err
	}
	// A memory restore keeps the rootfs as the checkpoint left it: the
	// restored processes hold its files.
	if checkpoint == "" {
		userData, err := r.fetchUserData(ctx, in)
		if err != nil {
			return err
		}
		if err := writeSeed(r.rootfsDir(in.ID), in.ID, hostname(in.ID), userData); err != nil {
			return err
		}
	}
	devices, err := r.exposeDevices(in)
	if err != nil {
		return err
	}
	env, err := r.fetchEnv(ctx, in)
	if err != nil {
		return err
	}
	cfg := r.containerConfig(in, devices, env)
	if err := r.writeConfig(in.ID, cfg); err != nil {
		return err
	}
	logFile, err := os.OpenFile(filepath.Join(r.instanceDir(in.ID), "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	// Detached, the container's stdio is the log file itself (an *os.File
	// is handed over as is): the runtime returns once it started.
	args := []string{"run", "--detach"}
	if checkpoint != "" {
		args = []string{"restore", "--detach", "--image-path", checkpoint}
	}
	cmd := rt.command(ctx, append(args, "--bundle", r.bundleDir(in.ID), "--pid-file", filepath.Join(r.bundleDir(in.ID), "pid"), in.ID)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", rt.kind, args[0], err, tail(filepath.Join(r.instanceDir(in.ID), "console.log")))
	}
	if checkpoint != "" {
		// Restored once: a later start boots the rootfs.
		if err := os.RemoveAll(checkpoint); err != nil {
			return err
		}
		r.log.Info("runtime: memory snapshot restored", "instance", in.ID, "snapshot", in.Restore.SnapshotID)
	}
	return nil
}

// tail is a file's last few hundred bytes, for an error.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 400 {
		b = b[len(b)-400:]
	}
	return string(bytes.TrimSpace(b))
}

// hostname is the instance's host name: its id in the characters a host
// name allows.
func hostname(id string) string {
	h := strings.ToLower(strings.NewReplacer("_", "-", ".", "-").Replace(id))
	if len(h) > 63 {
		h = h[:63]
	}
	return strings.Trim(h, "-")
}

// writeSeed writes the NoCloud seed into the rootfs: meta-data, and
// user-data (mode 0600) when there is some; a stale user-data goes.
func writeSeed(rootfs, id, host string, userData []byte) error {
	dir := filepath.Join(rootfs, SeedDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	meta := fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", id, host)
	if err := writeFileAtomic(filepath.Join(dir, "meta-data"), []byte(meta), 0o600); err != nil {
		return err
	}
	ud := filepath.Join(dir, "user-data")
	if userData == nil {
		if err := os.Remove(ud); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	return writeFileAtomic(ud, userData, 0o600)
}

// Image filesystems a container's rootfs is taken from.
const (
	fsSquashfs = "squashfs"
	fsExt4     = "ext4"
)

// detectFS tells a raw image's filesystem by its superblock's magic.
func detectFS(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head := make([]byte, 1082)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return "", err
	}
	head = head[:n]
	switch {
	case len(head) >= 4 && string(head[:4]) == "hsqs":
		return fsSquashfs, nil
	case len(head) >= 1082 && binary.LittleEndian.Uint16(head[1080:]) == 0xEF53:
		return fsExt4, nil
	}
	return "", errors.New("the image holds neither a squashfs nor an ext2/3/4 filesystem")
}

// prepareRootfs unpacks the image into the instance's rootfs once per
// image digest (rootfs.sha256 says which); a changed image replaces it.
func (r *Runtime) prepareRootfs(ctx context.Context, in nodespec.Instance, image string) error {
	dir := r.instanceDir(in.ID)
	marker := filepath.Join(dir, "rootfs.sha256")
	digest := filepath.Base(image)
	if b, err := os.ReadFile(marker); err == nil && strings.TrimSpace(string(b)) == digest {
		if _, err := os.Stat(r.rootfsDir(in.ID)); err == nil {
			return nil
		}
	}
	raw := image
	switch in.Image.Format {
	case "raw", "":
	case "qcow2":
		raw = filepath.Join(dir, "image.raw")
		if out, err := exec.CommandContext(ctx, r.o.QEMUImg, "convert", "-O", "raw", image, raw).CombinedOutput(); err != nil {
			return fmt.Errorf("qemu-img convert: %w: %s", err, bytes.TrimSpace(out))
		}
		defer os.Remove(raw)
	default:
		return fmt.Errorf("a container cannot boot a %q image: raw or qcow2 holding squashfs or ext4", in.Image.Format)
	}
	fs, err := detectFS(raw)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "rootfs.tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	switch fs {
	case fsSquashfs:
		if out, err := exec.CommandContext(ctx, "unsquashfs", "-no-progress", "-quiet", "-d", tmp, raw).CombinedOutput(); err != nil {
			return fmt.Errorf("unsquashfs: %w: %s", err, bytes.TrimSpace(out))
		}
	case fsExt4:
		if err := copyOutOfExt4(ctx, raw, dir, tmp); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(r.rootfsDir(in.ID)); err != nil {
		return err
	}
	if err := os.Rename(tmp, r.rootfsDir(in.ID)); err != nil {
		return err
	}
	return writeFileAtomic(marker, []byte(digest+"\n"), 0o600)
}

// copyOutOfExt4 loop-mounts the image read-only and copies its files.
func copyOutOfExt4(ctx context.Context, image, dir, dst string) error {
	mnt := filepath.Join(dir, "mnt")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return err
	}
	defer os.Remove(mnt)
	if out, err := exec.CommandContext(ctx, "mount", "-o", "loop,ro", image, mnt).CombinedOutput(); err != nil {
		return fmt.Errorf("mount the ext4 image: %w: %s", err, bytes.TrimSpace(out))
	}
	defer exec.Command("umount", mnt).Run()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "cp", "-a", mnt+"/.", dst).CombinedOutput(); err != nil {
		return fmt.Errorf("copy the ext4 image: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// containerConfig is the OCI config of in: its own PID, mount, UTS, IPC
// and network namespaces, the flavor's cgroup limits, env after the
// defaults (so it may override them; execs inherit it).
func (r *Runtime) containerConfig(in nodespec.Instance, devices []specs.LinuxDevice, env []string) *specs.Spec {
	args := in.Command
	if len(args) == 0 {
		args = []string{"/sbin/init"}
	}
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
		"CAP_KILL", "CAP_AUDIT_WRITE"}
	rwm := "rwm"
	res := limits(in, r.o.PidsLimit)
	res.Devices = []specs.LinuxDeviceCgroup{{Allow: false, Access: rwm}}
	for _, d := range []struct {
		major, minor int64
	}{{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}, {5, 2}, {136, -1}} {
		major, minor := d.major, d.minor
		dc := specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Access: rwm}
		if minor >= 0 {
			dc.Minor = &minor
		}
		res.Devices = append(res.Devices, dc)
	}
	for _, d := range devices {
		major, minor := d.Major, d.Minor
		res.Devices = append(res.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: d.Type, Major: &major, Minor: &minor, Access: rwm})
	}
	cfg := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: r.rootfsDir(in.ID)},
		Hostname: hostname(in.ID),
		Process: &specs.Process{
			Args: args, Cwd: "/",
			Env:             append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm", "container=better-compute"}, env...),
			Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 4096, Soft: 4096}},
			NoNewPrivileges: true,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=755"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: CgroupPath(in.ID),
			Resources:   res,
			Devices:     devices,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.NetworkNamespace, Path: netnsPath(in.ID)},
			},
			MaskedPaths: []string{"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
				"/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"},
			ReadonlyPaths: []string{"/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
	cfg.Mounts = append(cfg.Mounts, r.volumeMounts(in)...)
	return cfg
}

// limits are the flavor's cgroup limits: CPU quota = vcpu × period, the
// memory limit, the pids limit.
func limits(in nodespec.Instance, pids int64) *specs.LinuxResources {
	quota := int64(in.VCPU) * cpuPeriod
	period := uint64(cpuPeriod)
	mem := in.MemoryMiB << 20
	return &specs.LinuxResources{
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
		Memory: &specs.LinuxMemory{Limit: &mem},
		Pids:   &specs.LinuxPids{Limit: pids},
	}
}

func (r *Runtime) writeConfig(id string, cfg *specs.Spec) error {
	if err := os.MkdirAll(r.bundleDir(id), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(r.bundleDir(id), "config.json"), b, 0o600)
}

func (r *Runtime) readConfig(id string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(r.bundleDir(id), "config.json"))
	if err != nil {
		return nil, err
	}
	var cfg specs.Spec
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, err
	}
	if cfg.Linux == nil {
		return nil, errors.New("config.json has no linux section")
	}
	return &cfg, nil
}

// relimitContainer applies changed limits to a running container (runc
// update) and records them in config.json for its next start; false: the
// runtime cannot (runsc), the container must start again.
func (r *Runtime) relimitContainer(ctx context.Context, rt ociRuntime, in nodespec.Instance) (bool, error) {
	cfg, err := r.readConfig(in.ID)
	if err != nil {
		return false, err
	}
	vcpu, mib := appliedLimits(cfg)
	if vcpu == in.VCPU && mib == in.MemoryMiB {
		return true, nil
	}
	if rt.kind == KindGVisor {
		return false, nil
	}
	want := limits(in, r.o.PidsLimit)
	if _, err := rt.run(ctx, "update", "--cpu-period", strconv.FormatUint(*want.CPU.Period, 10),
		"--cpu-quota", strconv.FormatInt(*want.CPU.Quota, 10), "--memory", strconv.FormatInt(*want.Memory.Limit, 10),
		"--pids-limit", strconv.FormatInt(want.Pids.Limit, 10), in.ID); err != nil {
		return false, err
	}
	cfg.Linux.Resources.CPU, cfg.Linux.Resources.Memory, cfg.Linux.Resources.Pids = want.CPU, want.Memory, want.Pids
	r.log.Info("runtime: container re-limited", "instance", in.ID, "vcpu", in.VCPU, "memoryMiB", in.MemoryMiB)
	return true, r.writeConfig(in.ID, cfg)
}

// stopContainer sends SIGTERM, SIGKILL after the grace, and deletes the
// container (its cgroup goes with it); the rootfs and network stay.
func (r *Runtime) stopContainer(ctx context.Context, rt ociRuntime, id string) error {
	s, exists, err := r.containerState(ctx, rt, id)
	if err != nil || !exists {
		return err
	}
	if s.Status == runcRunning || s.Status == runcPaused {
		if _, err := rt.run(ctx, "kill", id, "TERM"); err != nil && !strings.Contains(err.Error(), "not running") {
			return err
		}
		if !r.waitContainerStopped(ctx, rt, id, r.o.StopGrace) {
			if _, err := rt.run(ctx, "kill", id, "KILL"); err != nil && !strings.Contains(err.Error(), "not running") {
				return err
			}
			r.waitContainerStopped(ctx, rt, id, 5*time.Second)
		}
	}
	if _, err := rt.run(ctx, "delete", "--force", id); err != nil && !strings.Contains(err.Error(), "does not exist") {
		return err
	}
	r.log.Info("runtime: container stopped", "instance", id)
	return nil
}

// waitContainerStopped polls the runtime until id is no longer running.
func (r *Runtime) waitContainerStopped(ctx context.Context, rt ociRuntime, id string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		s, exists, err := r.containerState(ctx, rt, id)
		if err == nil && (!exists || (s.Status != runcRunning && s.Status != runcPaused)) {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

package runtime_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
	"github.com/better-compute/better-compute/agent/runtime"
	"github.com/better-compute/better-compute/internal/testutil"
)

// testDisk builds bare metal II's test disk (docs/testdisk.md) over the
// kernel `make kernel` cached: its /init's first line on the serial
// console is the boot marker here (without a seed partition it then idles:
// its bcd never runs, so a stand-in file does).
func testDisk(t *testing.T) []byte {
	t.Helper()
	kernelDir := image.DefaultKernelDir()
	if _, _, err := image.FindKernel(kernelDir); err != nil {
		t.Skipf("no kernel cache (run `make kernel`): %v", err)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64 (Debian package qemu-system-x86)")
	}
	for _, tool := range []string{"qemu-img", "syslinux", "mcopy"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("no %s (Debian packages qemu-utils, syslinux, mtools): %v", tool, err)
		}
	}
	dir := t.TempDir()
	bcd := filepath.Join(dir, "bcd")
	if err := os.WriteFile(bcd, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := image.BuildDisk(context.Background(), image.DiskOptions{Options: image.Options{KernelDir: kernelDir, BCD: bcd, OutDir: filepath.Join(dir, "disk")}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(d.Image)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func vmPid(t *testing.T, stateDir, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, "instances", id, "qemu.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func alive(pid int) bool {
	st, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	return err == nil && !strings.Contains(string(st), ") Z ")
}

// TestVMLifecycle boots the test disk as a VM (QEMU TCG) to its marker on
// the serial console, finds it again from a restarted Runtime, resizes it
// by a restart, stops and removes it.
func TestVMLifecycle(t *testing.T) {
	t.Parallel() // its boot under TCG is most of the package's time
	if os.Geteuid() != 0 {
		t.Skip("the runtime's tests run as root")
	}
	disk := testDisk(t)
	srv := newImageServer(t)
	id := randID(t, "inst_")
	srv.serve(id, disk, []byte("#cloud-config\n"))
	h := newHarness(t, srv)
	h.opts.StopGrace = 500 * time.Millisecond
	h.stop()
	h.start()
	vm := func(gen int64, desired string, mib int64) nodespec.Instance {
		return nodespec.Instance{ID: id, Generation: gen, Runtime: runtime.KindVM, Desired: desired, VCPU: 1, MemoryMiB: mib, DiskGiB: 1,
			UserData: true, Image: nodespec.InstanceImage{ID: "img_disk", Format: "raw", SHA256: digest(disk), SizeBytes: int64(len(disk))}}
	}
	begin := time.Now()
	h.rt.OnSpec(1, nodespec.Spec{Instances: []nodespec.Instance{vm(1, protocol.InstanceRunning, 256)}})
	st := h.wait(id, 1, protocol.InstanceRunning, 30*time.Second)
	t.Logf("first VM create → running (QEMU up; image fetch and overlay included): %s", time.Since(begin).Round(time.Millisecond))
	if !strings.HasPrefix(st.Address, "127.0.0.1:") || st.VCPU != 1 || st.MemoryMiB != 256 || st.StartedAt == 0 {
		t.Fatalf("running status %+v", st)
	}
	console := h.rt.ConsoleLog(id)
	testutil.EventuallyNil(t, 90*time.Second, func() error {
		b, _ := os.ReadFile(console)
		if !strings.Contains(string(b), "bcd-init: disk boot") {
			return os.ErrNotExist
		}
		return nil
	})
	t.Logf("VM create → the disk's /init marker on the serial console: %s", time.Since(begin).Round(time.Millisecond))
	pid := vmPid(t, h.opts.StateDir, id)
	// The user data reached the VM as a NoCloud seed ISO, mode 0600.
	seed := filepath.Join(h.opts.StateDir, "instances", id, "seed.iso")
	if fi, err := os.Stat(seed); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("seed ISO: %v (mode %v)", err, fi.Mode())
	}
	if cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline")); !strings.Contains(string(cmdline), "file="+seed) {
		t.Errorf("QEMU's command line lacks the seed: %q", cmdline)
	}

	t.Run("a restarted runtime finds it again", func(t *testing.T) {
		h.stop()
		h.start()
		h.rt.OnSpec(1, nodespec.Spec{Instances: []nodespec.Instance{vm(1, protocol.InstanceRunning, 256)}})
		again := h.wait(id, 1, protocol.InstanceRunning, 15*time.Second)
		if again != st || vmPid(t, h.opts.StateDir, id) != pid {
			t.Errorf("after the restart %+v (pid %d), before %+v (pid %d)", again, vmPid(t, h.opts.StateDir, id), st, pid)
		}
	})

	t.Run("resize restarts it", func(t *testing.T) {
		h.rt.OnSpec(2, nodespec.Spec{Instances: []nodespec.Instance{vm(2, protocol.InstanceRunning, 320)}})
		st := h.wait(id, 2, protocol.InstanceRunning, 30*time.Second)
		if st.MemoryMiB != 320 || alive(pid) {
			t.Errorf("resized %+v; old QEMU alive: %v", st, alive(pid))
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(vmPid(t, h.opts.StateDir, id)), "cmdline"))
		if !strings.Contains(string(cmdline), "-m\x00320\x00") {
			t.Errorf("QEMU's command line %q", cmdline)
		}
	})

	t.Run("timing", func(t *testing.T) {
		var runs []time.Duration
		for gen := int64(3); gen < 9; gen += 2 {
			h.rt.OnSpec(gen, nodespec.Spec{Instances: []nodespec.Instance{vm(gen, protocol.InstanceStopped, 256)}})
			h.wait(id, gen, protocol.InstanceStopped, 30*time.Second)
			begin := time.Now()
			h.rt.OnSpec(gen+1, nodespec.Spec{Instances: []nodespec.Instance{vm(gen+1, protocol.InstanceRunning, 256)}})
			h.wait(id, gen+1, protocol.InstanceRunning, 30*time.Second)
			runs = append(runs, time.Since(begin))
		}
		t.Logf("VM start (disk kept) → running (QEMU up), %d runs: p50 %s, all %v", len(runs), p50(runs).Round(time.Millisecond), runs)
	})

	t.Run("stop and remove", func(t *testing.T) {
		pid := vmPid(t, h.opts.StateDir, id)
		h.rt.OnSpec(20, nodespec.Spec{Instances: []nodespec.Instance{vm(20, protocol.InstanceStopped, 256)}})
		h.wait(id, 20, protocol.InstanceStopped, 30*time.Second)
		if alive(pid) {
			t.Errorf("QEMU %d is still there", pid)
		}
		if _, err := os.Stat(filepath.Join(h.opts.StateDir, "instances", id, "disk.qcow2")); err != nil {
			t.Errorf("a stopped VM keeps its disk: %v", err)
		}
		h.rt.OnSpec(21, nodespec.Spec{})
		testutil.Eventually(t, 15*time.Second, "the VM removed", func() bool {
			_, err := os.Stat(filepath.Join(h.opts.StateDir, "instances", id))
			return os.IsNotExist(err)
		})
	})
}

// Package imagetest builds real ramdisk boot pieces for tests that boot a
// machine: a static bcd from this checkout, the base initramfs over the
// kernel `make kernel` cached, and the ISO of one boot.
package imagetest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
)

// RequireBoot skips t unless a machine can boot the ramdisk here: the
// kernel cache of `make kernel` and qemu-system-x86_64. The userland and
// the ISO's bootloader are packages .ci/run installs: their absence fails.
func RequireBoot(t testing.TB) (kernelDir string) {
	t.Helper()
	kernelDir = image.DefaultKernelDir()
	if _, _, err := image.FindKernel(kernelDir); err != nil {
		t.Skipf("no kernel cache (run `make kernel`): %v", err)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64 (Debian package qemu-system-x86)")
	}
	for _, p := range []string{"/bin/busybox", image.DefaultIsolinuxBin, image.DefaultLdlinux} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s is missing (Debian packages busybox-static, isolinux, syslinux-common): %v", p, err)
		}
	}
	if _, err := exec.LookPath("xorriso"); err != nil {
		t.Fatalf("no xorriso (Debian package xorriso): %v", err)
	}
	return kernelDir
}

// Base builds a static bcd and the base pieces into dir, skipping t as
// RequireBoot does. It logs how long each took and the initramfs's size.
func Base(t testing.TB, dir string) *image.Base {
	t.Helper()
	kernelDir := RequireBoot(t)
	bcd := staticBCD(t, dir)
	start := time.Now()
	base, err := image.BuildBase(context.Background(), image.Options{KernelDir: kernelDir, BCD: bcd, OutDir: filepath.Join(dir, "base")})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(base.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("base initramfs (kernel %s, %d modules) built in %s: %.1f MiB",
		base.KernelVersion, len(base.Modules), time.Since(start).Round(time.Millisecond), float64(st.Size())/(1<<20))
	return base
}

// staticBCD builds bcd from this checkout without cgo into dir.
func staticBCD(t testing.TB, dir string) string {
	t.Helper()
	bcd := filepath.Join(dir, "bcd")
	start := time.Now()
	build := exec.Command("go", "build", "-ldflags", "-s -w", "-o", bcd, "github.com/better-compute/better-compute/cmd/bcd")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static bcd: %v: %s", err, out)
	}
	t.Logf("static bcd built in %s", time.Since(start).Round(time.Millisecond))
	return bcd
}

// ISO writes the ISO of one boot of base with cfg into dir.
func ISO(t testing.TB, base *image.Base, cfg protocol.RamdiskBootConfig, dir string) string {
	t.Helper()
	full, err := image.WithConfig(base.Initrd, cfg)
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(dir, "initrd-boot.img")
	if err := os.WriteFile(initrd, full, 0o600); err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(dir, "ramdisk.iso")
	if err := image.ISO(context.Background(), image.ISOOptions{Kernel: base.Kernel, Initrd: initrd, Out: iso}); err != nil {
		t.Fatal(err)
	}
	return iso
}

// Disk builds a static bcd and the test disk into dir (skipping t as
// RequireBoot does, and failing without syslinux or mtools), and logs how
// long it took and its size.
func Disk(t testing.TB, dir string) *image.Disk {
	t.Helper()
	kernelDir := RequireBoot(t)
	if _, err := exec.LookPath("syslinux"); err != nil {
		t.Fatalf("no syslinux (Debian packages syslinux, mtools): %v", err)
	}
	if _, err := exec.LookPath("mcopy"); err != nil {
		t.Fatalf("no mtools, which syslinux installs through (Debian package mtools): %v", err)
	}
	bcd := staticBCD(t, dir)
	start := time.Now()
	d, err := image.BuildDisk(context.Background(), image.DiskOptions{Options: image.Options{KernelDir: kernelDir, BCD: bcd, OutDir: filepath.Join(dir, "disk")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("test disk (kernel %s, %d modules) built in %s: %d MiB", d.KernelVersion, len(d.Modules), time.Since(start).Round(time.Millisecond), d.SizeBytes>>20)
	return d
}

package image_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
)

// requireDiskTools fails without the packages the disk build needs (.ci/run
// installs them).
func requireDiskTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"syslinux", "mcopy"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("no %s (Debian packages syslinux, mtools): %v", tool, err)
		}
	}
	if _, err := os.Stat(image.DefaultMBR); err != nil {
		t.Fatalf("no %s (Debian package syslinux-common): %v", image.DefaultMBR, err)
	}
}

// buildFakeDisk builds the test disk over the fake kernel, with the FAT
// modules the disk adds.
func buildFakeDisk(t *testing.T) *image.Disk {
	t.Helper()
	requireDiskTools(t)
	kdir := fakeKernel(t)
	mod := filepath.Join(kdir, "lib", "modules", testVersion)
	writeModule(t, filepath.Join(mod, "kernel/fs/fat/fat.ko"), "depends=")
	writeModule(t, filepath.Join(mod, "kernel/fs/fat/vfat.ko"), "depends=fat")
	for _, n := range []string{"nls_cp437", "nls_ascii", "nls_utf8", "nls_iso8859-1"} {
		writeModule(t, filepath.Join(mod, "kernel/fs/nls/"+n+".ko"), "depends=")
	}
	bcd := filepath.Join(t.TempDir(), "bcd")
	mustWrite(t, bcd, []byte("#!/bin/true static bcd\n"))
	busybox := filepath.Join(t.TempDir(), "busybox")
	mustWrite(t, busybox, []byte("busybox bytes"))
	d, err := image.BuildDisk(context.Background(), image.DiskOptions{Options: image.Options{
		KernelDir: kdir, BCD: bcd, Busybox: busybox, OutDir: t.TempDir(), Modules: []string{"virtio_net"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// mtype reads a file of the image's boot partition with mtools, as
// syslinux itself reads the filesystem.
func mtype(t *testing.T, img, name string) []byte {
	t.Helper()
	out, err := exec.Command("mtype", "-i", img+"@@1M", "::"+name).Output()
	if err != nil {
		t.Fatalf("mtype %s: %v", name, err)
	}
	return out
}

func TestBuildDiskIsAnMBRWithOneActiveFAT32PartitionThatSyslinuxBoots(t *testing.T) {
	d := buildFakeDisk(t)
	b, err := os.ReadFile(d.Image)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != d.SizeBytes || d.SizeBytes%(1<<20) != 0 || d.SizeBytes < image.MinDiskMiB<<20 {
		t.Fatalf("image %d bytes, reported %d", len(b), d.SizeBytes)
	}
	mbrBin, err := os.ReadFile(image.DefaultMBR)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[:len(mbrBin)], mbrBin) {
		t.Error("the boot code is not syslinux's mbr.bin")
	}
	if b[510] != 0x55 || b[511] != 0xaa {
		t.Error("no MBR signature")
	}
	e := b[446:462]
	if e[0] != 0x80 || e[4] != 0x0c || binary.LittleEndian.Uint32(e[8:]) != 2048 ||
		int64(binary.LittleEndian.Uint32(e[12:])) != d.SizeBytes/512-2048 {
		t.Errorf("partition entry % x, want an active FAT32 LBA partition from 1 MiB to the end", e)
	}
	if !bytes.Equal(b[462:510], make([]byte, 48)) {
		t.Error("more than one partition")
	}
	vbr := b[1<<20 : 1<<20+512]
	if string(vbr[3:11]) != "SYSLINUX" || string(vbr[0x52:0x5a]) != "FAT32   " {
		t.Errorf("the partition's boot sector is %q/%q, want syslinux's on FAT32", vbr[3:11], vbr[0x52:0x5a])
	}

	out, err := exec.Command("mdir", "-a", "-b", "-i", d.Image+"@@1M", "::").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ldlinux.sys", "ldlinux.c32", "vmlinuz", "initrd.img", "syslinux.cfg"} {
		if !strings.Contains(strings.ToLower(string(out)), "::/"+f) {
			t.Errorf("the partition lacks %s: %s", f, out)
		}
	}
	cfg := string(mtype(t, d.Image, image.DiskConfigPath))
	for _, want := range []string{"KERNEL " + image.DiskKernelPath, "INITRD " + image.DiskInitrdPath, "APPEND " + image.DefaultCmdline} {
		if !strings.Contains(cfg, want) {
			t.Errorf("syslinux.cfg lacks %q:\n%s", want, cfg)
		}
	}
	if got := mtype(t, d.Image, image.DiskKernelPath); string(got) != "not really a kernel" {
		t.Errorf("vmlinuz is %q", got)
	}

	files, _ := readArchive(t, mtype(t, d.Image, image.DiskInitrdPath))
	init := string(files["init"].data)
	for _, want := range []string{"udhcpc", "findfs LABEL=" + protocol.SeedLabel, "mount -t vfat -o ro", "/bin/bcd node firstboot --seed " + image.DiskSeedMount} {
		if !strings.Contains(init, want) {
			t.Errorf("the disk's /init lacks %q", want)
		}
	}
	if strings.Contains(init, "bcd ramdisk") {
		t.Error("the disk's /init runs the ramdisk")
	}
	mods := strings.Fields(string(files["etc/bcd/modules"].data))
	iFat := slices.IndexFunc(mods, func(m string) bool { return strings.HasSuffix(m, "/fat.ko") })
	iVfat := slices.IndexFunc(mods, func(m string) bool { return strings.HasSuffix(m, "/vfat.ko") })
	if iFat < 0 || iVfat < iFat || !slices.ContainsFunc(mods, func(m string) bool { return strings.HasSuffix(m, "/nls_cp437.ko") }) {
		t.Errorf("modules %v: want fat before vfat, and the code pages", mods)
	}
}

func TestAddSeedPartitionWritesACIDATAPartitionAfterTheImageThatSeedFSReads(t *testing.T) {
	d := buildFakeDisk(t)
	img, err := os.ReadFile(d.Image)
	if err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(t.TempDir(), "disk.raw")
	f, err := os.Create(disk)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(d.SizeBytes + 64<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(img, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()

	if _, _, err := image.SeedFS(disk); !errors.Is(err, image.ErrNoSeed) {
		t.Fatalf("the image alone: %v, want ErrNoSeed", err)
	}
	join := []byte(`{"apiUrl":"http://10.0.2.2:1","token":"bcbt_x"}`)
	if err := image.AddSeedPartition(disk, 40, map[string][]byte{protocol.SeedJoinFile: join, "meta-data": []byte("instance-id: wf_1\n")}); err != nil {
		t.Fatal(err)
	}
	after, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	// Only the second partition entry changed in the image's bytes.
	if !bytes.Equal(after[:462], img[:462]) || !bytes.Equal(after[478:len(img)], img[478:]) {
		t.Error("adding the seed changed the image")
	}
	e := after[462:478]
	if e[4] != 0x0c || int64(binary.LittleEndian.Uint32(e[8:]))*512 != d.SizeBytes || binary.LittleEndian.Uint32(e[12:]) != 40<<20/512 {
		t.Errorf("seed entry % x, want 40 MiB of FAT32 right after the image", e)
	}
	fsys, closeFS, err := image.SeedFS(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFS()
	got, err := fs.ReadFile(fsys, protocol.SeedJoinFile)
	if err != nil || !bytes.Equal(got, join) {
		t.Errorf("%s: %q, %v", protocol.SeedJoinFile, got, err)
	}
	// Linux finds it by the label mtools reads too.
	out, err := exec.Command("mlabel", "-s", "-i", disk+"@@"+strconv.FormatInt(d.SizeBytes, 10), "::").CombinedOutput()
	if err != nil || !strings.Contains(string(out), protocol.SeedLabel) {
		t.Errorf("mlabel: %s, %v", out, err)
	}

	if err := image.AddSeedPartition(disk, 40, nil); err == nil {
		t.Error("a second 40 MiB seed fit in the 24 MiB left")
	}
	empty := filepath.Join(t.TempDir(), "empty.raw")
	if err := os.WriteFile(empty, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := image.SeedFS(empty); !errors.Is(err, image.ErrNoSeed) {
		t.Errorf("an empty disk: %v, want ErrNoSeed", err)
	}
}

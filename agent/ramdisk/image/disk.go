package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/partition/mbr"
)

// Where Debian's syslinux-common puts the BIOS master boot record that
// chain-loads the active partition.
const DefaultMBR = "/usr/lib/syslinux/mbr/mbr.bin"

// Paths on the test disk's boot partition.
const (
	DiskKernelPath = "/vmlinuz"
	DiskInitrdPath = "/initrd.img"
	DiskConfigPath = "/syslinux.cfg"
)

// Where the test disk's /init mounts the seed and keeps bcd's state (the
// disk itself stays read-only to the system).
const (
	DiskSeedMount = "/run/seed"
	DiskStateDir  = "/run/bcd/state"
)

// DiskLabel is the boot partition's FAT label.
const DiskLabel = "BCDDISK"

// diskPartitionStart is the boot partition's first sector (1 MiB, the usual
// alignment; the gap holds only the MBR).
const diskPartitionStart = 2048

const sectorSize = 512

// DiskModules are the modules the test disk loads on top of
// DefaultModules: the seed is a FAT filesystem, which the cloud kernel
// builds as modules, with the code pages its mount options name.
func DiskModules() []string {
	return []string{"vfat", "nls_cp437", "nls_ascii", "nls_utf8", "nls_iso8859_1"}
}

// MinDiskMiB is the smallest image (and seed partition): go-diskfs writes
// FAT32 with one 512-byte sector a cluster, and syslinux, mtools and the
// specification call a FAT with fewer than 65525 clusters FAT12/16
// whatever its boot sector says.
const MinDiskMiB = 40

// DiskOptions configures BuildDisk.
type DiskOptions struct {
	// Options are the initramfs's (KernelDir, BCD, Busybox, Modules) and
	// OutDir, which receives vmlinuz, initrd.img and disk.img.
	Options
	// SizeMiB is the image's size; 0 fits its contents with a little room.
	// The machine's disk is bigger: a deploy writes its seed partition in
	// the space after the image.
	SizeMiB int
	// Cmdline is the kernel command line; "" means DefaultCmdline.
	Cmdline string
	// Syslinux and MBR override Debian's syslinux installer and
	// syslinux-common's mbr.bin.
	Syslinux string
	MBR      string
}

// Disk is a built test disk.
type Disk struct {
	*Base
	// Image is the raw disk image: an MBR and one bootable FAT partition.
	Image string
	// SizeBytes is the image's size.
	SizeBytes int64
}

// BuildDisk writes a small BIOS-bootable disk image into o.OutDir: an MBR
// (syslinux's mbr.bin and a partition table) and one active FAT32
// partition holding the kernel, an initramfs whose /init brings the network
// up, mounts the partition labelled protocol.SeedLabel read-only and runs
// `bcd node firstboot` on it, and syslinux, installed with
// `syslinux --install --offset` (through mtools: no mount, no loop device,
// no root). The filesystem and partition table are written with go-diskfs.
func BuildDisk(ctx context.Context, o DiskOptions) (*Disk, error) {
	if o.OutDir == "" {
		return nil, errors.New("image: OutDir is required")
	}
	cmdline := firstNonEmpty(o.Cmdline, DefaultCmdline)
	if strings.ContainsAny(cmdline, "\n\r") {
		return nil, errors.New("image: the kernel command line is one line")
	}
	syslinux := o.Syslinux
	if syslinux == "" {
		p, err := exec.LookPath("syslinux")
		if err != nil {
			return nil, fmt.Errorf("image: the test disk needs syslinux and mtools (Debian packages syslinux, mtools): %w", err)
		}
		syslinux = p
	}
	mbrBin, err := os.ReadFile(firstNonEmpty(o.MBR, DefaultMBR))
	if err != nil {
		return nil, fmt.Errorf("image: the test disk needs syslinux-common's mbr.bin: %w", err)
	}
	if len(mbrBin) > 440 {
		return nil, fmt.Errorf("image: %s is %d bytes, more than an MBR's boot code", firstNonEmpty(o.MBR, DefaultMBR), len(mbrBin))
	}
	base, err := buildInitramfs(ctx, o.Options, diskInitScript, DiskModules())
	if err != nil {
		return nil, err
	}
	var payload int64
	for _, p := range []string{base.Kernel, base.Initrd} {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
		payload += st.Size()
	}
	size := int64(o.SizeMiB) << 20
	if size == 0 {
		// FAT32's tables, syslinux's files and slack: a quarter more.
		size = max((payload+payload/4+(4<<20)+(1<<20)-1)>>20<<20, MinDiskMiB<<20)
	}
	if size < MinDiskMiB<<20 || size < payload+(2<<20) {
		return nil, fmt.Errorf("image: %d MiB cannot hold the kernel and initramfs (%d bytes)", size>>20, payload)
	}

	img := filepath.Join(o.OutDir, "disk.img")
	tmp := img + ".tmp"
	_ = os.Remove(tmp)
	if err := writeDiskImage(tmp, size, mbrBin, map[string]string{
		DiskKernelPath: base.Kernel,
		DiskInitrdPath: base.Initrd,
	}, syslinuxConfig(cmdline)); err != nil {
		os.Remove(tmp)
		return nil, err
	}
	cmd := exec.CommandContext(ctx, syslinux, "--install", "--offset", fmt.Sprint(diskPartitionStart*sectorSize), tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("image: syslinux --install: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, img); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return &Disk{Base: base, Image: img, SizeBytes: size}, nil
}

func syslinuxConfig(cmdline string) string {
	return fmt.Sprintf("DEFAULT bcd\nPROMPT 0\nTIMEOUT 0\nLABEL bcd\n  KERNEL %s\n  INITRD %s\n  APPEND %s\n",
		DiskKernelPath, DiskInitrdPath, cmdline)
}

// writeDiskImage creates the image: the boot code, a partition table with
// one active FAT32 partition over the rest of the image, and its files.
func writeDiskImage(path string, size int64, bootCode []byte, files map[string]string, config string) error {
	d, err := diskfs.Create(path, size, diskfs.SectorSize512)
	if err != nil {
		return fmt.Errorf("image: create %s: %w", path, err)
	}
	defer d.Close()
	table := &mbr.Table{
		LogicalSectorSize:  sectorSize,
		PhysicalSectorSize: sectorSize,
		Partitions: []*mbr.Partition{{
			Index:    1,
			Bootable: true,
			Type:     mbr.Fat32LBA,
			Start:    diskPartitionStart,
			Size:     uint32(size/sectorSize - diskPartitionStart),
		}},
	}
	if err := d.Partition(table); err != nil {
		return fmt.Errorf("image: partition table: %w", err)
	}
	fs, err := d.CreateFilesystem(disk.FilesystemSpec{Partition: 1, FSType: filesystem.TypeFat32, VolumeLabel: DiskLabel, Reproducible: true})
	if err != nil {
		return fmt.Errorf("image: FAT32: %w", err)
	}
	for dst, src := range files {
		if err := copyInto(fs, dst, src); err != nil {
			return err
		}
	}
	if err := writeInto(fs, DiskConfigPath, strings.NewReader(config)); err != nil {
		return err
	}
	// The partition table write leaves the boot code alone: syslinux's
	// MBR goes before it, in the first 440 bytes.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if _, err := f.WriteAt(bootCode, 0); err != nil {
		f.Close()
		return fmt.Errorf("image: boot code: %w", err)
	}
	return f.Close()
}

func copyInto(fs filesystem.FileSystem, dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer in.Close()
	return writeInto(fs, dst, in)
}

func writeInto(fs filesystem.FileSystem, dst string, r io.Reader) error {
	out, err := fs.OpenFile(dst, os.O_CREATE|os.O_RDWR)
	if err != nil {
		return fmt.Errorf("image: %s: %w", dst, err)
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return fmt.Errorf("image: write %s: %w", dst, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("image: write %s: %w", dst, err)
	}
	return nil
}

package image

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/partition/mbr"

	"github.com/better-compute/better-compute/agent/protocol"
)

// ErrNoSeed is SeedFS's error for a disk with no partition labelled
// protocol.SeedLabel (an empty disk, or one no deploy wrote a seed to).
var ErrNoSeed = errors.New("image: the disk holds no " + protocol.SeedLabel + " seed partition")

// AddSeedPartition adds a FAT32 partition of sizeMiB (at least MinDiskMiB) labelled
// protocol.SeedLabel after the last partition of the MBR disk image file
// diskFile (1 MiB aligned), holding files (slash-separated paths relative
// to its root). The rest of the disk is left as it is.
func AddSeedPartition(diskFile string, sizeMiB int, files map[string][]byte) error {
	d, err := diskfs.Open(diskFile, diskfs.WithOpenMode(diskfs.ReadWriteExclusive))
	if err != nil {
		return fmt.Errorf("image: open %s: %w", diskFile, err)
	}
	defer d.Close()
	table, err := mbrTable(d)
	if err != nil {
		return err
	}
	var end uint64 = diskPartitionStart
	slot := -1
	for i, p := range table.Partitions {
		if p.Type == mbr.Empty {
			if slot < 0 {
				slot = i
			}
			continue
		}
		end = max(end, uint64(p.Start)+uint64(p.Size))
	}
	if slot < 0 && len(table.Partitions) < 4 {
		slot = len(table.Partitions)
		table.Partitions = append(table.Partitions, nil)
	}
	if slot < 0 {
		return fmt.Errorf("image: %s has four partitions already", diskFile)
	}
	if sizeMiB < MinDiskMiB {
		return fmt.Errorf("image: a seed partition of %d MiB is smaller than FAT32's %d", sizeMiB, MinDiskMiB)
	}
	start := (end + diskPartitionStart - 1) / diskPartitionStart * diskPartitionStart
	sectors := uint64(sizeMiB) << 20 / sectorSize
	if (start+sectors)*sectorSize > uint64(d.Size) {
		return fmt.Errorf("image: %s (%d MiB) has no %d MiB free after its partitions", diskFile, d.Size>>20, sizeMiB)
	}
	table.Partitions[slot] = &mbr.Partition{Index: slot + 1, Type: mbr.Fat32LBA, Start: uint32(start), Size: uint32(sectors)}
	if err := d.Partition(table); err != nil {
		return fmt.Errorf("image: partition table: %w", err)
	}
	fsys, err := d.CreateFilesystem(disk.FilesystemSpec{Partition: slot + 1, FSType: filesystem.TypeFat32, VolumeLabel: protocol.SeedLabel})
	if err != nil {
		return fmt.Errorf("image: seed FAT32: %w", err)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	made := map[string]bool{}
	for _, n := range names {
		p := "/" + strings.TrimPrefix(path.Clean("/"+n), "/")
		if dir := path.Dir(p); dir != "/" && !made[dir] {
			if err := fsys.Mkdir(dir); err != nil {
				return fmt.Errorf("image: seed %s: %w", dir, err)
			}
			made[dir] = true
		}
		if err := writeInto(fsys, p, bytes.NewReader(files[n])); err != nil {
			return err
		}
	}
	return nil
}

// SeedFS opens the seed partition of a disk image file (read-only): the
// partition of its MBR or GPT whose FAT label is protocol.SeedLabel, as an
// fs.FS. ErrNoSeed when there is none. close releases the file.
func SeedFS(diskFile string) (fsys fs.FS, close func() error, err error) {
	d, err := diskfs.Open(diskFile, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		return nil, nil, fmt.Errorf("image: open %s: %w", diskFile, err)
	}
	table, err := d.GetPartitionTable()
	if err != nil {
		// No MBR or GPT: an empty disk, or one no image was written to.
		d.Close()
		return nil, nil, ErrNoSeed
	}
	for _, p := range table.GetPartitions() {
		if p.GetSize() == 0 {
			continue
		}
		f, err := d.GetFilesystem(p.GetIndex())
		if err != nil {
			continue
		}
		if strings.TrimSpace(f.Label()) == protocol.SeedLabel {
			return f, d.Close, nil
		}
	}
	d.Close()
	return nil, nil, ErrNoSeed
}

var errNoTable = errors.New("image: no MBR partition table")

func mbrTable(d *disk.Disk) (*mbr.Table, error) {
	t, err := d.GetPartitionTable()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoTable, err)
	}
	table, ok := t.(*mbr.Table)
	if !ok {
		return nil, fmt.Errorf("image: the disk's partition table is %s, not MBR", t.Type())
	}
	return table, nil
}

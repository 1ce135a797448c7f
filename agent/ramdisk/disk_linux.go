//go:build linux

package ramdisk

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// blockDisk is a block device opened exclusively (O_EXCL fails while a
// partition of it is mounted or held).
type blockDisk struct {
	f    *os.File
	size int64
}

func openBlockDisk(path string) (*blockDisk, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_EXCL, 0)
	if err != nil {
		return nil, err
	}
	// A block device's end is its size.
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: size: %w", path, err)
	}
	return &blockDisk{f: f, size: size}, nil
}

func (d *blockDisk) ReadAt(p []byte, off int64) (int, error)  { return d.f.ReadAt(p, off) }
func (d *blockDisk) WriteAt(p []byte, off int64) (int, error) { return d.f.WriteAt(p, off) }
func (d *blockDisk) Size() int64                              { return d.size }
func (d *blockDisk) Close() error                             { return d.f.Close() }

// Sync flushes the device and has the kernel re-read its partition table,
// so the partitions an image or a seed brought are there (and the next
// step, or the installed system's first boot, finds them). A disk without
// a partition table answers EINVAL, which is fine.
func (d *blockDisk) Sync() error {
	if err := d.f.Sync(); err != nil {
		return err
	}
	if err := unix.IoctlSetInt(int(d.f.Fd()), unix.BLKRRPART, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("re-read partitions: %w", err)
	}
	return nil
}

// reboot flushes the filesystems and restarts the machine; it returns only
// when the kernel refused.
func reboot() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
}

//go:build linux

package ramdisk

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// wipeSpan is how much is zeroed at each end of a disk and of each of its
// partitions: MBR and GPT (primary at the start, backup at the end), and
// the superblocks of the usual filesystems, LVM, md and ZFS labels lie
// within the first or the last MiB.
const wipeSpan = 1 << 20

// wipeDisk zeroes both ends of every partition and then of the whole disk,
// flushes, and asks the kernel to re-read the (now empty) partition table.
func wipeDisk(dev, sys, name string) (partitions int, err error) {
	sysDir := filepath.Join(sys, "block", name)
	sectors, err := readSectors(filepath.Join(sysDir, "size"))
	if err != nil {
		return 0, fmt.Errorf("wipe %s: %w", name, err)
	}
	f, err := os.OpenFile(joinDev(dev, name), os.O_WRONLY|unix.O_EXCL, 0)
	if err != nil {
		return 0, fmt.Errorf("wipe %s: %w", name, err)
	}
	defer f.Close()
	entries, _ := os.ReadDir(sysDir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), name) {
			continue
		}
		start, err1 := readSectors(filepath.Join(sysDir, e.Name(), "start"))
		size, err2 := readSectors(filepath.Join(sysDir, e.Name(), "size"))
		if err1 != nil || err2 != nil {
			continue
		}
		if err := zeroEnds(f, start*512, size*512); err != nil {
			return partitions, fmt.Errorf("wipe %s: partition %s: %w", name, e.Name(), err)
		}
		partitions++
	}
	if err := zeroEnds(f, 0, sectors*512); err != nil {
		return partitions, fmt.Errorf("wipe %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		return partitions, fmt.Errorf("wipe %s: sync: %w", name, err)
	}
	// Without it the kernel keeps the old partitions until the next boot.
	// A disk without a partition table answers EINVAL, which is fine.
	if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0); err != nil && err != unix.EINVAL {
		return partitions, fmt.Errorf("wipe %s: re-read partitions: %w", name, err)
	}
	return partitions, nil
}

// zeroEnds zeroes the first and last wipeSpan bytes of [off, off+size).
func zeroEnds(f *os.File, off, size int64) error {
	if size <= 0 {
		return nil
	}
	n := min(int64(wipeSpan), size)
	zeros := make([]byte, n)
	if _, err := f.WriteAt(zeros, off); err != nil {
		return err
	}
	if _, err := f.WriteAt(zeros, off+size-n); err != nil {
		return err
	}
	return nil
}

func readSectors(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// powerOff flushes the filesystems and powers off; it returns only when the
// kernel refused.
func powerOff() error {
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}

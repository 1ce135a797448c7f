// Command testdisk builds the small bootable test disk (an MBR, one FAT32
// partition with syslinux, Debian's kernel and an initramfs whose /init runs
// `bcd node firstboot` on the disk's seed) from an unpacked Debian kernel
// package and a static bcd; `make testdisk` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/better-compute/better-compute/agent/ramdisk/image"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testdisk:", err)
		os.Exit(1)
	}
}

func run() error {
	var o image.DiskOptions
	flag.StringVar(&o.KernelDir, "kernel-dir", "", "unpacked Debian kernel package (boot/, lib/modules/)")
	flag.StringVar(&o.BCD, "bcd", "", "statically linked bcd (CGO_ENABLED=0)")
	flag.StringVar(&o.Busybox, "busybox", "", "static busybox (default /bin/busybox from busybox-static)")
	flag.StringVar(&o.OutDir, "out", "", "directory to write disk.img (and its vmlinuz and initrd.img) into")
	flag.IntVar(&o.SizeMiB, "size-mib", 0, "the image's size (default: its contents with a little room)")
	flag.StringVar(&o.Cmdline, "cmdline", image.DefaultCmdline, "kernel command line")
	flag.Parse()
	start := time.Now()
	d, err := image.BuildDisk(context.Background(), o)
	if err != nil {
		return err
	}
	fmt.Printf("disk %s: %d MiB (kernel %s, %d modules), built in %s\n",
		d.Image, d.SizeBytes>>20, d.KernelVersion, len(d.Modules), time.Since(start).Round(time.Millisecond))
	return nil
}

// Command ramdisk builds the ramdisk's base boot pieces (vmlinuz and the
// base initrd.img) from an unpacked Debian kernel package and a static bcd,
// and optionally an ISO of them with one boot's configuration; `make
// ramdisk` runs it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ramdisk:", err)
		os.Exit(1)
	}
}

func run() error {
	var o image.Options
	var iso, bootConfig, cmdline string
	flag.StringVar(&o.KernelDir, "kernel-dir", "", "unpacked Debian kernel package (boot/, lib/modules/)")
	flag.StringVar(&o.BCD, "bcd", "", "statically linked bcd (CGO_ENABLED=0)")
	flag.StringVar(&o.Busybox, "busybox", "", "static busybox (default /bin/busybox from busybox-static)")
	flag.StringVar(&o.OutDir, "out", "", "directory to write vmlinuz and initrd.img into")
	flag.StringVar(&iso, "iso", "", "also write a bootable ISO here")
	flag.StringVar(&bootConfig, "boot-config", "", "RamdiskBootConfig JSON file to append to the ISO's initrd")
	flag.StringVar(&cmdline, "cmdline", image.DefaultCmdline, "kernel command line of the ISO")
	flag.Parse()

	ctx := context.Background()
	start := time.Now()
	base, err := image.BuildBase(ctx, o)
	if err != nil {
		return err
	}
	st, err := os.Stat(base.Initrd)
	if err != nil {
		return err
	}
	fmt.Printf("kernel %s: %s\ninitrd %s: %d bytes, %d modules, built in %s\n",
		base.KernelVersion, base.Kernel, base.Initrd, st.Size(), len(base.Modules), time.Since(start).Round(time.Millisecond))
	if iso == "" {
		return nil
	}
	initrd := base.Initrd
	if bootConfig != "" {
		var cfg protocol.RamdiskBootConfig
		b, err := os.ReadFile(bootConfig)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &cfg); err != nil {
			return fmt.Errorf("%s: %w", bootConfig, err)
		}
		full, err := image.WithConfig(base.Initrd, cfg)
		if err != nil {
			return err
		}
		initrd = filepath.Join(o.OutDir, "initrd-boot.img")
		if err := os.WriteFile(initrd, full, 0o600); err != nil {
			return err
		}
	}
	if err := image.ISO(ctx, image.ISOOptions{Kernel: base.Kernel, Initrd: initrd, Cmdline: cmdline, Out: iso}); err != nil {
		return err
	}
	fmt.Printf("iso %s\n", iso)
	return nil
}

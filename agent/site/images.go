package site

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
)

// RamdiskImages builds boots' pieces with agent/ramdisk/image from a
// kernel and a base initramfs (`make ramdisk` builds both).
type RamdiskImages struct {
	// KernelPath and BasePath are the kernel image and the base initramfs.
	KernelPath string
	BasePath   string
	// KernelCmdline is the kernel command line; "" means
	// image.DefaultCmdline.
	KernelCmdline string
}

var _ Images = RamdiskImages{}

// NewRamdiskImages checks that the kernel and the base initramfs exist.
func NewRamdiskImages(kernel, base, cmdline string) (RamdiskImages, error) {
	if kernel == "" || base == "" {
		return RamdiskImages{}, errors.New("site: a ramdisk needs both the kernel and the base initramfs")
	}
	for _, p := range []string{kernel, base} {
		if _, err := os.Stat(p); err != nil {
			return RamdiskImages{}, fmt.Errorf("site: %w", err)
		}
	}
	return RamdiskImages{KernelPath: kernel, BasePath: base, KernelCmdline: cmdline}, nil
}

// Kernel is the kernel image's path.
func (r RamdiskImages) Kernel() string { return r.KernelPath }

// Cmdline is the ramdisk's kernel command line.
func (r RamdiskImages) Cmdline() string {
	if r.KernelCmdline == "" {
		return image.DefaultCmdline
	}
	return r.KernelCmdline
}

// Initrd writes the base initramfs followed by cfg's appendix to out,
// readable by this user only: it holds the boot's token.
func (r RamdiskImages) Initrd(cfg protocol.RamdiskBootConfig, out string) error {
	app, err := image.Appendix(cfg)
	if err != nil {
		return err
	}
	base, err := os.Open(r.BasePath)
	if err != nil {
		return fmt.Errorf("site: the base initramfs: %w", err)
	}
	defer base.Close()
	tmp := out + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("site: %w", err)
	}
	_, err = io.Copy(f, base)
	if err == nil {
		_, err = f.Write(app)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, out)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("site: write the initrd: %w", err)
	}
	return nil
}

// ISO writes a bootable CD of the kernel, the initrd and the command line.
func (r RamdiskImages) ISO(ctx context.Context, initrd, out string) error {
	if err := image.ISO(ctx, image.ISOOptions{Kernel: r.KernelPath, Initrd: initrd, Cmdline: r.Cmdline(), Out: out}); err != nil {
		return err
	}
	// The ISO holds the boot's token too.
	return os.Chmod(out, 0o600)
}

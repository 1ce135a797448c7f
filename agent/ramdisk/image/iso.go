package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Where Debian's isolinux and syslinux-common packages put the BIOS
// bootloader of a CD.
const (
	DefaultIsolinuxBin = "/usr/lib/ISOLINUX/isolinux.bin"
	DefaultLdlinux     = "/usr/lib/syslinux/modules/bios/ldlinux.c32"
)

// ISOOptions configures ISO.
type ISOOptions struct {
	// Kernel and Initrd are the files to boot; Initrd is usually a base
	// initramfs with a boot's appendix (WithConfig).
	Kernel string
	Initrd string
	// Cmdline is the kernel command line; "" means DefaultCmdline.
	Cmdline string
	// Out is the ISO file to write.
	Out string
	// IsolinuxBin and Ldlinux override the bootloader's files.
	IsolinuxBin string
	Ldlinux     string
}

// ISO writes a CD image that a PC BIOS boots (isolinux, El Torito,
// no emulation) into the kernel and initrd with the command line, and that
// holds them at ISOKernelPath, ISOInitrdPath and ISOCmdlinePath for
// machines that boot its contents directly. It runs xorriso.
func ISO(ctx context.Context, o ISOOptions) error {
	if o.Kernel == "" || o.Initrd == "" || o.Out == "" {
		return errors.New("image: ISO needs Kernel, Initrd and Out")
	}
	cmdline := o.Cmdline
	if cmdline == "" {
		cmdline = DefaultCmdline
	}
	if strings.ContainsAny(cmdline, "\n\r") {
		return errors.New("image: the kernel command line is one line")
	}
	isolinux := firstNonEmpty(o.IsolinuxBin, DefaultIsolinuxBin)
	ldlinux := firstNonEmpty(o.Ldlinux, DefaultLdlinux)
	xorriso, err := exec.LookPath("xorriso")
	if err != nil {
		return fmt.Errorf("image: ISO needs xorriso (Debian package xorriso): %w", err)
	}

	// The initrd of a boot holds its token: the staging directory and the
	// image are readable by their owner only.
	stage, err := os.MkdirTemp(filepath.Dir(o.Out), ".iso-stage-")
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer os.RemoveAll(stage)
	for _, d := range []string{"boot", "isolinux"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			return fmt.Errorf("image: %w", err)
		}
	}
	copies := []struct{ src, dst string }{
		{o.Kernel, ISOKernelPath},
		{o.Initrd, ISOInitrdPath},
		{isolinux, "/isolinux/isolinux.bin"},
		{ldlinux, "/isolinux/ldlinux.c32"},
	}
	for _, c := range copies {
		if err := copyFile(filepath.Join(stage, c.dst), c.src, 0o600); err != nil {
			if errors.Is(err, os.ErrNotExist) && (c.src == isolinux || c.src == ldlinux) {
				return fmt.Errorf("image: ISO needs Debian's isolinux and syslinux-common packages: %w", err)
			}
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(stage, ISOCmdlinePath), []byte(cmdline+"\n"), 0o644); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	cfg := fmt.Sprintf("DEFAULT bcd\nPROMPT 0\nTIMEOUT 0\nLABEL bcd\n  KERNEL %s\n  INITRD %s\n  APPEND %s\n",
		ISOKernelPath, ISOInitrdPath, cmdline)
	if err := os.WriteFile(filepath.Join(stage, "isolinux", "isolinux.cfg"), []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("image: %w", err)
	}

	tmp := o.Out + ".tmp"
	cmd := exec.CommandContext(ctx, xorriso, "-as", "mkisofs",
		"-quiet", "-o", tmp, "-R", "-V", "BCD_RAMDISK",
		"-b", "isolinux/isolinux.bin", "-c", "isolinux/boot.cat",
		"-no-emul-boot", "-boot-load-size", "4", "-boot-info-table",
		stage)
	// Fixed timestamps make the same inputs give the same image.
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("image: xorriso: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("image: %w", err)
	}
	if err := os.Rename(tmp, o.Out); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

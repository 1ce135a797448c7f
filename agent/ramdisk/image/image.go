// Package image assembles the boot pieces of the ramdisk: the shared base
// initramfs (busybox, a static bcd, the kernel modules it needs, /init), the
// small per-boot appendix that carries one boot's RamdiskBootConfig, and a
// bootable ISO holding the kernel, the initrd and the command line.
//
// Linux unpacks every cpio archive concatenated in an initrd over the same
// root, so the appendix is a second archive written after the base one:
// the base is built once per kernel and bcd version and shared by every
// boot, and a boot token is never baked into a shared file.
package image

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/cavaliergopher/cpio"

	"github.com/better-compute/better-compute/agent/protocol"
)

// Paths inside the ISO. The emulated machines' direct boot mode reads
// exactly these, so they are part of the contract with drivers/machines.
const (
	ISOKernelPath  = "/boot/vmlinuz"
	ISOInitrdPath  = "/boot/initrd.img"
	ISOCmdlinePath = "/boot/cmdline.txt"
)

// Paths inside the initramfs.
const (
	InitPath       = "/init"
	BusyboxPath    = "/bin/busybox"
	BCDPath        = "/bin/bcd"
	ModulesList    = "/etc/bcd/modules"
	UdhcpcScript   = "/etc/bcd/udhcpc.script"
	moduleRootPath = "/lib/modules"
)

// DefaultModules are the drivers a ramdisk needs on the emulated machines
// and on common virtual hardware, when the kernel builds them as modules:
// virtio NIC, disks and entropy, and the PC's IDE and SCSI disks. Their
// dependencies are added from each module's own modinfo.
func DefaultModules() []string {
	return []string{
		"virtio_pci", "virtio_net", "virtio_blk", "virtio_scsi", "virtio_rng",
		"sd_mod", "ata_piix",
	}
}

// DefaultCmdline is the kernel command line of a ramdisk boot: the console
// on the first serial port (the BMC's serial log), quiet so that bcd's own
// lines stand out, and a reboot rather than a hang on a panic.
const DefaultCmdline = "console=ttyS0,115200 quiet loglevel=3 panic=-1"

// Options configures BuildBase.
type Options struct {
	// KernelDir is a Debian kernel package unpacked with `dpkg -x`: it holds
	// boot/vmlinuz-<version> and lib/modules/<version>.
	KernelDir string
	// BCD is a statically linked bcd (CGO_ENABLED=0).
	BCD string
	// Busybox is a static busybox; "" means Debian's busybox-static at
	// /bin/busybox.
	Busybox string
	// Modules to load at boot, in order; nil means DefaultModules(). A
	// module the kernel has built in is skipped.
	Modules []string
	// OutDir receives vmlinuz and initrd.img.
	OutDir string
}

// Base is a built base image.
type Base struct {
	// Kernel is the path of the kernel image copied to OutDir.
	Kernel string
	// Initrd is the path of the gzipped base initramfs.
	Initrd string
	// KernelVersion is the modules directory's name, e.g. 6.1.0-57-cloud-amd64.
	KernelVersion string
	// Modules lists the module files in load order (paths in the initramfs).
	Modules []string
}

// epochSeconds is the modification time of every archived file, so that
// the same inputs give the same bytes.
const epochSeconds = 1

// BuildBase writes the kernel and the base initramfs into o.OutDir.
func BuildBase(ctx context.Context, o Options) (*Base, error) {
	return buildInitramfs(ctx, o, initScript, nil)
}

// buildInitramfs writes the kernel and an initramfs with init as /init
// and o.Modules (DefaultModules when nil) plus extra loaded at boot.
func buildInitramfs(ctx context.Context, o Options, init string, extra []string) (*Base, error) {
	if o.KernelDir == "" || o.BCD == "" || o.OutDir == "" {
		return nil, errors.New("image: KernelDir, BCD and OutDir are required")
	}
	busybox := o.Busybox
	if busybox == "" {
		busybox = "/bin/busybox"
	}
	modules := o.Modules
	if modules == nil {
		modules = DefaultModules()
	}
	modules = append(append([]string(nil), modules...), extra...)
	kernel, version, err := FindKernel(o.KernelDir)
	if err != nil {
		return nil, err
	}
	modDir := filepath.Join(o.KernelDir, "lib", "modules", version)
	order, err := ResolveModules(modDir, modules)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("image: build base: %w", err)
	}

	a := newArchive()
	for _, d := range []string{"/bin", "/dev", "/etc", "/etc/bcd", "/proc", "/sys", "/run", "/tmp", "/lib", moduleRootPath} {
		a.dir(d)
	}
	a.symlink("/bin/sh", "busybox")
	if err := a.file(BusyboxPath, 0o755, fileSource(busybox)); err != nil {
		return nil, err
	}
	if err := a.file(BCDPath, 0o755, fileSource(o.BCD)); err != nil {
		return nil, err
	}
	a.bytes(InitPath, 0o755, []byte(init))
	a.bytes(UdhcpcScript, 0o755, []byte(udhcpcScript))
	var inImage []string
	for _, rel := range order {
		p := path.Join(moduleRootPath, version, filepath.ToSlash(rel))
		a.parents(p)
		if err := a.file(p, 0o644, fileSource(filepath.Join(modDir, rel))); err != nil {
			return nil, err
		}
		inImage = append(inImage, p)
	}
	list := strings.Join(inImage, "\n")
	if list != "" {
		list += "\n"
	}
	a.bytes(ModulesList, 0o644, []byte(list))

	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	initrd := filepath.Join(o.OutDir, "initrd.img")
	if err := writeGzipFile(initrd, a); err != nil {
		return nil, err
	}
	kernelOut := filepath.Join(o.OutDir, "vmlinuz")
	if err := copyFile(kernelOut, kernel, 0o644); err != nil {
		return nil, err
	}
	return &Base{Kernel: kernelOut, Initrd: initrd, KernelVersion: version, Modules: inImage}, nil
}

// FindKernel returns the kernel image of an unpacked kernel package and the
// version of its modules directory.
func FindKernel(kernelDir string) (vmlinuz, version string, err error) {
	matches, err := filepath.Glob(filepath.Join(kernelDir, "boot", "vmlinuz-*"))
	if err != nil || len(matches) == 0 {
		return "", "", fmt.Errorf("image: no boot/vmlinuz-* under %s (run `make kernel`)", kernelDir)
	}
	sort.Strings(matches)
	vmlinuz = matches[len(matches)-1]
	version = strings.TrimPrefix(filepath.Base(vmlinuz), "vmlinuz-")
	if _, err := os.Stat(filepath.Join(kernelDir, "lib", "modules", version)); err != nil {
		return "", "", fmt.Errorf("image: kernel %s has no modules: %w", version, err)
	}
	return vmlinuz, version, nil
}

// Appendix is the per-boot archive: /etc/bcd/boot.json holding cfg,
// gzipped, to be concatenated after a base initramfs.
func Appendix(cfg protocol.RamdiskBootConfig) ([]byte, error) {
	body, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("image: encode boot config: %w", err)
	}
	a := newArchive()
	a.parents(protocol.RamdiskBootConfigPath)
	// Readable by root only: it holds the boot token.
	a.bytes(protocol.RamdiskBootConfigPath, 0o600, body)
	var buf bytes.Buffer
	if err := writeGzip(&buf, a); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WithConfig returns the base initramfs at basePath followed by the
// appendix of cfg: the initrd of one boot.
func WithConfig(basePath string, cfg protocol.RamdiskBootConfig) ([]byte, error) {
	base, err := os.ReadFile(basePath)
	if err != nil {
		return nil, fmt.Errorf("image: read base initramfs: %w", err)
	}
	app, err := Appendix(cfg)
	if err != nil {
		return nil, err
	}
	return append(base, app...), nil
}

// The archive is kept in memory as entries sorted by path when written, so
// that the order of calls does not change the bytes.
type entry struct {
	hdr  cpio.Header
	open func() (io.ReadCloser, int64, error)
	data []byte
}

type archive struct {
	entries map[string]*entry
}

func newArchive() *archive { return &archive{entries: map[string]*entry{}} }

func (a *archive) dir(p string) {
	a.entries[p] = &entry{hdr: cpio.Header{Name: p, Mode: cpio.TypeDir | 0o755, Links: 2}}
}

// parents adds the directories above p.
func (a *archive) parents(p string) {
	for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
		if _, ok := a.entries[d]; !ok {
			a.dir(d)
		}
	}
}

func (a *archive) symlink(p, target string) {
	a.entries[p] = &entry{hdr: cpio.Header{Name: p, Mode: cpio.TypeSymlink | 0o777, Links: 1, Linkname: target}}
}

func (a *archive) bytes(p string, mode cpio.FileMode, b []byte) {
	a.entries[p] = &entry{hdr: cpio.Header{Name: p, Mode: cpio.TypeReg | mode, Links: 1, Size: int64(len(b))}, data: b}
}

type source func() (io.ReadCloser, int64, error)

func fileSource(p string) source {
	return func() (io.ReadCloser, int64, error) {
		f, err := os.Open(p)
		if err != nil {
			return nil, 0, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, err
		}
		return f, st.Size(), nil
	}
}

// file adds a file read when the archive is written; its size is checked
// now so that a missing input fails early with its name.
func (a *archive) file(p string, mode cpio.FileMode, src source) error {
	r, size, err := src()
	if err != nil {
		return fmt.Errorf("image: %s: %w", p, err)
	}
	r.Close()
	a.entries[p] = &entry{hdr: cpio.Header{Name: p, Mode: cpio.TypeReg | mode, Links: 1, Size: size}, open: src}
	return nil
}

func (a *archive) write(w io.Writer) error {
	names := make([]string, 0, len(a.entries))
	for n := range a.entries {
		names = append(names, n)
	}
	// Sorted paths put every directory before what it holds.
	sort.Strings(names)
	cw := cpio.NewWriter(w)
	for _, n := range names {
		e := a.entries[n]
		hdr := e.hdr
		hdr.Name = strings.TrimPrefix(hdr.Name, "/")
		hdr.ModTime = time.Unix(epochSeconds, 0)
		if hdr.Mode&cpio.ModeType == cpio.TypeSymlink {
			hdr.Size = int64(len(hdr.Linkname))
		}
		if err := cw.WriteHeader(&hdr); err != nil {
			return fmt.Errorf("image: archive %s: %w", n, err)
		}
		switch {
		case e.open != nil:
			r, size, err := e.open()
			if err != nil {
				return fmt.Errorf("image: archive %s: %w", n, err)
			}
			_, err = io.CopyN(cw, r, size)
			r.Close()
			if err != nil {
				return fmt.Errorf("image: archive %s: %w", n, err)
			}
		case e.data != nil:
			if _, err := cw.Write(e.data); err != nil {
				return fmt.Errorf("image: archive %s: %w", n, err)
			}
		case hdr.Mode&cpio.ModeType == cpio.TypeSymlink:
			if _, err := cw.Write([]byte(hdr.Linkname)); err != nil {
				return fmt.Errorf("image: archive %s: %w", n, err)
			}
		}
	}
	if err := cw.Close(); err != nil {
		return fmt.Errorf("image: archive: %w", err)
	}
	return nil
}

func writeGzip(w io.Writer, a *archive) error {
	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := a.write(zw); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("image: gzip: %w", err)
	}
	return nil
}

func writeGzipFile(p string, a *archive) error {
	tmp := p + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := writeGzip(f, a); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("image: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return nil
}

func copyFile(dst, src string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("image: copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return nil
}

// KernelDirEnv names the environment variable that points tests and tools
// at the unpacked kernel package (`make kernel` sets it for `make test`).
const KernelDirEnv = "BETTER_COMPUTE_KERNEL_DIR"

// DefaultKernelDir is where `make kernel` unpacks the kernel package:
// $BETTER_COMPUTE_KERNEL_DIR, else ~/.cache/better-compute/kernel/root.
func DefaultKernelDir() string {
	if d := os.Getenv(KernelDirEnv); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".cache", "better-compute", "kernel", "root")
}

// BootConfig finds the boot config in an initrd: the last
// RamdiskBootConfigPath in its concatenated gzipped archives, as the
// kernel's unpacking would leave it. ok is false when there is none.
func BootConfig(initrd io.Reader) (cfg protocol.RamdiskBootConfig, ok bool, err error) {
	br := bufio.NewReader(initrd)
	zr, err := gzip.NewReader(br)
	if err != nil {
		return cfg, false, fmt.Errorf("image: initrd: %w", err)
	}
	want := strings.TrimPrefix(protocol.RamdiskBootConfigPath, "/")
	for {
		// One member at a time: each holds one archive.
		zr.Multistream(false)
		r := cpio.NewReader(zr)
		for {
			h, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return cfg, false, fmt.Errorf("image: initrd: %w", err)
			}
			if strings.TrimPrefix(h.Name, "/") != want {
				continue
			}
			b, err := io.ReadAll(io.LimitReader(r, 1<<20))
			if err != nil {
				return cfg, false, fmt.Errorf("image: initrd: %w", err)
			}
			var c protocol.RamdiskBootConfig
			if err := json.Unmarshal(b, &c); err != nil {
				return cfg, false, fmt.Errorf("image: initrd: %s: %w", want, err)
			}
			cfg, ok = c, true
		}
		// The archive's trailer may leave padding in the member.
		if _, err := io.Copy(io.Discard, zr); err != nil {
			return cfg, false, fmt.Errorf("image: initrd: %w", err)
		}
		if err := zr.Reset(br); err != nil {
			if errors.Is(err, io.EOF) {
				return cfg, ok, nil
			}
			return cfg, false, fmt.Errorf("image: initrd: %w", err)
		}
	}
}

// ISOBootConfig reads the boot config out of an ISO's initrd (with
// xorriso): what a machine booting the ISO would find.
func ISOBootConfig(ctx context.Context, iso string) (protocol.RamdiskBootConfig, error) {
	dir, err := os.MkdirTemp("", "bcd-iso-")
	if err != nil {
		return protocol.RamdiskBootConfig{}, fmt.Errorf("image: %w", err)
	}
	defer os.RemoveAll(dir)
	initrd := filepath.Join(dir, "initrd.img")
	out, err := exec.CommandContext(ctx, "xorriso", "-osirrox", "on", "-indev", iso, "-extract", ISOInitrdPath, initrd).CombinedOutput()
	if err != nil {
		return protocol.RamdiskBootConfig{}, fmt.Errorf("image: xorriso extract %s: %w: %s", ISOInitrdPath, err, strings.TrimSpace(string(out)))
	}
	f, err := os.Open(initrd)
	if err != nil {
		return protocol.RamdiskBootConfig{}, fmt.Errorf("image: %w", err)
	}
	defer f.Close()
	cfg, ok, err := BootConfig(f)
	if err != nil {
		return cfg, err
	}
	if !ok {
		return cfg, fmt.Errorf("image: %s's initrd has no %s", iso, protocol.RamdiskBootConfigPath)
	}
	return cfg, nil
}

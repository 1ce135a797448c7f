package image_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cavaliergopher/cpio"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
)

// writeModule writes a minimal ELF relocatable object with a .modinfo
// section, which is all ResolveModules reads of a kernel module.
func writeModule(t *testing.T, path string, modinfo ...string) {
	t.Helper()
	info := []byte(strings.Join(modinfo, "\x00") + "\x00")
	shstr := []byte("\x00.modinfo\x00.shstrtab\x00")
	const ehsize, shentsize = 64, 64
	infoOff := uint64(ehsize)
	strOff := infoOff + uint64(len(info))
	shOff := strOff + uint64(len(shstr))
	hdr := elf.Header64{
		Type: uint16(elf.ET_REL), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Shoff: shOff, Ehsize: ehsize, Shentsize: shentsize, Shnum: 3, Shstrndx: 2,
	}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	sections := []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_PROGBITS), Off: infoOff, Size: uint64(len(info)), Addralign: 1},
		{Name: 10, Type: uint32(elf.SHT_STRTAB), Off: strOff, Size: uint64(len(shstr)), Addralign: 1},
	}
	var buf bytes.Buffer
	for _, v := range []any{hdr, info, shstr, sections} {
		if err := binary.Write(&buf, binary.LittleEndian, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

const testVersion = "6.1.0-99-test-amd64"

// fakeKernel lays out an unpacked kernel package: a kernel image, modules
// that depend on each other, and a built-in one.
func fakeKernel(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "boot", "vmlinuz-"+testVersion), []byte("not really a kernel"))
	mod := filepath.Join(dir, "lib", "modules", testVersion)
	writeModule(t, filepath.Join(mod, "kernel/drivers/net/virtio_net.ko"), "license=GPL", "depends=net_failover,virtio,virtio_ring", "name=virtio_net")
	writeModule(t, filepath.Join(mod, "kernel/drivers/net/net_failover.ko"), "depends=failover")
	writeModule(t, filepath.Join(mod, "kernel/net/core/failover.ko"), "depends=")
	writeModule(t, filepath.Join(mod, "kernel/drivers/virtio/virtio.ko"), "depends=")
	writeModule(t, filepath.Join(mod, "kernel/drivers/virtio/virtio_ring.ko"), "depends=virtio")
	writeModule(t, filepath.Join(mod, "kernel/drivers/char/hw_random/virtio-rng.ko"), "depends=virtio,virtio_ring,rng_core")
	mustWrite(t, filepath.Join(mod, "modules.builtin"), []byte("kernel/drivers/char/hw_random/rng-core.ko\n"))
	return dir
}

func mustWrite(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

type member struct {
	mode cpio.FileMode
	link string
	data []byte
}

// readArchive decodes one gzipped newc archive.
func readArchive(t *testing.T, b []byte) (map[string]member, []string) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	zr.Multistream(false)
	r := cpio.NewReader(zr)
	out := map[string]member{}
	var order []string
	for {
		h, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = member{mode: h.Mode, link: h.Linkname, data: data}
		order = append(order, h.Name)
	}
	return out, order
}

func buildFake(t *testing.T) (*image.Base, []byte) {
	t.Helper()
	kdir := fakeKernel(t)
	bcd := filepath.Join(t.TempDir(), "bcd")
	mustWrite(t, bcd, []byte("#!/bin/true static bcd\n"))
	busybox := filepath.Join(t.TempDir(), "busybox")
	mustWrite(t, busybox, []byte("busybox bytes"))
	base, err := image.BuildBase(context.Background(), image.Options{
		KernelDir: kdir, BCD: bcd, Busybox: busybox, OutDir: t.TempDir(),
		Modules: []string{"virtio_net", "virtio_rng"},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(base.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	return base, b
}

func TestBuildBaseHoldsInitBusyboxBCDAndModulesInDependencyOrder(t *testing.T) {
	base, b := buildFake(t)
	files, order := readArchive(t, b)
	for name, want := range map[string]string{
		"bin/busybox": "busybox bytes",
		"bin/bcd":     "#!/bin/true static bcd\n",
	} {
		if got := string(files[name].data); got != want || files[name].mode.Perm() != 0o755 {
			t.Errorf("%s = %q mode %o, want %q 0755", name, got, files[name].mode.Perm(), want)
		}
	}
	init := files["init"]
	if init.mode.Perm() != 0o755 || !strings.HasPrefix(string(init.data), "#!/bin/sh\n") {
		t.Errorf("init: mode %o, starts %q", init.mode.Perm(), string(init.data[:min(20, len(init.data))]))
	}
	for _, p := range []string{image.ModulesList, image.UdhcpcScript, ramdisk.BootMACFile, "exec /bin/bcd ramdisk"} {
		if !strings.Contains(string(init.data), p) {
			t.Errorf("/init does not mention %s", p)
		}
	}
	if sh := files["bin/sh"]; sh.link != "busybox" {
		t.Errorf("bin/sh links to %q, want busybox", sh.link)
	}
	if _, ok := files["etc/bcd/boot.json"]; ok {
		t.Error("the base image holds a boot config; it belongs in the per-boot appendix")
	}
	wantMods := []string{
		"kernel/net/core/failover.ko", "kernel/drivers/net/net_failover.ko",
		"kernel/drivers/virtio/virtio.ko", "kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/net/virtio_net.ko", "kernel/drivers/char/hw_random/virtio-rng.ko",
	}
	// The list is the load order: each module after what it depends on;
	// rng_core is built in and absent.
	var listed []string
	for _, l := range strings.Fields(string(files[strings.TrimPrefix(image.ModulesList, "/")].data)) {
		listed = append(listed, strings.TrimPrefix(l, "/lib/modules/"+testVersion+"/"))
	}
	if !slices.Equal(listed, wantMods) {
		t.Errorf("modules list = %v, want %v", listed, wantMods)
	}
	if len(base.Modules) != len(wantMods) || base.KernelVersion != testVersion {
		t.Errorf("base = %+v", base)
	}
	for _, m := range wantMods {
		if _, ok := files["lib/modules/"+testVersion+"/"+m]; !ok {
			t.Errorf("archive lacks module %s", m)
		}
	}
	// Directories come before what they hold, as the kernel's unpacker needs.
	seen := map[string]bool{}
	for _, n := range order {
		if d := filepath.Dir(n); d != "." && !seen[d] {
			t.Errorf("%s comes before its directory %s", n, d)
		}
		seen[n] = true
	}
	if k, err := os.ReadFile(base.Kernel); err != nil || string(k) != "not really a kernel" {
		t.Errorf("kernel copy = %q, %v", k, err)
	}
}

func TestBuildBaseIsReproducible(t *testing.T) {
	kdir := fakeKernel(t)
	bcd := filepath.Join(t.TempDir(), "bcd")
	mustWrite(t, bcd, []byte("bcd"))
	var images [][]byte
	for range 2 {
		base, err := image.BuildBase(context.Background(), image.Options{KernelDir: kdir, BCD: bcd, Busybox: bcd, OutDir: t.TempDir(), Modules: []string{"virtio_net"}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(base.Initrd)
		if err != nil {
			t.Fatal(err)
		}
		images = append(images, b)
	}
	if !bytes.Equal(images[0], images[1]) {
		t.Error("two builds from the same inputs differ")
	}
}

func TestBuildBaseNamesAMissingModule(t *testing.T) {
	kdir := fakeKernel(t)
	bcd := filepath.Join(t.TempDir(), "bcd")
	mustWrite(t, bcd, []byte("bcd"))
	_, err := image.BuildBase(context.Background(), image.Options{KernelDir: kdir, BCD: bcd, Busybox: bcd, OutDir: t.TempDir(), Modules: []string{"e1000"}})
	if err == nil || !strings.Contains(err.Error(), "e1000") {
		t.Fatalf("err = %v, want one naming e1000", err)
	}
	_, err = image.BuildBase(context.Background(), image.Options{KernelDir: t.TempDir(), BCD: bcd, OutDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "make kernel") {
		t.Fatalf("err = %v, want one saying to run make kernel", err)
	}
}

func TestWithConfigAppendsASeparateArchive(t *testing.T) {
	base, b := buildFake(t)
	cfg := protocol.RamdiskBootConfig{APIURL: "http://10.0.2.2:8080", Token: protocol.BootTokenPrefix + "secret", BootID: "boot-1", Purpose: "inspect"}
	full, err := image.WithConfig(base.Initrd, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(full, b) {
		t.Fatal("the boot's initrd does not start with the base image unchanged")
	}
	app := full[len(b):]
	files, order := readArchive(t, app)
	if !slices.Equal(order, []string{"etc", "etc/bcd", "etc/bcd/boot.json"}) {
		t.Errorf("appendix holds %v", order)
	}
	bj := files["etc/bcd/boot.json"]
	if bj.mode.Perm() != 0o600 {
		t.Errorf("boot.json mode %o, want 0600", bj.mode.Perm())
	}
	var got protocol.RamdiskBootConfig
	if err := json.Unmarshal(bj.data, &got); err != nil || got != cfg {
		t.Errorf("boot.json = %s (%v), want %+v", bj.data, err, cfg)
	}
	// GNU cpio, which knows nothing of our writer, reads the appendix too.
	if _, err := exec.LookPath("cpio"); err == nil {
		zr, err := gzip.NewReader(bytes.NewReader(app))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("cpio", "-it", "--quiet")
		cmd.Stdin = bytes.NewReader(raw)
		out, err := cmd.Output()
		if err != nil || !strings.Contains(string(out), "etc/bcd/boot.json") {
			t.Errorf("cpio -it: %q, %v", out, err)
		}
	}
}

func TestISOHoldsTheBootPiecesWhereDirectBootLooks(t *testing.T) {
	for _, p := range []string{image.DefaultIsolinuxBin, image.DefaultLdlinux} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("no %s (Debian packages isolinux, syslinux-common)", p)
		}
	}
	if _, err := exec.LookPath("xorriso"); err != nil {
		t.Skip("no xorriso")
	}
	base, _ := buildFake(t)
	out := filepath.Join(t.TempDir(), "ramdisk.iso")
	const cmdline = "console=ttyS0 bcd.test=1"
	if err := image.ISO(context.Background(), image.ISOOptions{Kernel: base.Kernel, Initrd: base.Initrd, Cmdline: cmdline, Out: out}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the ISO (it holds a boot token) is %v, %v; want mode 0600", st.Mode(), err)
	}
	ex := t.TempDir()
	cmd := exec.Command("xorriso", "-osirrox", "on", "-indev", out, "-extract", "/boot", filepath.Join(ex, "boot"),
		"-extract", "/isolinux/isolinux.cfg", filepath.Join(ex, "isolinux.cfg"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("xorriso extract: %v: %s", err, b)
	}
	for iso, want := range map[string]string{image.ISOKernelPath: base.Kernel, image.ISOInitrdPath: base.Initrd} {
		got, err := os.ReadFile(filepath.Join(ex, iso))
		if err != nil {
			t.Fatal(err)
		}
		w, _ := os.ReadFile(want)
		if !bytes.Equal(got, w) {
			t.Errorf("%s differs from %s", iso, want)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(ex, image.ISOCmdlinePath)); strings.TrimSpace(string(got)) != cmdline {
		t.Errorf("cmdline.txt = %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(ex, "isolinux.cfg")); !strings.Contains(string(got), "APPEND "+cmdline) {
		t.Errorf("isolinux.cfg = %q", got)
	}
	// El Torito: the image is bootable.
	rep, err := exec.Command("xorriso", "-indev", out, "-report_el_torito", "plain").CombinedOutput()
	if err != nil || !strings.Contains(string(rep), "isolinux.bin") {
		t.Errorf("no El Torito boot image: %v: %s", err, rep)
	}
}

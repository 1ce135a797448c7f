package qemu_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/qemu"
	"github.com/better-compute/better-compute/drivers/redfish/emulator"
	"github.com/better-compute/better-compute/internal/testutil"
)

const marker = "BCTEST-BOOTED"

// initScript is the guest's whole userland: it says it booted, then powers
// off when "poweroff" is typed on its console.
const initScript = `#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev
echo "` + marker + `"
while true; do
  read -r line </dev/console || continue
  [ "$line" = poweroff ] && /bin/busybox poweroff -f
done
`

// kernel is Debian's kernel that the ramdisk's make target unpacks, or
// $BC_KERNEL.
func kernel(t *testing.T) string {
	t.Helper()
	if k := os.Getenv("BC_KERNEL"); k != "" {
		return k
	}
	home, _ := os.UserHomeDir()
	matches, _ := filepath.Glob(filepath.Join(home, ".cache/better-compute/kernel/root/boot/vmlinuz-*"))
	if len(matches) == 0 {
		t.Skip("no kernel: run the ramdisk's make target (it unpacks Debian's kernel under ~/.cache/better-compute/kernel) or set BC_KERNEL")
	}
	return matches[len(matches)-1]
}

func need(t *testing.T, bins ...string) {
	t.Helper()
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s is not installed (Debian: qemu-system-x86, xorriso, busybox-static, cpio)", b)
		}
	}
}

// buildISO packs a busybox initramfs and the kernel into an ISO at the
// paths direct boot takes them from.
func buildISO(t *testing.T, kernelPath string) []byte {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "initramfs")
	for _, d := range []string{"bin", "proc", "dev", "sys"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal(err)
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "init"), []byte(initScript), 0o755); err != nil {
		t.Fatal(err)
	}
	isoRoot := filepath.Join(dir, "iso")
	if err := os.MkdirAll(filepath.Join(isoRoot, "boot"), 0o755); err != nil {
		t.Fatal(err)
	}
	cpio := exec.Command("sh", "-c", "find . | cpio -o -H newc --quiet > "+filepath.Join(isoRoot, "boot/initrd.img"))
	cpio.Dir = root
	if out, err := cpio.CombinedOutput(); err != nil {
		t.Fatalf("cpio: %v: %s", err, out)
	}
	k, err := os.ReadFile(kernelPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(isoRoot, "boot/vmlinuz"), k, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(isoRoot, "boot/cmdline.txt"), []byte("console=ttyS0 quiet panic=-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(dir, "ramdisk.iso")
	if out, err := exec.Command("xorriso", "-as", "mkisofs", "-quiet", "-R", "-o", iso, isoRoot).CombinedOutput(); err != nil {
		t.Fatalf("xorriso: %v: %s", err, out)
	}
	b, err := os.ReadFile(iso)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type redfish struct {
	t   *testing.T
	e   *emulator.Emulator
	url string
}

func (r redfish) do(method, path string, body any) (int, []byte) {
	r.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, r.url+path, rd)
	if err != nil {
		r.t.Fatal(err)
	}
	req.SetBasicAuth("admin", "password")
	resp, err := r.e.HTTPClient().Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (r redfish) reset(typ string) {
	r.t.Helper()
	if code, body := r.do(http.MethodPost, "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", map[string]string{"ResetType": typ}); code != http.StatusNoContent {
		r.t.Fatalf("reset %s: %d %s", typ, code, body)
	}
}

func (r redfish) power() string {
	r.t.Helper()
	_, body := r.do(http.MethodGet, "/redfish/v1/Systems/1", nil)
	var sys struct{ PowerState string }
	if err := json.Unmarshal(body, &sys); err != nil {
		r.t.Fatal(err)
	}
	return sys.PowerState
}

// TestQEMUMachineBehindRedfish boots one TCG VM through the Redfish
// emulator: virtual media with the ramdisk ISO (direct boot), power on,
// reset, a guest power-off read back as Off, a hard power off, and the ISO
// handed to the real firmware. It logs how long each step took.
func TestQEMUMachineBehindRedfish(t *testing.T) {
	need(t, "qemu-system-x86_64", "xorriso", "busybox", "cpio")
	iso := buildISO(t, kernel(t))
	media := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "ramdisk.iso", time.Time{}, bytes.NewReader(iso))
	}))
	defer media.Close()

	const mac = "52:54:00:bc:00:01"
	m, err := qemu.New(qemu.Config{
		Info:   machines.Info{UUID: "5e1c0f6e-7a6b-4d3c-9e2f-0123456789ab", SerialNumber: "QEMU-0001", Manufacturer: "QEMU", Model: "pc", MAC: mac, CPUs: 1, MemoryMiB: 512},
		Dir:    t.TempDir(),
		CDMode: qemu.ModeDirect,
	})
	if err != nil {
		t.Fatal(err)
	}
	e, err := emulator.New(emulator.Config{Username: "admin", Password: "password"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	b, err := e.AddBMC("qemu-1", m)
	if err != nil {
		t.Fatal(err)
	}
	rf := redfish{t: t, e: e, url: b.URL()}
	markers := func() int { return strings.Count(string(m.SerialLog()), marker) }
	const bootTimeout = 3 * time.Minute

	if code, body := rf.do(http.MethodPost, "/redfish/v1/Managers/1/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia",
		map[string]any{"Image": media.URL + "/ramdisk.iso", "Inserted": true}); code != http.StatusNoContent {
		t.Fatalf("insert media: %d %s", code, body)
	}
	if code, body := rf.do(http.MethodPatch, "/redfish/v1/Systems/1",
		map[string]any{"Boot": map[string]string{"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Continuous"}}); code != http.StatusNoContent {
		t.Fatalf("boot override: %d %s", code, body)
	}

	start := time.Now()
	rf.reset("On")
	if got := rf.power(); got != "On" {
		t.Fatalf("power after On = %s", got)
	}
	testutil.Eventually(t, bootTimeout, "the first serial output", func() bool { return m.Console().Written() > 0 })
	firstOutput := time.Since(start)
	testutil.Eventually(t, bootTimeout, "the guest's init to run", func() bool { return markers() == 1 })
	booted := time.Since(start)
	if !strings.Contains(string(m.SerialLog()), "Machine UUID 5e1c0f6e-7a6b-4d3c-9e2f-0123456789ab") {
		t.Fatalf("the firmware does not report the machine's UUID:\n%s", tail(m.SerialLog()))
	}

	start = time.Now()
	rf.reset("ForceRestart")
	testutil.Eventually(t, bootTimeout, "the guest to boot again after the reset", func() bool { return markers() == 2 })
	resetBoot := time.Since(start)

	start = time.Now()
	if err := m.SerialInput([]byte("poweroff\n")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, bootTimeout, "the guest's power off to read back as Off", func() bool { return rf.power() == "Off" })
	guestOff := time.Since(start)

	rf.reset("On")
	testutil.Eventually(t, bootTimeout, "the third boot", func() bool { return markers() == 3 })
	start = time.Now()
	rf.reset("ForceOff")
	hardOff := time.Since(start)
	if got := rf.power(); got != "Off" {
		t.Fatalf("power after ForceOff = %s", got)
	}

	// The measured path: the firmware boots the CD itself.
	m.SetCDMode(qemu.ModeISO)
	cdBoots := func() int { return strings.Count(string(m.SerialLog()), "Booting from DVD/CD") }
	before := cdBoots()
	start = time.Now()
	rf.reset("On")
	testutil.Eventually(t, bootTimeout, "the firmware to boot from the CD", func() bool { return cdBoots() > before })
	firmwareCD := time.Since(start)
	rf.reset("ForceOff")

	t.Logf("QEMU TCG behind Redfish: power on -> first serial output %v, -> init (direct boot) %v; reset -> init %v; guest poweroff -> Off read back %v; ForceOff %v; power on -> firmware boots the CD %v",
		firstOutput.Round(time.Millisecond), booted.Round(time.Millisecond), resetBoot.Round(time.Millisecond),
		guestOff.Round(time.Millisecond), hardOff.Round(time.Millisecond), firmwareCD.Round(time.Millisecond))
	if os.Getenv("BC_QEMU_SERIAL") != "" {
		t.Logf("console:\n%s", m.SerialLog())
	}
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

package simboot_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
	"github.com/better-compute/better-compute/agent/ramdisk/simboot"
	coreinv "github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/sim"
	"github.com/better-compute/better-compute/internal/testutil"
)

// bootISO builds the ISO a site would serve for one boot; the kernel and
// the base are stand-ins, since nothing boots them here.
func bootISO(t *testing.T, cfg protocol.RamdiskBootConfig) string {
	t.Helper()
	dir := t.TempDir()
	const version = "6.1.0-0-sim-amd64"
	for p, b := range map[string]string{
		"kernel/boot/vmlinuz-" + version: "kernel",
		"bcd":                            "bcd",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "kernel/lib/modules", version, "kernel"), 0o755); err != nil {
		t.Fatal(err)
	}
	base, err := image.BuildBase(context.Background(), image.Options{
		KernelDir: filepath.Join(dir, "kernel"), BCD: filepath.Join(dir, "bcd"), Busybox: filepath.Join(dir, "bcd"),
		Modules: []string{}, OutDir: filepath.Join(dir, "out"),
	})
	if err != nil {
		t.Fatal(err)
	}
	full, err := image.WithConfig(base.Initrd, cfg)
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(dir, "initrd-boot.img")
	if err := os.WriteFile(initrd, full, 0o600); err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(dir, "boot.iso")
	if err := image.ISO(context.Background(), image.ISOOptions{Kernel: base.Kernel, Initrd: initrd, Out: iso}); err != nil {
		t.Fatal(err)
	}
	return iso
}

var info = machines.Info{
	UUID: "3F2504E0-4F89-11D3-9A0C-0305E82C3301", SerialNumber: "SIM-0001",
	Manufacturer: "Better Compute", Model: "Simulated", MAC: "52:54:00:AA:00:01", CPUs: 4, MemoryMiB: 2048,
}

type api struct {
	token string
	mu    sync.Mutex
	inv   *coreinv.NodeInventory
	res   []protocol.RamdiskStepResult
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var body struct {
		Token     string                       `json:"token"`
		Inventory json.RawMessage              `json:"inventory"`
		Results   []protocol.RamdiskStepResult `json:"results"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	if body.Token != a.token {
		http.Error(w, `{"error":"unauthenticated"}`, http.StatusUnauthorized)
		return
	}
	out := protocol.RamdiskInstructions{NodeID: "node-sim", Steps: []protocol.RamdiskStep{}}
	switch r.URL.Path {
	case protocol.RamdiskReportPath:
		var inv coreinv.NodeInventory
		_ = json.Unmarshal(body.Inventory, &inv)
		a.inv = &inv
		out.Steps = []protocol.RamdiskStep{{Name: protocol.StepWipeDisks}, {Name: protocol.StepPowerOff}}
	case protocol.RamdiskResultPath:
		a.res = append(a.res, body.Results...)
	}
	_ = json.NewEncoder(w).Encode(out)
}

type ends struct {
	mu   sync.Mutex
	errs []error
}

func (e *ends) done(_ sim.Boot, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errs = append(e.errs, err)
}

func (e *ends) get() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.errs...)
}

func bootFromCD(t *testing.T, m *sim.Machine, iso string) {
	t.Helper()
	ctx := context.Background()
	if err := m.InsertMedia(ctx, machines.Media{Kind: machines.MediaCD, Path: iso}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetBootOverride(ctx, drivers.BootCD, false); err != nil {
		t.Fatal(err)
	}
	if err := m.PowerOn(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestHookRunsTheRamdiskOfTheCDAndPowersTheMachineOff(t *testing.T) {
	a := &api{token: protocol.BootTokenPrefix + "sim-boot"}
	srv := httptest.NewServer(a)
	defer srv.Close()
	iso := bootISO(t, protocol.RamdiskBootConfig{APIURL: "http://10.0.2.2:1", Token: a.token, BootID: "b1", Purpose: "inspect"})
	var e ends
	m := sim.New(sim.Config{Info: info, Hook: simboot.Hook(simboot.Options{APIURL: srv.URL, RetryMin: time.Millisecond, Done: e.done})})
	defer m.Close()
	bootFromCD(t, m, iso)
	testutil.Eventually(t, 30*time.Second, "the ramdisk to end", func() bool { return len(e.get()) == 1 })
	if err := e.get()[0]; err != nil {
		t.Fatalf("ramdisk: %v\nconsole:\n%s", err, m.SerialLog())
	}
	if s, _ := m.PowerState(context.Background()); s != drivers.PowerOff {
		t.Errorf("power state %s after the ramdisk's power-off", s)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inv == nil || a.inv.System.ProductUUID != "3f2504e0-4f89-11d3-9a0c-0305e82c3301" || a.inv.NICs[0].MAC != "52:54:00:aa:00:01" ||
		a.inv.CPU.LogicalCPUs != 4 || a.inv.Memory.TotalBytes != 2048<<20 {
		t.Errorf("reported inventory = %+v", a.inv)
	}
	if len(a.res) != 2 || a.res[0].Name != protocol.StepWipeDisks || !a.res[0].OK || a.res[1].Name != protocol.StepPowerOff {
		t.Errorf("results = %+v", a.res)
	}
}

func TestHookWithARefusedTokenPowersOffAndSaysWhy(t *testing.T) {
	a := &api{token: protocol.BootTokenPrefix + "the-real-one"}
	srv := httptest.NewServer(a)
	defer srv.Close()
	iso := bootISO(t, protocol.RamdiskBootConfig{APIURL: srv.URL, Token: protocol.BootTokenPrefix + "stale", Purpose: "inspect"})
	var e ends
	m := sim.New(sim.Config{Info: info, Hook: simboot.Hook(simboot.Options{RetryMin: time.Millisecond, Done: e.done})})
	defer m.Close()
	bootFromCD(t, m, iso)
	testutil.Eventually(t, 30*time.Second, "the ramdisk to end", func() bool { return len(e.get()) == 1 })
	if err := e.get()[0]; !errors.Is(err, ramdisk.ErrUnauthorized) {
		t.Fatalf("err = %v, want ErrUnauthorized", err)
	}
	if s, _ := m.PowerState(context.Background()); s != drivers.PowerOff {
		t.Errorf("power state %s", s)
	}
}

func TestHookIgnoresABootFromDisk(t *testing.T) {
	var e ends
	m := sim.New(sim.Config{Info: info, Hook: simboot.Hook(simboot.Options{Done: e.done})})
	defer m.Close()
	if err := m.PowerOn(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the hook to return", func() bool { return len(e.get()) == 1 })
	if err := e.get()[0]; err != nil {
		t.Errorf("a disk boot: %v", err)
	}
	if s, _ := m.PowerState(context.Background()); s != drivers.PowerOn {
		t.Errorf("power state %s, want the machine left on", s)
	}
}

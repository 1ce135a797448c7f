package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/better-compute/better-compute/agent/protocol"
	coreinv "github.com/better-compute/better-compute/core/inventory"
)

// `bcd ramdisk --simulate` is the simulated machines' boot hook: from its
// flags alone it reads the boot config and the inventory file, reports,
// "wipes" and exits on power-off.
func TestRamdiskSimulateReportsTheInventoryFileAndExitsOnPowerOff(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	var reported coreinv.NodeInventory
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		paths = append(paths, r.URL.Path)
		if r.URL.Path == protocol.RamdiskReportPath {
			var rep protocol.RamdiskReport
			if err := json.NewDecoder(r.Body).Decode(&rep); err != nil {
				t.Error(err)
			}
			if err := json.Unmarshal(rep.Inventory, &reported); err != nil {
				t.Error(err)
			}
			_ = json.NewEncoder(w).Encode(protocol.RamdiskInstructions{Steps: []protocol.RamdiskStep{{Name: protocol.StepWipeDisks}, {Name: protocol.StepPowerOff}}})
			return
		}
		_ = json.NewEncoder(w).Encode(protocol.RamdiskInstructions{})
	}))
	defer srv.Close()

	dir := t.TempDir()
	cfg, _ := json.Marshal(protocol.RamdiskBootConfig{APIURL: srv.URL, Token: protocol.BootTokenPrefix + "sim", Purpose: "inspect"})
	inv, _ := json.Marshal(coreinv.NodeInventory{
		Kind: coreinv.Kind, Version: coreinv.Version,
		System: coreinv.System{ProductUUID: "0d6f3c52-7e0e-4c1b-9a51-5b8c55a1a001"},
		Disks:  []coreinv.Disk{{Name: "nvme0n1", SizeBytes: 1 << 40}},
		GPUs:   coreinv.GPUs{Devices: []coreinv.GPU{}},
	})
	cfgPath, invPath := filepath.Join(dir, "boot.json"), filepath.Join(dir, "inventory.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(invPath, inv, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := ramdiskCommand()
	cmd.SetArgs([]string{"--simulate", "--config", cfgPath, "--inventory", invPath})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 3 || reported.System.ProductUUID != "0d6f3c52-7e0e-4c1b-9a51-5b8c55a1a001" {
		t.Errorf("calls %v, reported %+v", paths, reported.System)
	}

	cmd = ramdiskCommand()
	cmd.SetArgs([]string{"--simulate", "--config", cfgPath})
	if err := cmd.ExecuteContext(context.Background()); err == nil {
		t.Error("--simulate without --inventory ran")
	}
}

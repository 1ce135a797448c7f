package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

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

// --disk-file gives the simulated machine's disk a file, which write-image
// writes.
func TestRamdiskSimulateWritesAnImageToItsDiskFile(t *testing.T) {
	image := bytes.Repeat([]byte("better-compute image "), 50000)
	sum := sha256.Sum256(image)
	token := protocol.BootTokenPrefix + "sim"
	var mu sync.Mutex
	var results []protocol.RamdiskStepResult
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/image":
			if r.Header.Get("Authorization") != "Bearer "+token {
				http.Error(w, "no", http.StatusUnauthorized)
				return
			}
			http.ServeContent(w, r, "image.raw", time.Time{}, bytes.NewReader(image))
		case protocol.RamdiskReportPath:
			_ = json.NewEncoder(w).Encode(protocol.RamdiskInstructions{Steps: []protocol.RamdiskStep{
				{Name: protocol.StepWriteImage, Args: map[string]string{
					"url": srv.URL + "/image", "sha256": hex.EncodeToString(sum[:]), "sizeBytes": strconv.Itoa(len(image)),
				}},
				{Name: protocol.StepPowerOff},
			}})
		default:
			var res protocol.RamdiskResult
			_ = json.NewDecoder(r.Body).Decode(&res)
			results = append(results, res.Results...)
			_ = json.NewEncoder(w).Encode(protocol.RamdiskInstructions{})
		}
	}))
	defer srv.Close()

	dir := t.TempDir()
	cfg, _ := json.Marshal(protocol.RamdiskBootConfig{APIURL: srv.URL, Token: token, Purpose: "provide"})
	inv, _ := json.Marshal(coreinv.NodeInventory{
		Kind: coreinv.Kind, Version: coreinv.Version,
		System: coreinv.System{ProductUUID: "0d6f3c52-7e0e-4c1b-9a51-5b8c55a1a001"},
		Disks:  []coreinv.Disk{{Name: "nvme0n1", SizeBytes: 4 << 20}},
		GPUs:   coreinv.GPUs{Devices: []coreinv.GPU{}},
	})
	cfgPath, invPath, diskPath := filepath.Join(dir, "boot.json"), filepath.Join(dir, "inventory.json"), filepath.Join(dir, "disk.raw")
	for p, b := range map[string][]byte{cfgPath: cfg, invPath: inv, diskPath: make([]byte, 4<<20)} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := ramdiskCommand()
	cmd.SetArgs([]string{"--simulate", "--config", cfgPath, "--inventory", invPath, "--disk-file", "nvme0n1=" + diskPath})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(results) != 2 || !results[0].OK {
		t.Fatalf("results = %+v", results)
	}
	b, err := os.ReadFile(diskPath)
	if err != nil || !bytes.Equal(b[:len(image)], image) {
		t.Errorf("the disk file does not hold the image (%v)", err)
	}
}

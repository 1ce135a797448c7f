package ramdisk_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk"
	coreinv "github.com/better-compute/better-compute/core/inventory"
)

// call is one request the fake API received.
type call struct {
	Path string
	Body map[string]json.RawMessage
}

// fakeAPI answers the ramdisk endpoints from a script: answer is called
// with every request (numbered from 0) and returns the status and the body.
type fakeAPI struct {
	t      testing.TB
	answer func(n int, path string, body map[string]json.RawMessage) (int, any)

	mu    sync.Mutex
	calls []call
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
		f.t.Errorf("%s %s with Content-Type %q", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
	}
	var body map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		f.t.Errorf("%s: body: %v", r.URL.Path, err)
	}
	f.mu.Lock()
	n := len(f.calls)
	f.calls = append(f.calls, call{Path: r.URL.Path, Body: body})
	f.mu.Unlock()
	status, out := f.answer(n, r.URL.Path, body)
	if status == 0 {
		// A connection that breaks, as while the network comes up.
		hj, _ := w.(http.Hijacker)
		conn, _, _ := hj.Hijack()
		conn.Close()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(out)
}

func (f *fakeAPI) Calls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeAPI) paths() []string {
	var p []string
	for _, c := range f.Calls() {
		p = append(p, c.Path)
	}
	return p
}

func steps(names ...string) protocol.RamdiskInstructions {
	in := protocol.RamdiskInstructions{NodeID: "node-1", Steps: []protocol.RamdiskStep{}}
	for _, n := range names {
		in.Steps = append(in.Steps, protocol.RamdiskStep{Name: n})
	}
	return in
}

// simulatedMachine writes an inventory file with two disks (one the
// system disk) and a NIC.
func simulatedMachine(t *testing.T) (*ramdisk.Simulated, *bool) {
	t.Helper()
	inv := coreinv.NodeInventory{
		Kind: coreinv.Kind, Version: coreinv.Version,
		System: coreinv.System{Vendor: "QEMU", Product: "Standard PC", ProductUUID: "5e1c0e3a-1111-2222-3333-444455556666"},
		CPU:    coreinv.CPU{Sockets: 1, CoresPerSocket: 2, ThreadsPerCore: 1, LogicalCPUs: 2, NUMANodes: 1},
		Memory: coreinv.Memory{TotalBytes: 512 << 20},
		Disks: []coreinv.Disk{
			{Name: "vda", SizeBytes: 64 << 20},
			{Name: "vdb", SizeBytes: 8 << 30, System: true},
		},
		NICs: []coreinv.NIC{{Name: "eth0", MAC: "52:54:00:12:34:56", Driver: "virtio_net"}},
		GPUs: coreinv.GPUs{Devices: []coreinv.GPU{}},
	}
	b, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "inventory.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	off := new(bool)
	return &ramdisk.Simulated{InventoryFile: p, OnPowerOff: func() { *off = true }}, off
}

func agent(t *testing.T, url, token string, m ramdisk.Machine) *ramdisk.Agent {
	return &ramdisk.Agent{
		Config:   protocol.RamdiskBootConfig{APIURL: url, Token: token, BootID: "boot-1", Purpose: "provide"},
		Machine:  m,
		BootMAC:  "52:54:00:12:34:56",
		RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond,
		WaitInterval: time.Millisecond,
		Log:          slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
}

func results(t testing.TB, c call) []protocol.RamdiskStepResult {
	t.Helper()
	var r []protocol.RamdiskStepResult
	if err := json.Unmarshal(c.Body["results"], &r); err != nil {
		t.Fatalf("results: %v", err)
	}
	return r
}

func TestAgentReportsRunsTheStepsInOrderAndReportsEachResult(t *testing.T) {
	m, off := simulatedMachine(t)
	api := &fakeAPI{t: t, answer: func(n int, path string, _ map[string]json.RawMessage) (int, any) {
		if n == 0 {
			return http.StatusOK, steps(protocol.StepWipeDisks, protocol.StepPowerOff)
		}
		return http.StatusOK, steps()
	}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	token := protocol.BootTokenPrefix + "0123456789"
	if err := agent(t, srv.URL, token, m).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{protocol.RamdiskReportPath, protocol.RamdiskResultPath, protocol.RamdiskResultPath}
	if got := api.paths(); !slices.Equal(got, want) {
		t.Fatalf("calls = %v, want %v", got, want)
	}
	calls := api.Calls()
	for _, c := range calls {
		if string(c.Body["token"]) != `"`+token+`"` {
			t.Errorf("%s token = %s", c.Path, c.Body["token"])
		}
	}
	var inv coreinv.NodeInventory
	if err := json.Unmarshal(calls[0].Body["inventory"], &inv); err != nil {
		t.Fatal(err)
	}
	if len(inv.Disks) != 2 || inv.NICs[0].MAC != "52:54:00:12:34:56" || inv.System.ProductUUID == "" {
		t.Errorf("reported inventory = %+v", inv)
	}
	wipe, power := results(t, calls[1]), results(t, calls[2])
	if len(wipe) != 1 || wipe[0].Name != protocol.StepWipeDisks || !wipe[0].OK || !strings.Contains(wipe[0].Message, "vda") || strings.Contains(wipe[0].Message, "vdb") {
		t.Errorf("wipe result = %+v (the system disk vdb must be spared)", wipe)
	}
	if len(power) != 1 || power[0].Name != protocol.StepPowerOff || !power[0].OK {
		t.Errorf("power-off result = %+v", power)
	}
	if !slices.Equal(m.Wiped(), []string{"vda"}) || !*off {
		t.Errorf("wiped %v, powered off %v", m.Wiped(), *off)
	}
}

func TestAgentRetriesWhileTheNetworkAndTheAPIComeUp(t *testing.T) {
	m, off := simulatedMachine(t)
	api := &fakeAPI{t: t, answer: func(n int, path string, _ map[string]json.RawMessage) (int, any) {
		switch n {
		case 0:
			return 0, nil // connection dropped
		case 1:
			return http.StatusServiceUnavailable, map[string]string{"error": "starting"}
		case 2:
			return http.StatusTooManyRequests, map[string]string{"error": "slow down"}
		case 3:
			return http.StatusOK, steps(protocol.StepPowerOff)
		case 4:
			return http.StatusBadGateway, nil // the result is retried too
		}
		return http.StatusOK, steps()
	}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	if err := agent(t, srv.URL, protocol.BootTokenPrefix+"x", m).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{protocol.RamdiskReportPath, protocol.RamdiskReportPath, protocol.RamdiskReportPath, protocol.RamdiskReportPath, protocol.RamdiskResultPath, protocol.RamdiskResultPath}
	if got := api.paths(); !slices.Equal(got, want) {
		t.Fatalf("calls = %v, want %v", got, want)
	}
	if !*off {
		t.Error("not powered off")
	}
}

func TestAgentStopsOnARefusedToken(t *testing.T) {
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		m, off := simulatedMachine(t)
		api := &fakeAPI{t: t, answer: func(int, string, map[string]json.RawMessage) (int, any) {
			return status, map[string]string{"error": "invalid boot token"}
		}}
		srv := httptest.NewServer(api)
		err := agent(t, srv.URL, protocol.BootTokenPrefix+"expired", m).Run(context.Background())
		srv.Close()
		if !errors.Is(err, ramdisk.ErrUnauthorized) {
			t.Errorf("%d: err = %v, want ErrUnauthorized", status, err)
		}
		if err != nil && strings.Contains(err.Error(), "expired") {
			t.Errorf("the error shows the token: %v", err)
		}
		if n := len(api.Calls()); n != 1 || *off {
			t.Errorf("%d: %d calls (want 1, no retry), powered off %v", status, n, *off)
		}
	}
}

func TestAgentGivesUpOnOtherClientErrors(t *testing.T) {
	m, _ := simulatedMachine(t)
	api := &fakeAPI{t: t, answer: func(int, string, map[string]json.RawMessage) (int, any) {
		return http.StatusBadRequest, map[string]string{"error": "inventory: kind"}
	}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	err := agent(t, srv.URL, protocol.BootTokenPrefix+"x", m).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "400") || len(api.Calls()) != 1 {
		t.Fatalf("err = %v after %d calls, want a 400 after 1", err, len(api.Calls()))
	}
}

func TestAgentWithADiscoveryTokenReportsItsBootMAC(t *testing.T) {
	m, off := simulatedMachine(t)
	api := &fakeAPI{t: t, answer: func(n int, path string, _ map[string]json.RawMessage) (int, any) {
		if n == 0 {
			return http.StatusOK, steps(protocol.StepPowerOff)
		}
		return http.StatusOK, steps()
	}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	if err := agent(t, srv.URL, protocol.DiscoveryTokenPrefix+"site", m).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	calls := api.Calls()
	if calls[0].Path != protocol.RamdiskDiscoverPath || string(calls[0].Body["bootMac"]) != `"52:54:00:12:34:56"` || len(calls[0].Body["inventory"]) == 0 {
		t.Errorf("first call = %s %s", calls[0].Path, calls[0].Body["bootMac"])
	}
	if !*off {
		t.Error("not powered off")
	}
}

func TestAgentWaitsReReportingUntilGivenSteps(t *testing.T) {
	m, off := simulatedMachine(t)
	api := &fakeAPI{t: t, answer: func(n int, path string, _ map[string]json.RawMessage) (int, any) {
		switch {
		case n == 0:
			return http.StatusOK, steps(protocol.StepWait)
		case path == protocol.RamdiskReportPath && n < 3:
			return http.StatusOK, steps(protocol.StepWait)
		case path == protocol.RamdiskReportPath:
			return http.StatusOK, steps(protocol.StepPowerOff)
		}
		return http.StatusOK, steps()
	}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	if err := agent(t, srv.URL, protocol.BootTokenPrefix+"x", m).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{protocol.RamdiskReportPath, protocol.RamdiskReportPath, protocol.RamdiskReportPath, protocol.RamdiskReportPath, protocol.RamdiskResultPath, protocol.RamdiskResultPath}
	if got := api.paths(); !slices.Equal(got, want) {
		t.Fatalf("calls = %v, want %v", got, want)
	}
	calls := api.Calls()
	if r := results(t, calls[4]); r[0].Name != protocol.StepWait || !r[0].OK {
		t.Errorf("wait result = %+v", r)
	}
	if r := results(t, calls[5]); r[0].Name != protocol.StepPowerOff || !*off {
		t.Errorf("last result = %+v, powered off %v", r, *off)
	}
}

func TestAgentAFailedStepDropsTheQueueAndTheAnswerLeads(t *testing.T) {
	m, off := simulatedMachine(t)
	api := &fakeAPI{t: t, answer: func(n int, path string, _ map[string]json.RawMessage) (int, any) {
		switch n {
		case 0:
			return http.StatusOK, steps("format-everything", protocol.StepWipeDisks)
		case 1: // the failed step's result; nothing said: the queue goes
			return http.StatusOK, steps()
		case 2: // the wait's re-report
			return http.StatusOK, steps(protocol.StepPowerOff)
		}
		return http.StatusOK, steps()
	}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	if err := agent(t, srv.URL, protocol.BootTokenPrefix+"x", m).Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	calls := api.Calls()
	if r := results(t, calls[1]); r[0].OK || !strings.Contains(r[0].Message, "unknown step") {
		t.Errorf("unknown step result = %+v", r)
	}
	if len(m.Wiped()) != 0 || !*off {
		t.Errorf("wiped %v after a failed step, powered off %v", m.Wiped(), *off)
	}
}

func TestAgentEndsWithItsContext(t *testing.T) {
	m, _ := simulatedMachine(t)
	ctx, cancel := context.WithCancel(context.Background())
	api := &fakeAPI{t: t, answer: func(n int, path string, _ map[string]json.RawMessage) (int, any) {
		if n == 2 {
			cancel()
		}
		return http.StatusServiceUnavailable, nil
	}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	err := agent(t, srv.URL, protocol.BootTokenPrefix+"x", m).Run(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestLoadConfigFromAFileAndAURL(t *testing.T) {
	cfg := protocol.RamdiskBootConfig{APIURL: "http://10.0.2.2:1", Token: protocol.BootTokenPrefix + "t", Purpose: "inspect"}
	b, _ := json.Marshal(cfg)
	p := filepath.Join(t.TempDir(), "boot.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(b) }))
	defer srv.Close()
	for _, src := range []string{p, srv.URL + "/boot.json"} {
		got, err := ramdisk.LoadConfig(context.Background(), src)
		if err != nil || got != cfg {
			t.Errorf("%s: %+v, %v", src, got, err)
		}
	}
	if err := os.WriteFile(p, []byte(`{"apiUrl":"http://x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ramdisk.LoadConfig(context.Background(), p); err == nil {
		t.Error("a config without a token loaded")
	}
}

func TestBootMAC(t *testing.T) {
	p := filepath.Join(t.TempDir(), "boot-mac")
	if got := ramdisk.BootMAC(p, "console=ttyS0 BOOTIF=01-52-54-00-AB-CD-EF quiet"); got != "52:54:00:ab:cd:ef" {
		t.Errorf("from BOOTIF: %q", got)
	}
	if err := os.WriteFile(p, []byte("52:54:00:12:34:56\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := ramdisk.BootMAC(p, "BOOTIF=01-52-54-00-ab-cd-ef"); got != "52:54:00:12:34:56" {
		t.Errorf("from /init's file: %q", got)
	}
	if got := ramdisk.CmdlineParam("a=1 bcd.config=http://h/x b", ramdisk.CmdlineConfigKey); got != "http://h/x" {
		t.Errorf("CmdlineParam = %q", got)
	}
}

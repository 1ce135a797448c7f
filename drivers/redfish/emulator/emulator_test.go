package emulator_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	bmclib "github.com/bmc-toolbox/bmclib/v2"
	"github.com/stmcginnis/gofish"

	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/sim"
	"github.com/better-compute/better-compute/drivers/redfish/emulator"
	"github.com/better-compute/better-compute/internal/testutil"
)

const (
	user = "admin"
	pass = "s3cret-pass"
)

var testInfo = machines.Info{
	UUID: "6f1d3c2a-1b2c-4d5e-8f90-a1b2c3d4e5f6", SerialNumber: "SIM-0001", Manufacturer: "Better Compute",
	Model: "Simulated", MAC: "52:54:00:12:34:56", CPUs: 4, MemoryMiB: 8192,
}

func newBMC(t *testing.T, cfg sim.Config) (*emulator.Emulator, *emulator.BMC, *sim.Machine) {
	t.Helper()
	e, err := emulator.New(emulator.Config{Username: user, Password: pass, TaskDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	if cfg.Info == (machines.Info{}) {
		cfg.Info = testInfo
	}
	m := sim.New(cfg)
	b, err := e.AddBMC("node-1", m)
	if err != nil {
		t.Fatal(err)
	}
	return e, b, m
}

// request is one raw Redfish request with basic auth unless auth is false.
func request(t *testing.T, e *emulator.Emulator, method, url string, body any, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		buf, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(user, pass)
	for k, v := range header {
		if k == "Authorization" && v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := e.HTTPClient().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

func mediaServer(t *testing.T, content []byte) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/boot/ramdisk.iso" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(content)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestBmclibDrivesTheService drives the emulator with bmclib's Redfish
// (gofish) provider, unmodified, over HTTPS pinned to the emulator's CA:
// open, power, boot override, virtual media, BIOS, close.
func TestBmclibDrivesTheService(t *testing.T) {
	e, b, m := newBMC(t, sim.Config{})
	iso := []byte("not really an ISO, but the BMC copies it whole")
	media := mediaServer(t, iso)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	client := bmclib.NewClient("127.0.0.1", user, pass,
		bmclib.WithSecureTLS(e.CertPool()),
		bmclib.WithRedfishPort(b.Port()))
	client.Registry.Drivers = client.Registry.For("gofish")
	if err := client.Open(ctx); err != nil {
		t.Fatalf("open: %v", err)
	}
	if got := b.Sessions(); got != 1 {
		t.Fatalf("sessions after open = %d, want 1", got)
	}

	power := func() string {
		t.Helper()
		s, err := client.GetPowerState(ctx)
		if err != nil {
			t.Fatalf("power state: %v", err)
		}
		return s
	}
	if got := power(); got != "Off" {
		t.Fatalf("power = %q, want Off", got)
	}
	if _, err := client.SetPowerState(ctx, "on"); err != nil {
		t.Fatalf("power on: %v", err)
	}
	if got := power(); got != "On" {
		t.Fatalf("power after on = %q", got)
	}
	if boots := m.Boots(); len(boots) != 1 || boots[0].Device != drivers.BootDisk {
		t.Fatalf("boots after power on = %+v, want one from disk", boots)
	}

	if _, err := client.SetBootDevice(ctx, "pxe", false, false); err != nil {
		t.Fatalf("set boot device: %v", err)
	}
	ov, err := client.GetBootDeviceOverride(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ov.Device != "pxe" || ov.IsPersistent || ov.IsEFIBoot {
		t.Fatalf("override = %+v, want pxe once legacy", ov)
	}
	// bmclib's "cycle" is a ForceRestart: the machine reboots from PXE once.
	if _, err := client.SetPowerState(ctx, "cycle"); err != nil {
		t.Fatalf("cycle: %v", err)
	}
	boots := m.Boots()
	if len(boots) != 2 || boots[1].Device != drivers.BootPXE || boots[1].MAC != testInfo.MAC {
		t.Fatalf("boots after cycle = %+v, want the second from pxe", boots)
	}
	if ov, err := client.GetBootDeviceOverride(ctx); err != nil || ov.Device != "none" {
		t.Fatalf("override after its one boot = %+v, %v; want none", ov, err)
	}

	imageURL := media.URL + "/boot/ramdisk.iso"
	if _, err := client.SetVirtualMedia(ctx, "CD", imageURL); err != nil {
		t.Fatalf("insert media: %v", err)
	}
	cd, ok := m.Media(machines.MediaCD)
	if !ok || cd.URL != imageURL {
		t.Fatalf("machine's CD = %+v, %v", cd, ok)
	}
	if got, err := os.ReadFile(cd.Path); err != nil || !bytes.Equal(got, iso) {
		t.Fatalf("the BMC's copy of the image = %q, %v", got, err)
	}
	if _, err := client.SetBootDevice(ctx, "cdrom", true, false); err != nil {
		t.Fatalf("boot from cd: %v", err)
	}
	if _, err := client.SetPowerState(ctx, "reset"); err != nil {
		t.Fatalf("reset: %v", err)
	}
	boots = m.Boots()
	last := boots[len(boots)-1]
	if last.Device != drivers.BootCD || last.MediaURL != imageURL || last.MediaPath != cd.Path {
		t.Fatalf("boot after reset = %+v, want from the inserted CD", last)
	}
	if ov, err := client.GetBootDeviceOverride(ctx); err != nil || ov.Device != "cdrom" || !ov.IsPersistent {
		t.Fatalf("persistent override = %+v, %v", ov, err)
	}
	if _, err := client.SetVirtualMedia(ctx, "CD", ""); err != nil {
		t.Fatalf("eject: %v", err)
	}
	if _, ok := m.Media(machines.MediaCD); ok {
		t.Fatal("the CD is still in the machine after eject")
	}
	if _, err := os.Stat(cd.Path); !os.IsNotExist(err) {
		t.Fatalf("the ejected image's copy is still there: %v", err)
	}

	// bmclib's gofish provider does not set BIOS attributes: PATCH the
	// settings object as its BIOS code would.
	settings := map[string]any{"Attributes": map[string]string{"NumLock": "Off"}, "@Redfish.SettingsApplyTime": map[string]string{"ApplyTime": "OnReset"}}
	if resp, body := request(t, e, http.MethodPatch, b.URL()+"/redfish/v1/Systems/1/Bios/Settings", settings, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("set BIOS: %d %s", resp.StatusCode, body)
	}
	if got := b.BIOSAttributes()["NumLock"]; got != "On" {
		t.Fatalf("NumLock before the reset that applies it = %v", got)
	}
	if _, err := client.SetPowerState(ctx, "cycle"); err != nil {
		t.Fatal(err)
	}
	if got := b.BIOSAttributes()["NumLock"]; got != "Off" {
		t.Fatalf("NumLock after reset = %v, want the pending Off applied", got)
	}
	if err := client.ResetBiosConfiguration(ctx); err != nil {
		t.Fatalf("reset BIOS: %v", err)
	}
	testutil.Eventually(t, 10*time.Second, "the BIOS reset task to restore the defaults", func() bool {
		return b.BIOSAttributes()["NumLock"] == "On"
	})

	if _, err := client.SetPowerState(ctx, "off"); err != nil {
		t.Fatalf("off: %v", err)
	}
	if got := power(); got != "Off" {
		t.Fatalf("power after off = %q", got)
	}
	if err := client.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if got := b.Sessions(); got != 0 {
		t.Fatalf("sessions after close = %d, want 0 (logged out)", got)
	}
}

// TestGofishBasicAuthAndInventory reads the system, its NIC and the firmware
// inventory with gofish over basic auth.
func TestGofishBasicAuthAndInventory(t *testing.T) {
	e, b, _ := newBMC(t, sim.Config{})
	c, err := gofish.Connect(gofish.ClientConfig{Endpoint: b.URL(), Username: user, Password: pass, BasicAuth: true, HTTPClient: e.HTTPClient()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Logout()
	systems, err := c.Service.Systems()
	if err != nil || len(systems) != 1 {
		t.Fatalf("systems = %v, %v", systems, err)
	}
	s := systems[0]
	if s.UUID != testInfo.UUID || s.SerialNumber != testInfo.SerialNumber || s.ProcessorSummary.Count != 4 || s.MemorySummary.TotalSystemMemoryGiB != 8 {
		t.Fatalf("system = %+v", s)
	}
	nics, err := s.EthernetInterfaces()
	if err != nil || len(nics) != 1 || nics[0].MACAddress != testInfo.MAC {
		t.Fatalf("nics = %v, %v", nics, err)
	}
	update, err := c.Service.UpdateService()
	if err != nil {
		t.Fatal(err)
	}
	inv, err := update.FirmwareInventories()
	if err != nil || len(inv) != 2 {
		t.Fatalf("firmware inventory = %v, %v", inv, err)
	}
	managers, err := c.Service.Managers()
	if err != nil || len(managers) != 1 {
		t.Fatalf("managers = %v, %v", managers, err)
	}
	vm, err := managers[0].VirtualMedia()
	if err != nil || len(vm) != 2 || !vm[0].SupportsMediaInsert {
		t.Fatalf("virtual media = %v, %v", vm, err)
	}
	chassis, err := c.Service.Chassis()
	if err != nil || len(chassis) != 1 || chassis[0].SerialNumber != testInfo.SerialNumber {
		t.Fatalf("chassis = %v, %v", chassis, err)
	}
	if s.Reset("Nmi") == nil {
		t.Fatal("an NMI to an off machine succeeded")
	}
}

func TestAuthentication(t *testing.T) {
	e, b, _ := newBMC(t, sim.Config{})
	noAuth := map[string]string{"Authorization": ""}
	if resp, _ := request(t, e, http.MethodGet, b.URL()+"/redfish/v1/", nil, noAuth); resp.StatusCode != http.StatusOK {
		t.Fatalf("service root without credentials: %d, want 200", resp.StatusCode)
	}
	if resp, _ := request(t, e, http.MethodGet, b.URL()+"/redfish/v1/Systems", nil, noAuth); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("systems without credentials: %d, want 401", resp.StatusCode)
	}
	wrong := map[string]string{"Authorization": "Basic " + "YWRtaW46d3Jvbmc="} // admin:wrong
	if resp, _ := request(t, e, http.MethodGet, b.URL()+"/redfish/v1/Systems", nil, wrong); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("systems with a wrong password: %d, want 401", resp.StatusCode)
	}
	if resp, _ := request(t, e, http.MethodPost, b.URL()+"/redfish/v1/SessionService/Sessions",
		map[string]string{"UserName": user, "Password": "wrong"}, noAuth); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("session with a wrong password: %d, want 401", resp.StatusCode)
	}
	resp, _ := request(t, e, http.MethodPost, b.URL()+"/redfish/v1/SessionService/Sessions",
		map[string]string{"UserName": user, "Password": pass}, noAuth)
	token, location := resp.Header.Get("X-Auth-Token"), resp.Header.Get("Location")
	if resp.StatusCode != http.StatusCreated || token == "" || !strings.HasPrefix(location, "/redfish/v1/SessionService/Sessions/") {
		t.Fatalf("session: %d token %q location %q", resp.StatusCode, token, location)
	}
	withToken := map[string]string{"Authorization": "", "X-Auth-Token": token}
	if resp, _ := request(t, e, http.MethodGet, b.URL()+"/redfish/v1/Systems/1", nil, withToken); resp.StatusCode != http.StatusOK {
		t.Fatalf("system with the session's token: %d", resp.StatusCode)
	}
	if resp, _ := request(t, e, http.MethodDelete, b.URL()+location, nil, withToken); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	if resp, _ := request(t, e, http.MethodGet, b.URL()+"/redfish/v1/Systems/1", nil, withToken); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("system with a logged-out token: %d, want 401", resp.StatusCode)
	}
	if resp, _ := request(t, e, http.MethodGet, b.URL()+"/emulator/v1/faults", nil, noAuth); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("admin endpoint without credentials: %d, want 401", resp.StatusCode)
	}
	// A client that does not trust the emulator's CA does not connect.
	untrusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12}}}
	if _, err := untrusting.Get(b.URL() + "/redfish/v1/"); err == nil {
		t.Fatal("a client without the emulator's CA connected")
	}
}

func TestBootPatchHonoursETag(t *testing.T) {
	e, b, m := newBMC(t, sim.Config{})
	sys := b.URL() + "/redfish/v1/Systems/1"
	resp, _ := request(t, e, http.MethodGet, sys, nil, nil)
	etag := resp.Header.Get("ETag")
	if etag == "" {
		t.Fatal("the system has no ETag")
	}
	patch := map[string]any{"Boot": map[string]string{"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Continuous"}}
	if resp, _ := request(t, e, http.MethodPatch, sys, patch, map[string]string{"If-Match": etag}); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("patch with the current ETag: %d", resp.StatusCode)
	}
	if ov, _ := m.BootOverride(context.Background()); ov.Target != drivers.BootPXE || !ov.Persistent {
		t.Fatalf("override = %+v", ov)
	}
	// The change made the ETag stale.
	patch = map[string]any{"Boot": map[string]string{"BootSourceOverrideTarget": "Cd"}}
	if resp, _ := request(t, e, http.MethodPatch, sys, patch, map[string]string{"If-Match": etag}); resp.StatusCode != http.StatusPreconditionFailed {
		t.Fatalf("patch with a stale ETag: %d, want 412", resp.StatusCode)
	}
	if ov, _ := m.BootOverride(context.Background()); ov.Target != drivers.BootPXE {
		t.Fatalf("a refused patch changed the override: %+v", ov)
	}
	bad := map[string]any{"Boot": map[string]string{"BootSourceOverrideTarget": "Tape"}}
	if resp, _ := request(t, e, http.MethodPatch, sys, bad, nil); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("patch with an unknown target: %d, want 400", resp.StatusCode)
	}
	off := map[string]any{"Boot": map[string]string{"BootSourceOverrideEnabled": "Disabled"}}
	if resp, _ := request(t, e, http.MethodPatch, sys, off, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("disable the override: %d", resp.StatusCode)
	}
	_, body := request(t, e, http.MethodGet, sys, nil, nil)
	var got struct {
		Boot struct{ BootSourceOverrideTarget, BootSourceOverrideEnabled string }
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if got.Boot.BootSourceOverrideTarget != "None" || got.Boot.BootSourceOverrideEnabled != "Disabled" {
		t.Fatalf("boot after disabling = %+v", got.Boot)
	}
}

func reset(t *testing.T, e *emulator.Emulator, b *emulator.BMC, typ string) int {
	t.Helper()
	resp, _ := request(t, e, http.MethodPost, b.URL()+"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", map[string]string{"ResetType": typ}, nil)
	return resp.StatusCode
}

func TestResetTypes(t *testing.T) {
	e, b, m := newBMC(t, sim.Config{})
	ctx := context.Background()
	state := func() drivers.PowerState { s, _ := m.PowerState(ctx); return s }
	if got := reset(t, e, b, "ForceRestart"); got != http.StatusConflict {
		t.Fatalf("ForceRestart while off: %d, want 409", got)
	}
	if got := reset(t, e, b, "PowerCycle"); got != http.StatusNoContent || state() != drivers.PowerOn {
		t.Fatalf("PowerCycle while off: %d, %s; want on", got, state())
	}
	if got := reset(t, e, b, "Nmi"); got != http.StatusNoContent || m.NMIs() != 1 {
		t.Fatalf("Nmi: %d, %d NMIs", got, m.NMIs())
	}
	if got := reset(t, e, b, "GracefulShutdown"); got != http.StatusNoContent || state() != drivers.PowerOff {
		t.Fatalf("GracefulShutdown: %d, %s", got, state())
	}
	if got := reset(t, e, b, "Hibernate"); got != http.StatusBadRequest {
		t.Fatalf("an unknown reset type: %d, want 400", got)
	}
}

func TestAckNotApply(t *testing.T) {
	e, b, m := newBMC(t, sim.Config{})
	b.SetFaults(emulator.Faults{AckNotApply: 2})
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if got := reset(t, e, b, "On"); got != http.StatusNoContent {
			t.Fatalf("On %d: %d", i, got)
		}
		if s, _ := m.PowerState(ctx); s != drivers.PowerOff {
			t.Fatalf("On %d was applied while acknowledged-not-applied", i)
		}
	}
	if got := reset(t, e, b, "On"); got != http.StatusNoContent {
		t.Fatal(got)
	}
	if s, _ := m.PowerState(ctx); s != drivers.PowerOn {
		t.Fatal("the third On was not applied")
	}
	if got := b.NotApplied(); got != 2 {
		t.Fatalf("not applied = %d, want 2", got)
	}
	if got := b.Requests(http.MethodPost, "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"); got != 3 {
		t.Fatalf("reset requests = %d, want 3", got)
	}
	// Always: a boot override is acknowledged and never applied.
	b.SetFaults(emulator.Faults{AckNotApply: emulator.Always})
	patch := map[string]any{"Boot": map[string]string{"BootSourceOverrideTarget": "Pxe"}}
	for i := 0; i < 3; i++ {
		if resp, _ := request(t, e, http.MethodPatch, b.URL()+"/redfish/v1/Systems/1", patch, nil); resp.StatusCode != http.StatusNoContent {
			t.Fatal(resp.StatusCode)
		}
	}
	if ov, _ := m.BootOverride(ctx); ov.Target != "" {
		t.Fatalf("override applied under Always: %+v", ov)
	}
}

func TestUnavailableBurstAndDrop(t *testing.T) {
	e, b, _ := newBMC(t, sim.Config{})
	b.SetFaults(emulator.Faults{Unavailable: 2, RetryAfter: 2 * time.Second})
	sys := b.URL() + "/redfish/v1/Systems/1"
	for i := 0; i < 2; i++ {
		resp, _ := request(t, e, http.MethodGet, sys, nil, nil)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "2" {
			t.Fatalf("request %d: %d Retry-After %q, want 503 and 2", i, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	if resp, _ := request(t, e, http.MethodGet, sys, nil, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the burst: %d", resp.StatusCode)
	}
	if got := b.Requests(http.MethodGet, "/redfish/v1/Systems/1/"); got != 3 {
		t.Fatalf("counted %d requests, want 3", got)
	}

	b.SetFaults(emulator.Faults{Drop: 1})
	if _, err := e.HTTPClient().Get(b.URL() + "/redfish/v1/"); err == nil {
		t.Fatal("a dropped request got an answer")
	}
	if resp, _ := request(t, e, http.MethodGet, b.URL()+"/redfish/v1/", nil, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the drop: %d", resp.StatusCode)
	}
	if got := b.Requests(http.MethodGet, "/redfish/v1"); got != 2 {
		t.Fatalf("counted %d service root requests, want 2", got)
	}
}

// TestTasksAndAdminEndpoint slows tasks through the admin endpoint and
// follows a BIOS reset's task monitor to completion.
func TestTasksAndAdminEndpoint(t *testing.T) {
	e, b, _ := newBMC(t, sim.Config{})
	faults := map[string]any{"slowTasks": "300ms", "ackNotApply": 0}
	if resp, _ := request(t, e, http.MethodPut, b.URL()+"/emulator/v1/faults", faults, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("put faults: %d", resp.StatusCode)
	}
	if got := b.Faults().SlowTasks; got != 300*time.Millisecond {
		t.Fatalf("slow tasks = %v", got)
	}
	resp, body := request(t, e, http.MethodPost, b.URL()+"/redfish/v1/Systems/1/Bios/Actions/Bios.ResetBios", map[string]any{}, nil)
	monitor := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusAccepted || monitor == "" {
		t.Fatalf("ResetBios: %d %q %s", resp.StatusCode, monitor, body)
	}
	var task struct{ Id, TaskState string }
	testutil.Eventually(t, 10*time.Second, "the task monitor to report the task done", func() bool {
		resp, body := request(t, e, http.MethodGet, b.URL()+monitor, nil, nil)
		if resp.StatusCode == http.StatusAccepted {
			return false
		}
		if err := json.Unmarshal(body, &task); err != nil {
			t.Fatal(err)
		}
		return true
	})
	if task.TaskState != "Completed" {
		t.Fatalf("task = %+v", task)
	}
	_, body = request(t, e, http.MethodGet, b.URL()+"/redfish/v1/TaskService/Tasks", nil, nil)
	if !strings.Contains(string(body), "/redfish/v1/TaskService/Tasks/"+task.Id) {
		t.Fatalf("tasks collection lacks the task: %s", body)
	}
	_, body = request(t, e, http.MethodGet, b.URL()+"/emulator/v1/requests", nil, nil)
	var counts struct{ Requests map[string]int }
	if err := json.Unmarshal(body, &counts); err != nil {
		t.Fatal(err)
	}
	if counts.Requests["POST /redfish/v1/Systems/1/Bios/Actions/Bios.ResetBios"] != 1 {
		t.Fatalf("counts = %v", counts.Requests)
	}
}

func TestSimpleUpdateInstallsTheFetchedImage(t *testing.T) {
	e, b, _ := newBMC(t, sim.Config{})
	media := mediaServer(t, []byte("firmware image"))
	resp, _ := request(t, e, http.MethodPost, b.URL()+"/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
		map[string]any{"ImageURI": media.URL + "/boot/ramdisk.iso", "Targets": []string{"/redfish/v1/UpdateService/FirmwareInventory/BMC"}}, nil)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatal(resp.StatusCode)
	}
	testutil.Eventually(t, 10*time.Second, "the BMC firmware to change version", func() bool {
		return strings.HasPrefix(b.Firmware()["BMC"], "sha256-")
	})
	if got := b.Firmware()["BIOS"]; got != "1.0.0" {
		t.Fatalf("the BIOS changed too: %s", got)
	}
}

func TestHostLoggerIsTheConsole(t *testing.T) {
	e, b, m := newBMC(t, sim.Config{Hook: func(ctx context.Context, boot sim.Boot) {
		_, _ = boot.Machine.Console().Write([]byte("ramdisk: hello from " + boot.MAC + "\n"))
	}})
	if got := reset(t, e, b, "On"); got != http.StatusNoContent {
		t.Fatal(got)
	}
	testutil.Eventually(t, 10*time.Second, "the guest to write to its console", func() bool {
		return strings.Contains(string(m.SerialLog()), "ramdisk: hello")
	})
	_, body := request(t, e, http.MethodGet, b.URL()+"/redfish/v1/Systems/1/LogServices/HostLogger/Entries", nil, nil)
	if !strings.Contains(string(body), "ramdisk: hello from "+testInfo.MAC) {
		t.Fatalf("host logger entries lack the console line: %s", body)
	}
}

package site

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/bmc"
	"github.com/better-compute/better-compute/drivers/ipmisim"
	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/sim"
	"github.com/better-compute/better-compute/drivers/redfish/emulator"
	"github.com/better-compute/better-compute/workflows/metal"
)

// driverPolicy keeps read-backs short: the emulator and fakebmc apply
// writes at once, so a write that does not show within a second was
// dropped.
var driverPolicy = drivers.Policy{ReadBackFor: time.Second, RetryFor: 5 * time.Second, RetryInterval: 50 * time.Millisecond,
	ReadBackInterval: 20 * time.Millisecond}

// withDrivers replaces the rig's BMC by the real drivers (Redfish, then
// IPMI) behind a registry that logs to the rig's log.
func (r *rig) withDrivers() {
	r.acts.bmc = drivers.NewRegistry(drivers.Limits{}, r.acts.t.a.log,
		bmc.NewRedfish(bmc.RedfishOptions{Policy: driverPolicy}), bmc.NewIPMI(bmc.IPMIOptions{Policy: driverPolicy}))
}

// booted is what the simulated machine's "ramdisk" found: the boot
// configuration inside the ISO its BMC fetched from the boot server.
type booted struct {
	dev    drivers.BootDevice
	url    string
	initrd []byte
}

// A ramdisk boot through the real Redfish driver and the emulator: the
// emulated BMC fetches the boot's ISO from the boot server, the simulated
// machine boots from cd (the override used once) and finds the boot's
// configuration in the ISO's initrd; EndBoot ejects the media and powers
// off. Misbehaving BMCs: an acknowledged write never applied fails as
// not-applied, a wrong password as auth.
func TestBootRamdiskOnEmulator(t *testing.T) {
	requireISOTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := newRig(t)
	r.withDrivers()

	e, err := emulator.New(emulator.Config{Username: "admin", Password: testPassword, TaskDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	boots := make(chan booted, 4)
	hookDir := t.TempDir()
	m := sim.New(sim.Config{Info: machines.Info{UUID: "8d2c1f7e-0c1b-4a2d-9e3f-112233445566", SerialNumber: "SIM-SITE-1",
		Manufacturer: "Better Compute", Model: "Simulated", MAC: "52:54:00:12:34:99", CPUs: 2, MemoryMiB: 4096},
		Hook: func(_ context.Context, b sim.Boot) {
			got := booted{dev: b.Device, url: b.MediaURL}
			if b.MediaPath != "" {
				if iso, err := os.ReadFile(b.MediaPath); err == nil {
					got.initrd, _ = extractISO(hookDir, iso, image.ISOInitrdPath)
				}
			}
			boots <- got
		}})
	b, err := e.AddBMC("bmc-1", m)
	if err != nil {
		t.Fatal(err)
	}
	r.api.nodes["node_rf"] = protocol.SiteBMCCredentialsResult{NodeID: "node_rf", Redfish: &protocol.BMCCredentials{
		Address: b.URL(), Username: "admin", Password: testPassword, CAPEM: string(e.CAPEM())}}
	ref := metal.MachineRef{NodeID: "node_rf", SiteID: "site_1", RedfishAddress: b.URL()}

	st, err := r.acts.VerifyBMC(ctx, ref)
	if err != nil || st.Driver != drivers.DriverRedfish || st.Power != "off" || st.Manufacturer != "Better Compute" {
		t.Fatalf("VerifyBMC = %+v, %v", st, err)
	}
	hw, err := r.acts.InspectOOB(ctx, ref)
	if err != nil || !hw.Supported || hw.SerialNumber != "SIM-SITE-1" || len(hw.MACs) == 0 || hw.MACs[0] != "52:54:00:12:34:99" {
		t.Fatalf("InspectOOB = %+v, %v", hw, err)
	}

	started := time.Now()
	res, err := r.acts.BootRamdisk(ctx, metal.BootRequest{Machine: ref, BootID: "boot_vm", Purpose: "inspect"})
	took := time.Since(started)
	if err != nil {
		t.Fatalf("BootRamdisk: %v", err)
	}
	t.Logf("BootRamdisk against a simulated machine behind the Redfish emulator (ISO build and fetch included): %v", took)
	if res.Via != ViaVirtualMedia || res.Power != "on" {
		t.Fatalf("BootRamdisk = %+v", res)
	}
	var got booted
	select {
	case got = <-boots:
	case <-ctx.Done():
		t.Fatal("the machine never booted")
	}
	isoURL := r.bootURL + "/boot/boot_vm/ramdisk.iso"
	if got.dev != drivers.BootCD || got.url != isoURL {
		t.Fatalf("the machine booted %+v, want cd from %s", got, isoURL)
	}
	app, err := image.Appendix(protocol.RamdiskBootConfig{APIURL: machineAPIURL, Token: testBootToken, BootID: "boot_vm", Purpose: "inspect"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(got.initrd, app) {
		t.Fatal("the ISO the BMC fetched does not carry the boot's configuration")
	}
	if ov, _ := m.BootOverride(ctx); ov.Target != "" {
		t.Fatalf("the one-time override is still set after the boot: %+v", ov)
	}
	if media, ok := m.Media(machines.MediaCD); !ok || media.URL != isoURL {
		t.Fatalf("the cd holds %+v, want %s", media, isoURL)
	}

	if err := r.acts.EndBoot(ctx, metal.EndBootRequest{Machine: ref, BootID: "boot_vm", PowerOff: true}); err != nil {
		t.Fatalf("EndBoot: %v", err)
	}
	if _, ok := m.Media(machines.MediaCD); ok {
		t.Fatal("the media is still inserted after EndBoot")
	}
	if ps, _ := m.PowerState(ctx); ps != drivers.PowerOff {
		t.Fatalf("the machine is %s after EndBoot with power off", ps)
	}
	if code, _, _ := get(t, isoURL); code != http.StatusNotFound {
		t.Fatalf("GET the ISO after EndBoot = %d, want 404", code)
	}
	console, err := r.acts.ConsoleLog(ctx, metal.ConsoleLogRequest{Machine: ref, MaxBytes: 4096})
	if err != nil || !strings.Contains(string(console), "boot 1 from cd") {
		t.Fatalf("ConsoleLog = %q, %v", console, err)
	}

	// The BMC acknowledges power changes it never applies.
	b.SetFaults(emulator.Faults{AckNotApply: emulator.Always})
	_, err = r.acts.Power(ctx, metal.PowerRequest{Machine: ref, Action: "on"})
	appErr(t, err, metal.ErrTypeNotApplied, true)
	b.SetFaults(emulator.Faults{})
	if pr, err := r.acts.Power(ctx, metal.PowerRequest{Machine: ref, Action: "on"}); err != nil || pr.Power != "on" {
		t.Fatalf("Power on = %+v, %v", pr, err)
	}

	// Stored credentials the BMC refuses.
	r.api.nodes["node_bad"] = protocol.SiteBMCCredentialsResult{NodeID: "node_bad", Redfish: &protocol.BMCCredentials{
		Address: b.URL(), Username: "admin", Password: "not-the-password", CAPEM: string(e.CAPEM())}}
	_, err = r.acts.VerifyBMC(ctx, metal.MachineRef{NodeID: "node_bad", SiteID: "site_1"})
	appErr(t, err, metal.ErrTypeBMCAuth, true)
	if strings.Contains(err.Error(), "not-the-password") {
		t.Fatalf("the error carries the password: %v", err)
	}

	logs := r.logs.String()
	for _, secret := range []string{testPassword, "not-the-password", testBootToken, testSiteToken} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a secret is in the logs:\n%s", logs)
		}
	}
	if n := r.api.creds("node_rf"); n != 7 {
		t.Fatalf("credentials fetched %d times for 7 calls", n)
	}
}

// Power over IPMI through fakebmc with read-back (a cycle is off then on),
// and a PXE boot: the boot device is pxe once and the boot server answers
// the machine's MAC with its boot.
func TestMetalOverIPMI(t *testing.T) {
	peer := ipmisim.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := newRig(t)
	r.withDrivers()
	r.api.nodes["node_ipmi"] = protocol.SiteBMCCredentialsResult{NodeID: "node_ipmi", IPMI: &protocol.BMCCredentials{
		Address: peer.Addr, Username: ipmisim.Username, Password: ipmisim.Password}}
	ref := ipmiRef()
	ref.IPMIAddress = peer.Addr

	for _, c := range []struct{ action, want string }{{"off", "off"}, {"status", "off"}, {"on", "on"}, {"cycle", "on"}, {"off", "off"}} {
		pr, err := r.acts.Power(ctx, metal.PowerRequest{Machine: ref, Action: c.action})
		if err != nil || pr.Power != c.want || pr.Driver != drivers.DriverIPMI {
			t.Fatalf("Power %s = %+v, %v; want %s from %s", c.action, pr, err, c.want, drivers.DriverIPMI)
		}
	}
	res, err := r.acts.BootRamdisk(ctx, metal.BootRequest{Machine: ref, BootID: "boot_pxe", Purpose: "clean"})
	if err != nil || res.Via != ViaPXE || res.Power != "on" {
		t.Fatalf("BootRamdisk over IPMI = %+v, %v", res, err)
	}
	if out, err := peer.Ipmitool(ctx, "chassis", "bootparam", "get", "5"); err != nil || !strings.Contains(out, "Force PXE") {
		t.Fatalf("fakebmc's boot flags = %q, %v; want pxe", out, err)
	}
	code, body, _ := get(t, r.bootURL+"/boot/mac/52:54:00:ab:cd:ef/boot.json")
	var cfg protocol.RamdiskBootConfig
	if code != http.StatusOK || json.Unmarshal(body, &cfg) != nil || cfg.BootID != "boot_pxe" {
		t.Fatalf("GET boot.json by MAC = %d %s", code, body)
	}
	if err := r.acts.EndBoot(ctx, metal.EndBootRequest{Machine: ref, BootID: "boot_pxe", PowerOff: true}); err != nil {
		t.Fatalf("EndBoot: %v", err)
	}
	if pr, err := r.acts.Power(ctx, metal.PowerRequest{Machine: ref, Action: "status"}); err != nil || pr.Power != "off" {
		t.Fatalf("Power status after EndBoot = %+v, %v", pr, err)
	}
	// InspectOOB and a BIOS reset are not IPMI's: unsupported, not failed.
	if hw, err := r.acts.InspectOOB(ctx, ref); err != nil || hw.Supported {
		t.Fatalf("InspectOOB over IPMI = %+v, %v", hw, err)
	}
	if b, err := r.acts.ResetBIOS(ctx, ref); err != nil || b.Supported {
		t.Fatalf("ResetBIOS over IPMI = %+v, %v", b, err)
	}

	r.api.nodes["node_bad"] = protocol.SiteBMCCredentialsResult{NodeID: "node_bad", IPMI: &protocol.BMCCredentials{
		Address: peer.Addr, Username: ipmisim.Username, Password: "wrong-password"}}
	_, err = r.acts.Power(ctx, metal.PowerRequest{Machine: metal.MachineRef{NodeID: "node_bad", SiteID: "site_1"}, Action: "status"})
	appErr(t, err, metal.ErrTypeBMCAuth, true)
	if strings.Contains(r.logs.String(), "wrong-password") || strings.Contains(err.Error(), "wrong-password") {
		t.Fatal("the password is in the logs or the error")
	}
}

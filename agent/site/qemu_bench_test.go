package site

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image/imagetest"
	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/qemu"
	"github.com/better-compute/better-compute/drivers/redfish/emulator"
	"github.com/better-compute/better-compute/workflows/metal"
)

// BenchmarkBootRamdiskQEMU measures a ramdisk boot end to end on a QEMU
// machine behind the Redfish emulator: BootRamdisk (the boot's ISO built
// from the real ramdisk, fetched by the emulated BMC from the boot server,
// cd once, power on), then the ramdisk inside the VM reporting with the
// boot's token through QEMU's user-mode network. It needs `make kernel` and
// QEMU; the VM boots the ISO's kernel and initrd directly (the emulator's
// shortcut past the BIOS).
func BenchmarkBootRamdiskQEMU(b *testing.B) {
	requireISOTools(b)
	base := imagetest.Base(b, b.TempDir())
	images, err := NewRamdiskImages(base.Kernel, base.Initrd, "")
	if err != nil {
		b.Fatal(err)
	}
	r := newRig(b)
	r.withDrivers()
	r.boot.images = images
	u, err := url.Parse(r.apiURL)
	if err != nil {
		b.Fatal(err)
	}
	r.boot.apiURL = "http://10.0.2.2:" + u.Port()
	reports := make(chan string, 4)
	r.api.ramdisk = func(w http.ResponseWriter, path string, body []byte) {
		var rep protocol.RamdiskReport
		_ = json.Unmarshal(body, &rep)
		if path == protocol.RamdiskReportPath {
			select {
			case reports <- rep.Token:
			default: // a waiting ramdisk reports again; the first one counts
			}
		}
		_ = json.NewEncoder(w).Encode(protocol.RamdiskInstructions{NodeID: "node_rf", Steps: []protocol.RamdiskStep{{Name: protocol.StepWait}}})
	}

	e, err := emulator.New(emulator.Config{Username: "admin", Password: testPassword})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Close() })
	m, err := qemu.New(qemu.Config{Info: machines.Info{UUID: "0c6f2d8e-6a51-4d8f-8a7e-5b1f0e2a9c31", SerialNumber: "BC-SITE-VM-1",
		Manufacturer: "Better Compute", Model: "Emulated TCG", MAC: "52:54:00:12:34:77", CPUs: 1, MemoryMiB: 512},
		CDMode: qemu.ModeDirect})
	if err != nil {
		b.Skipf("no QEMU machine here: %v", err)
	}
	bmcPeer, err := e.AddBMC("bmc-vm", m)
	if err != nil {
		b.Fatal(err)
	}
	r.api.nodes["node_rf"] = protocol.SiteBMCCredentialsResult{NodeID: "node_rf", Redfish: &protocol.BMCCredentials{
		Address: bmcPeer.URL(), Username: "admin", Password: testPassword, CAPEM: string(e.CAPEM())}}
	ref := metal.MachineRef{NodeID: "node_rf", SiteID: "site_1", RedfishAddress: bmcPeer.URL()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var bootTook, reportTook time.Duration
	i := 0
	for b.Loop() {
		id := fmt.Sprintf("boot_q%d", i)
		token := fmt.Sprintf("%sq%d", testBootToken, i)
		i++
		r.api.mu.Lock()
		r.api.boots[id] = protocol.SiteBootTokenResult{BootID: id, NodeID: "node_rf", Purpose: "inspect", Token: token}
		r.api.mu.Unlock()
		start := time.Now()
		if _, err := r.acts.BootRamdisk(ctx, metal.BootRequest{Machine: ref, BootID: id, Purpose: "inspect"}); err != nil {
			b.Fatal(err)
		}
		bootTook += time.Since(start)
		select {
		case got := <-reports:
			if got != token {
				b.Fatal("the ramdisk reported with another token")
			}
		case <-ctx.Done():
			b.Fatalf("no report; console:\n%s", m.SerialLog())
		}
		reportTook += time.Since(start)
		if err := r.acts.EndBoot(ctx, metal.EndBootRequest{Machine: ref, BootID: id, PowerOff: true}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(bootTook.Seconds()/float64(i), "BootRamdisk-s")
	b.ReportMetric(reportTook.Seconds()/float64(i), "boot-to-report-s")
}

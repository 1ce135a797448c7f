package bmc_test

import (
	"context"
	"net"
	"testing"

	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/ipmisim"
)

// The latency of each call against each peer (go test -bench . -run ^$).
// Every call opens and closes its own session, as the site agent's do.

func BenchmarkRedfish(b *testing.B) {
	p := startEmulator(b, "bmc-1")[0]
	r, m, ctx := redfishRegistry(drivers.Limits{}), rfMachine(p.ep), context.Background()
	url := mediaServer(b)
	for _, c := range []struct {
		name string
		op   func(i int) error
	}{
		{"PowerState", func(int) error { _, _, err := r.PowerState(ctx, m); return err }},
		{"SetPower", func(i int) error {
			_, _, err := r.SetPower(ctx, m, []drivers.PowerAction{drivers.ActionOn, drivers.ActionOff}[i%2])
			return err
		}},
		{"SetBootDevice", func(i int) error {
			_, err := r.SetBootDevice(ctx, m, []drivers.BootDevice{drivers.BootPXE, drivers.BootDisk}[i%2], false)
			return err
		}},
		{"InsertEjectMedia", func(int) error {
			if _, err := r.InsertMedia(ctx, m, drivers.Media{URL: url, Kind: "cd"}); err != nil {
				return err
			}
			_, err := r.EjectMedia(ctx, m)
			return err
		}},
		{"Verify", func(int) error { _, _, err := r.Verify(ctx, m); return err }},
		{"Inspect", func(int) error { _, _, err := r.Inspect(ctx, m); return err }},
		{"ConsoleLog", func(int) error { _, _, err := r.ConsoleLog(ctx, m, 4096); return err }},
		{"ResetBIOS", func(int) error { _, err := r.ResetBIOS(ctx, m); return err }},
		{"Firmware", func(int) error { _, _, err := r.Firmware(ctx, m); return err }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if err := c.op(i); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkIPMI(b *testing.B) {
	peer := ipmisim.Start(b)
	r, m, ctx := ipmiRegistry(), ipmiMachine(peer.Endpoint()), context.Background()
	for _, c := range []struct {
		name string
		op   func(i int) error
	}{
		{"PowerState", func(int) error { _, _, err := r.PowerState(ctx, m); return err }},
		{"SetPower", func(i int) error {
			_, _, err := r.SetPower(ctx, m, []drivers.PowerAction{drivers.ActionOn, drivers.ActionOff}[i%2])
			return err
		}},
		{"Cycle", func(int) error { _, _, err := r.SetPower(ctx, m, drivers.ActionCycle); return err }},
		{"SetBootDevice", func(i int) error {
			_, err := r.SetBootDevice(ctx, m, []drivers.BootDevice{drivers.BootPXE, drivers.BootDisk}[i%2], false)
			return err
		}},
		{"Verify", func(int) error { _, _, err := r.Verify(ctx, m); return err }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if err := c.op(i); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFailover is a power read on a machine whose Redfish endpoint
// refuses connections, served by IPMI.
func BenchmarkFailover(b *testing.B) {
	peer := ipmisim.Start(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	down := "https://" + ln.Addr().String()
	_ = ln.Close()
	r, ctx := bothRegistry(), context.Background()
	m := drivers.Machine{NodeID: "nod_both", SiteID: "sit_1", IPMI: peer.Endpoint(),
		Redfish: &drivers.Endpoint{Address: down, Username: rfUser, Password: rfPass}}
	for i := 0; i < b.N; i++ {
		if _, served, err := r.PowerState(ctx, m); err != nil || served != drivers.DriverIPMI {
			b.Fatalf("served by %q: %v", served, err)
		}
	}
}

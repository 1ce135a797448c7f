package bmc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/bmc"
	"github.com/better-compute/better-compute/drivers/ipmisim"
)

func ipmiRegistry() *drivers.Registry {
	return drivers.NewRegistry(drivers.Limits{}, nil,
		bmc.NewIPMI(bmc.IPMIOptions{ConnectTimeout: 500 * time.Millisecond, CipherSuite: "3",
			Policy: drivers.Policy{ReadBackFor: 5 * time.Second}}))
}

func ipmiMachine(ep *drivers.Endpoint) drivers.Machine {
	return drivers.Machine{NodeID: "nod_ipmi", SiteID: "sit_1", IPMI: ep}
}

func peerPower(t *testing.T, b *ipmisim.BMC) string {
	t.Helper()
	out, err := b.Ipmitool(context.Background(), "chassis", "power", "status")
	if err != nil {
		t.Fatalf("peer power status: %v: %s", err, out)
	}
	return strings.TrimSpace(out)
}

func TestIPMIPowerOnOffCycle(t *testing.T) {
	b := ipmisim.Start(t)
	r, m, ctx := ipmiRegistry(), ipmiMachine(b.Endpoint()), context.Background()

	p, served, err := r.PowerState(ctx, m)
	if err != nil || p != drivers.PowerOff || served != drivers.DriverIPMI {
		t.Fatalf("PowerState = %q, %q, %v; want off from ipmi/v1", p, served, err)
	}
	for _, c := range []struct {
		a    drivers.PowerAction
		want drivers.PowerState
		peer string
	}{
		{drivers.ActionOn, drivers.PowerOn, "Chassis Power is on"},
		{drivers.ActionCycle, drivers.PowerOn, "Chassis Power is on"},
		{drivers.ActionOff, drivers.PowerOff, "Chassis Power is off"},
		// A reset of a machine that is off powers it on.
		{drivers.ActionReset, drivers.PowerOn, "Chassis Power is on"},
	} {
		p, _, err := r.SetPower(ctx, m, c.a)
		if err != nil || p != c.want {
			t.Fatalf("SetPower(%s) = %q, %v; want %q", c.a, p, err, c.want)
		}
		if got := peerPower(t, b); got != c.peer {
			t.Fatalf("after %s the peer says %q, want %q", c.a, got, c.peer)
		}
	}
	// The cycle reached the peer as an off then an on (fakebmc prints
	// each change): on, off, on (the cycle), off, on (the reset).
	log := b.Log()
	if strings.Count(log, "abruptly remove power") != 2 || strings.Count(log, "powered on") != 3 {
		t.Fatalf("the peer did not see off, on for the cycle:\n%s", log)
	}
}

func TestIPMIBootDevicePXE(t *testing.T) {
	b := ipmisim.Start(t)
	r, m, ctx := ipmiRegistry(), ipmiMachine(b.Endpoint()), context.Background()
	if _, err := r.SetBootDevice(ctx, m, drivers.BootPXE, false); err != nil {
		t.Fatal(err)
	}
	out, err := b.Ipmitool(ctx, "chassis", "bootparam", "get", "5")
	if err != nil || !strings.Contains(out, "Boot Device Selector : Force PXE") {
		t.Fatalf("the peer's boot flags: %v\n%s", err, out)
	}
	if _, err := r.SetBootDevice(ctx, m, drivers.BootDisk, true); err != nil {
		t.Fatal(err)
	}
	out, _ = b.Ipmitool(ctx, "chassis", "bootparam", "get", "5")
	if !strings.Contains(out, "Force Boot from default Hard-Drive") {
		t.Fatalf("the peer's boot flags after disk:\n%s", out)
	}
}

func TestIPMIVerify(t *testing.T) {
	b := ipmisim.Start(t)
	info, served, err := ipmiRegistry().Verify(context.Background(), ipmiMachine(b.Endpoint()))
	if err != nil {
		t.Fatal(err)
	}
	if served != drivers.DriverIPMI || info.Driver != drivers.DriverIPMI || info.Power != drivers.PowerOff || info.Firmware != "1.00" {
		t.Fatalf("Verify = %+v from %q", info, served)
	}
}

func TestIPMIWrongPasswordIsErrAuth(t *testing.T) {
	b := ipmisim.Start(t)
	ep := b.Endpoint()
	ep.Password = "not-the-password"
	_, _, err := ipmiRegistry().Verify(context.Background(), ipmiMachine(ep))
	if !errors.Is(err, drivers.ErrAuth) {
		t.Fatalf("Verify with a wrong password: %v, want ErrAuth", err)
	}
	if strings.Contains(err.Error(), "not-the-password") {
		t.Fatalf("the error shows the password: %v", err)
	}
}

func TestIPMIClosedPortIsErrUnreachable(t *testing.T) {
	b := ipmisim.Start(t)
	ep := b.Endpoint()
	b.Stop() // the port is now closed
	_, _, err := ipmiRegistry().PowerState(context.Background(), ipmiMachine(ep))
	if !errors.Is(err, drivers.ErrUnreachable) {
		t.Fatalf("PowerState at a closed port: %v, want ErrUnreachable", err)
	}
}

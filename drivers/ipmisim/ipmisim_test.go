package ipmisim_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/drivers/ipmisim"
)

func TestStartAnswersAndStopEnds(t *testing.T) {
	b := ipmisim.Start(t)
	ctx := context.Background()
	if out, err := b.Ipmitool(ctx, "chassis", "power", "on"); err != nil {
		t.Fatalf("power on: %v: %s", err, out)
	}
	if out, err := b.Ipmitool(ctx, "chassis", "power", "status"); err != nil || strings.TrimSpace(out) != "Chassis Power is on" {
		t.Fatalf("power status: %v: %q", err, out)
	}
	if !strings.Contains(b.Log(), "powered on") {
		t.Fatalf("the log does not show the power on: %q", b.Log())
	}
	b.Stop()
	if out, err := b.Ipmitool(ctx, "chassis", "power", "status"); err == nil {
		t.Fatalf("a stopped fakebmc answered: %q", out)
	}
	b.Stop() // stopping twice is harmless
}

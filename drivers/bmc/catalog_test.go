package bmc_test

import (
	"reflect"
	"runtime/debug"
	"testing"

	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/bmc"
)

// The catalog drivers.list answers is data; it must say what the drivers
// implement, and the version this binary links.
func TestCatalogMatchesTheDrivers(t *testing.T) {
	impls := map[string]drivers.Driver{
		drivers.DriverRedfish: bmc.NewRedfish(bmc.RedfishOptions{}),
		drivers.DriverIPMI:    bmc.NewIPMI(bmc.IPMIOptions{}),
	}
	cat := drivers.Catalog()
	if len(cat) != len(impls) {
		t.Fatalf("the catalog lists %d drivers, there are %d", len(cat), len(impls))
	}
	for _, info := range cat {
		d, ok := impls[info.Name]
		if !ok {
			t.Fatalf("the catalog lists %q, which is not a driver", info.Name)
		}
		if got := drivers.Serves(d); !reflect.DeepEqual(got, info.Concerns) {
			t.Errorf("%s implements %v, the catalog says %v", info.Name, got, info.Concerns)
		}
		if info.Version != drivers.BMCLibVersion {
			t.Errorf("%s's version is %q, want %q", info.Name, info.Version, drivers.BMCLibVersion)
		}
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Skip("the test binary records no build information")
	}
	for _, m := range bi.Deps {
		if m.Path == drivers.BMCLibModule && m.Version != drivers.BMCLibVersion {
			t.Fatalf("go.mod has bmclib %s, drivers.BMCLibVersion says %s", m.Version, drivers.BMCLibVersion)
		}
	}
}

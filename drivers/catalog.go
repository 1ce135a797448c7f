package drivers

import (
	"fmt"
	"runtime/debug"
	"slices"
)

// Info describes one driver for drivers.list.
type Info struct {
	Name     string `json:"name"`
	Protocol string `json:"protocol"`
	// Library is the Go module the driver is built on, at Version.
	Library  string    `json:"library"`
	Version  string    `json:"version"`
	Concerns []Concern `json:"concerns"`
}

// BMCLibModule is the module both drivers are built on; BMCLibVersion is
// its version as go.mod pins it, answered where the binary does not link
// the module (the API server lists drivers it does not run). A test of
// drivers/bmc holds it to the linked version.
const (
	BMCLibModule  = "github.com/bmc-toolbox/bmclib/v2"
	BMCLibVersion = "v2.3.5"
)

// catalog is the drivers the site agent runs and the concerns each
// implements; a test of drivers/bmc holds it to the implementations.
var catalog = []Info{
	{Name: DriverRedfish, Protocol: "redfish", Library: BMCLibModule, Concerns: []Concern{
		ConcernPower, ConcernManagement, ConcernBoot, ConcernVirtualMedia, ConcernInspect, ConcernConsole, ConcernBIOS, ConcernFirmware}},
	{Name: DriverIPMI, Protocol: "ipmi", Library: BMCLibModule, Concerns: []Concern{
		ConcernPower, ConcernManagement, ConcernBoot}},
}

// CheckBinding says why a node may not bind concern to driver: an unknown
// concern, a driver not in the catalog, or one that does not implement the
// concern ("" when it may).
func CheckBinding(concern, driver string) string {
	if !slices.Contains(Concerns, Concern(concern)) {
		return fmt.Sprintf("%q is not a concern a BMC driver serves", concern)
	}
	for _, d := range catalog {
		if d.Name == driver {
			if slices.Contains(d.Concerns, Concern(concern)) {
				return ""
			}
			return fmt.Sprintf("driver %s does not serve %s", driver, concern)
		}
	}
	return fmt.Sprintf("%q is not a driver of drivers.list", driver)
}

// Catalog lists the drivers, their versions and concerns. The version is
// the linked module's where the build records it.
func Catalog() []Info {
	version := BMCLibVersion
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == BMCLibModule {
				version = m.Version
				if m.Replace != nil {
					version = m.Replace.Version
				}
			}
		}
	}
	out := make([]Info, len(catalog))
	for i, d := range catalog {
		d.Version = version
		d.Concerns = append([]Concern(nil), d.Concerns...)
		out[i] = d
	}
	return out
}

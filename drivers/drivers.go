// Package drivers is how the site agent reaches a machine's BMC: one small
// interface per concern (power, management, boot, virtual media, inspect,
// console, BIOS, firmware), served by named, versioned drivers ("redfish/v1",
// "ipmi/v1") that a node's driver bindings select concern by concern.
//
// Every write is read back: a BMC may acknowledge a power change or a boot
// override it never applies, so a driver's write returns only once a read
// shows the new state (or fails with ErrNotApplied after its retries).
// Credentials reach a driver resolved, in Endpoint.Password, only inside the
// site agent, just before the call; they never travel through a workflow.
package drivers

import (
	"context"
	"errors"
	"log/slog"
)

// Concern is one thing a driver can do to a machine. The values are the
// domain model's concerns that a BMC serves.
type Concern string

// The concerns.
const (
	ConcernPower        Concern = "power"
	ConcernManagement   Concern = "management"
	ConcernBoot         Concern = "boot"
	ConcernVirtualMedia Concern = "virtual-media"
	ConcernInspect      Concern = "inspect"
	ConcernConsole      Concern = "console"
	ConcernBIOS         Concern = "bios"
	ConcernFirmware     Concern = "firmware"
)

// Concerns lists every concern, in the order drivers.list shows them.
var Concerns = []Concern{ConcernPower, ConcernManagement, ConcernBoot, ConcernVirtualMedia,
	ConcernInspect, ConcernConsole, ConcernBIOS, ConcernFirmware}

// Names of the drivers.
const (
	DriverRedfish = "redfish/v1"
	DriverIPMI    = "ipmi/v1"
)

// PowerState is a machine's normalised power state: the node's power axis.
type PowerState string

// The power states.
const (
	PowerOn      PowerState = "on"
	PowerOff     PowerState = "off"
	PowerUnknown PowerState = "unknown"
)

// PowerAction is what metal.power asks for.
type PowerAction string

// The power actions. Cycle is off then on; reset is a warm reset of a
// machine that is on (a machine that is off is powered on).
const (
	ActionOn    PowerAction = "on"
	ActionOff   PowerAction = "off"
	ActionCycle PowerAction = "cycle"
	ActionReset PowerAction = "reset"
)

// BootDevice is the device a machine boots from next.
type BootDevice string

// The boot devices.
const (
	BootPXE  BootDevice = "pxe"
	BootCD   BootDevice = "cd"
	BootDisk BootDevice = "disk"
	BootBIOS BootDevice = "bios"
)

// Secret is a resolved credential. It formats as "[redacted]" so that a
// log line or an error that prints it leaks nothing.
type Secret string

// String redacts the secret.
func (Secret) String() string { return "[redacted]" }

// LogValue redacts the secret in slog records.
func (Secret) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// GoString redacts the secret in %#v.
func (Secret) GoString() string { return "[redacted]" }

// Reveal is the clear value, for the wire protocol only.
func (s Secret) Reveal() string { return string(s) }

// Endpoint is one protocol's way into a BMC.
type Endpoint struct {
	// Address is an https URL for Redfish ("https://10.0.0.5" or with a
	// port) and host[:port] for IPMI (port 623 when omitted).
	Address  string
	Username string
	Password Secret
	// CAPEM pins the Redfish service's certificate authority (PEM); empty
	// uses the system roots. InsecureSkipVerify is for BMCs with
	// self-signed certificates an operator accepted at enrollment.
	CAPEM              string
	InsecureSkipVerify bool
}

// Machine is one enrolled machine as the drivers see it: its BMC endpoints
// (one or both protocols) and which driver serves each concern. A concern
// without a binding is served by the first driver, in Redfish then IPMI
// order, that has an endpoint and implements the concern.
type Machine struct {
	NodeID   string
	SiteID   string
	Redfish  *Endpoint
	IPMI     *Endpoint
	Bindings map[Concern]string
}

// BMCInfo is what management's Verify learns of a BMC.
type BMCInfo struct {
	Driver       string     `json:"driver"`
	Manufacturer string     `json:"manufacturer,omitempty"`
	Model        string     `json:"model,omitempty"`
	Firmware     string     `json:"firmware,omitempty"`
	Power        PowerState `json:"power"`
}

// Media is an image to insert as virtual media.
type Media struct {
	// URL is where the BMC fetches the image (the site agent's boot
	// server).
	URL string
	// Kind is "cd" (an ISO) or "usb".
	Kind string
}

// HardwareSummary is what an out-of-band inspection reads (Redfish's
// System resource): enough to match a machine before it boots.
type HardwareSummary struct {
	Manufacturer string   `json:"manufacturer,omitempty"`
	Model        string   `json:"model,omitempty"`
	SerialNumber string   `json:"serialNumber,omitempty"`
	UUID         string   `json:"uuid,omitempty"`
	MACs         []string `json:"macs,omitempty"`
	CPUs         int      `json:"cpus,omitempty"`
	MemoryMiB    int64    `json:"memoryMiB,omitempty"`
}

// FirmwareComponent is one firmware inventory entry.
type FirmwareComponent struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// The concern interfaces. A driver implements those it can; Registry
// resolves a machine's binding for a concern to the driver that serves it.

// PowerDriver reads and changes power, reading every change back.
type PowerDriver interface {
	PowerState(ctx context.Context, m Machine) (PowerState, error)
	SetPower(ctx context.Context, m Machine, a PowerAction) (PowerState, error)
}

// ManagementDriver verifies that the BMC answers with the credentials.
type ManagementDriver interface {
	Verify(ctx context.Context, m Machine) (BMCInfo, error)
}

// BootDriver sets the next boot device (once, or persistently).
type BootDriver interface {
	SetBootDevice(ctx context.Context, m Machine, d BootDevice, persistent bool) error
}

// VirtualMediaDriver inserts and ejects virtual media.
type VirtualMediaDriver interface {
	InsertMedia(ctx context.Context, m Machine, media Media) error
	EjectMedia(ctx context.Context, m Machine) error
}

// InspectDriver reads the hardware out of band.
type InspectDriver interface {
	Inspect(ctx context.Context, m Machine) (HardwareSummary, error)
}

// ConsoleDriver reads the tail of the machine's serial console.
type ConsoleDriver interface {
	ConsoleLog(ctx context.Context, m Machine, maxBytes int) ([]byte, error)
}

// BIOSDriver resets BIOS settings to their defaults (provide's clean).
type BIOSDriver interface {
	ResetBIOS(ctx context.Context, m Machine) error
}

// FirmwareDriver lists firmware versions.
type FirmwareDriver interface {
	Firmware(ctx context.Context, m Machine) ([]FirmwareComponent, error)
}

// Errors drivers return; match them with errors.Is.
var (
	// ErrUnsupported: no bound driver serves the concern for the machine.
	ErrUnsupported = errors.New("the concern is not supported for this machine")
	// ErrNotApplied: the BMC acknowledged a write that reads back unchanged
	// after every retry.
	ErrNotApplied = errors.New("the BMC acknowledged the change but did not apply it")
	// ErrAuth: the BMC refused the credentials.
	ErrAuth = errors.New("the BMC refused the credentials")
	// ErrUnreachable: the BMC does not answer at its address.
	ErrUnreachable = errors.New("the BMC is unreachable")
)

// Package metal holds the contract of the metal lifecycle's site
// activities (the workflows are in workflows/metal/lifecycle, so `bcd site`
// links this package without any activity): the names and
// payloads of the activities `bcd site` serves on the site's task queue
// (BMC calls and boot services, which must run inside the site's network).
// The payloads carry no credential: the site agent fetches a node's BMC
// credentials from the API just before it uses them
// (protocol.SiteBMCCredentialsPath), so no secret is ever in a workflow
// history.
package metal

import (
	"context"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/worker"
)

// Names of the site activities as registered. They are persisted in
// workflow histories, so they never change.
const (
	ActivityVerifyBMC   = "MetalVerifyBMC"
	ActivityPower       = "MetalPower"
	ActivityInspectOOB  = "MetalInspectOOB"
	ActivityBootRamdisk = "MetalBootRamdisk"
	ActivityEndBoot     = "MetalEndBoot"
	ActivityResetBIOS   = "MetalResetBIOS"
	ActivityConsoleLog  = "MetalConsoleLog"
)

// Error types of the site activities' application errors (Temporal
// ApplicationError.Type), so the workflow tells a BMC's refusal from a
// transient failure. Auth, unsupported and not-applied are non-retryable;
// unreachable is retried; lease lost means another agent serves the site.
const (
	ErrTypeBMCAuth        = "BMCAuth"
	ErrTypeBMCUnreachable = "BMCUnreachable"
	ErrTypeNotApplied     = "BMCNotApplied"
	ErrTypeUnsupported    = "Unsupported"
	ErrTypeLeaseLost      = "SiteLeaseLost"
	ErrTypeNotFound       = "NotFound"
)

// MachineRef names a machine for a site activity: the node and where its
// BMC answers, without credentials. Bindings map a concern to a driver
// name (drivers.Driver*); the protocols present are those with an address.
type MachineRef struct {
	NodeID         string            `json:"nodeId"`
	SiteID         string            `json:"siteId"`
	RedfishAddress string            `json:"redfishAddress,omitempty"`
	IPMIAddress    string            `json:"ipmiAddress,omitempty"`
	Bindings       map[string]string `json:"bindings,omitempty"`
	// BootMAC is the MAC the machine network-boots from ("" until known).
	BootMAC string `json:"bootMac,omitempty"`
}

// BMCStatus answers ActivityVerifyBMC: the BMC answers with the stored
// credentials, and its power state.
type BMCStatus struct {
	Driver       string `json:"driver"`
	Manufacturer string `json:"manufacturer,omitempty"`
	Model        string `json:"model,omitempty"`
	Firmware     string `json:"firmware,omitempty"`
	Power        string `json:"power"`
}

// PowerRequest is ActivityPower's input: action is on, off, cycle, reset,
// or "status" to only read.
type PowerRequest struct {
	Machine MachineRef `json:"machine"`
	Action  string     `json:"action"`
}

// PowerResult is the power state read back after the action.
type PowerResult struct {
	Power  string `json:"power"`
	Driver string `json:"driver"`
}

// BootRequest is ActivityBootRamdisk's input: boot the machine into the
// ramdisk for one boot (metal_boots row BootID) with the given purpose
// (inspect, clean, deploy, rescue). Via is "virtual-media" (the default
// when the machine's bindings serve it) or "pxe". The site agent fetches
// the boot's one-time token from the API (protocol.SiteBootTokenPath),
// serves the ramdisk with it from its boot server, sets the boot device
// (read back), inserts the media where used, and powers the machine on
// (or resets it when it is on).
type BootRequest struct {
	Machine MachineRef `json:"machine"`
	BootID  string     `json:"bootId"`
	Purpose string     `json:"purpose"`
	Via     string     `json:"via,omitempty"`
}

// BootResult says how the boot was started.
type BootResult struct {
	Via   string `json:"via"`
	Power string `json:"power"`
}

// EndBootRequest is ActivityEndBoot's input: eject the media, stop serving
// the boot's pieces, and power the machine off when PowerOff.
type EndBootRequest struct {
	Machine  MachineRef `json:"machine"`
	BootID   string     `json:"bootId"`
	PowerOff bool       `json:"powerOff"`
}

// InspectOOBResult is the out-of-band hardware summary (Redfish's System
// resource), when a bound driver can read it.
type InspectOOBResult struct {
	Supported    bool     `json:"supported"`
	Manufacturer string   `json:"manufacturer,omitempty"`
	Model        string   `json:"model,omitempty"`
	SerialNumber string   `json:"serialNumber,omitempty"`
	UUID         string   `json:"uuid,omitempty"`
	MACs         []string `json:"macs,omitempty"`
}

// ResetBIOSResult says whether a bound driver could reset BIOS settings.
type ResetBIOSResult struct {
	Supported bool `json:"supported"`
}

// ConsoleLogRequest asks for the tail of a machine's serial console.
type ConsoleLogRequest struct {
	Machine  MachineRef `json:"machine"`
	MaxBytes int        `json:"maxBytes"`
}

// SiteActivities is what `bcd site` implements (agent/site).
type SiteActivities interface {
	VerifyBMC(ctx context.Context, m MachineRef) (BMCStatus, error)
	Power(ctx context.Context, r PowerRequest) (PowerResult, error)
	InspectOOB(ctx context.Context, m MachineRef) (InspectOOBResult, error)
	BootRamdisk(ctx context.Context, r BootRequest) (BootResult, error)
	EndBoot(ctx context.Context, r EndBootRequest) error
	ResetBIOS(ctx context.Context, m MachineRef) (ResetBIOSResult, error)
	ConsoleLog(ctx context.Context, r ConsoleLogRequest) ([]byte, error)
	StageImage(ctx context.Context, r StageImageRequest) (StageImageResult, error)
	SetBootDevice(ctx context.Context, r BootDeviceRequest) (BootDeviceResult, error)
}

// RegisterAgent registers the site activities `bcd site` serves, under
// their persisted names. It takes no store, so the site agent links none.
func RegisterAgent(r worker.ActivityRegistry, a SiteActivities) {
	r.RegisterActivityWithOptions(a.VerifyBMC, activity.RegisterOptions{Name: ActivityVerifyBMC})
	r.RegisterActivityWithOptions(a.Power, activity.RegisterOptions{Name: ActivityPower})
	r.RegisterActivityWithOptions(a.InspectOOB, activity.RegisterOptions{Name: ActivityInspectOOB})
	r.RegisterActivityWithOptions(a.BootRamdisk, activity.RegisterOptions{Name: ActivityBootRamdisk})
	r.RegisterActivityWithOptions(a.EndBoot, activity.RegisterOptions{Name: ActivityEndBoot})
	r.RegisterActivityWithOptions(a.ResetBIOS, activity.RegisterOptions{Name: ActivityResetBIOS})
	r.RegisterActivityWithOptions(a.ConsoleLog, activity.RegisterOptions{Name: ActivityConsoleLog})
	r.RegisterActivityWithOptions(a.StageImage, activity.RegisterOptions{Name: ActivityStageImage})
	r.RegisterActivityWithOptions(a.SetBootDevice, activity.RegisterOptions{Name: ActivitySetBootDevice})
}

// The provisioning site activities (Bare metal II). `bcd site` serves them
// with the rest; they are named here so the workflow and the agent agree.
const (
	// ActivityStageImage fetches an image from the control plane into the
	// site's content-addressed cache (resuming with Range, checking its
	// SHA-256; a mismatch is ErrTypeDigestMismatch, not retried, and
	// nothing is kept) and serves it from the boot server to the node's
	// ramdisk boots (the bearer the boot server takes is the token of the
	// node's open boot), so it may run before the ramdisk boots.
	ActivityStageImage = "MetalStageImage"
	// ActivitySetBootDevice sets the boot device through the BMC, read
	// back.
	ActivitySetBootDevice = "MetalSetBootDevice"
)

// ErrTypeDigestMismatch: an image's bytes do not match its digest.
const ErrTypeDigestMismatch = "DigestMismatch"

// StageImageRequest is ActivityStageImage's input.
type StageImageRequest struct {
	Machine   MachineRef `json:"machine"`
	ImageID   string     `json:"imageId"`
	Format    string     `json:"format"`
	SHA256    string     `json:"sha256"`
	SizeBytes int64      `json:"sizeBytes"`
}

// StageImageResult is where the machine fetches the staged bytes and
// what they are: for a raw or iso image the image itself; for qcow2 the
// raw conversion the site made (its own digest and size).
type StageImageResult struct {
	URL       string `json:"url"`
	SHA256    string `json:"sha256"`
	SizeBytes int64  `json:"sizeBytes"`
	// Cached: the site had the bytes already.
	Cached bool `json:"cached"`
}

// BootDeviceRequest is ActivitySetBootDevice's input: device is disk, pxe
// or cd.
type BootDeviceRequest struct {
	Machine    MachineRef `json:"machine"`
	Device     string     `json:"device"`
	Persistent bool       `json:"persistent"`
}

// BootDeviceResult answers ActivitySetBootDevice: the device set (the
// driver returns only once a read shows it, where the BMC can be read) and
// the driver that served the call.
type BootDeviceResult struct {
	Device     string `json:"device"`
	Persistent bool   `json:"persistent"`
	Driver     string `json:"driver"`
}

// Package inventory holds the NodeInventory v1 document a node reports, its
// per-section hashes and diff, the node's hardware key, and the devices and
// atoms an inventory yields under a pool's partition policy.
package inventory

import (
	"bytes"
	"encoding/json"

	"github.com/better-compute/better-compute/core"
)

// Kind and Version identify a NodeInventory v1 document.
const (
	Kind    = "NodeInventory"
	Version = 1
)

// Section names, in document order. Each section is hashed on its own.
const (
	SectionSystem   = "system"
	SectionCPU      = "cpu"
	SectionMemory   = "memory"
	SectionDisks    = "disks"
	SectionNICs     = "nics"
	SectionGPUs     = "gpus"
	SectionFirmware = "firmware"
)

// Sections lists the section names in document order.
var Sections = []string{SectionSystem, SectionCPU, SectionMemory, SectionDisks, SectionNICs, SectionGPUs, SectionFirmware}

// NodeInventory is the NodeInventory v1 document. Timestamps are epoch
// milliseconds. Only the seven sections are hashed; kind, version,
// collectedAt and agentVersion describe the report, not the hardware.
type NodeInventory struct {
	Kind         string   `json:"kind"`
	Version      int      `json:"version"`
	CollectedAt  int64    `json:"collectedAt,omitempty"`
	AgentVersion string   `json:"agentVersion,omitempty"`
	System       System   `json:"system"`
	CPU          CPU      `json:"cpu"`
	Memory       Memory   `json:"memory"`
	Disks        []Disk   `json:"disks"`
	NICs         []NIC    `json:"nics"`
	GPUs         GPUs     `json:"gpus"`
	Firmware     Firmware `json:"firmware"`
}

// System is DMI system and board identity plus the running OS.
type System struct {
	Vendor       string `json:"vendor,omitempty"`       // DMI sys_vendor
	Product      string `json:"product,omitempty"`      // DMI product_name
	ProductUUID  string `json:"productUuid,omitempty"`  // DMI product_uuid
	SerialNumber string `json:"serialNumber,omitempty"` // DMI product_serial
	SKU          string `json:"sku,omitempty"`
	BoardVendor  string `json:"boardVendor,omitempty"`
	BoardProduct string `json:"boardProduct,omitempty"`
	BoardSerial  string `json:"boardSerial,omitempty"`
	ChassisType  string `json:"chassisType,omitempty"`
	Hostname     string `json:"hostname,omitempty"`
	OS           string `json:"os,omitempty"`
	Kernel       string `json:"kernel,omitempty"`
	Architecture string `json:"architecture,omitempty"`
}

// CPU is the processor summary.
type CPU struct {
	Vendor         string `json:"vendor,omitempty"`
	Model          string `json:"model,omitempty"`
	Sockets        int    `json:"sockets"`
	CoresPerSocket int    `json:"coresPerSocket"`
	ThreadsPerCore int    `json:"threadsPerCore"`
	LogicalCPUs    int    `json:"logicalCpus"`
	NUMANodes      int    `json:"numaNodes"`
	MaxMHz         int    `json:"maxMHz,omitempty"`
}

// Memory is system memory and its DIMMs.
type Memory struct {
	TotalBytes int64  `json:"totalBytes"`
	DIMMs      []DIMM `json:"dimms,omitempty"`
}

// DIMM is one populated memory module.
type DIMM struct {
	Locator      string `json:"locator"`
	SizeBytes    int64  `json:"sizeBytes"`
	Type         string `json:"type,omitempty"`
	SpeedMTs     int    `json:"speedMTs,omitempty"`
	Manufacturer string `json:"manufacturer,omitempty"`
	PartNumber   string `json:"partNumber,omitempty"`
	Serial       string `json:"serial,omitempty"`
}

// Disk is one block device. WWN (or the NVMe EUI/NGUID in WWN form) is its
// stable id.
type Disk struct {
	Name       string `json:"name"`
	Model      string `json:"model,omitempty"`
	Serial     string `json:"serial,omitempty"`
	WWN        string `json:"wwn,omitempty"`
	SizeBytes  int64  `json:"sizeBytes"`
	Transport  string `json:"transport,omitempty"` // nvme, sata, sas
	Rotational bool   `json:"rotational,omitempty"`
	// System marks the disk the OS boots from; it is never bookable.
	System bool `json:"system,omitempty"`
}

// NIC is one physical network interface and its SR-IOV virtual functions.
type NIC struct {
	Name         string `json:"name"`
	MAC          string `json:"mac,omitempty"`
	PermanentMAC string `json:"permanentMac,omitempty"`
	Driver       string `json:"driver,omitempty"`
	Model        string `json:"model,omitempty"`
	Firmware     string `json:"firmware,omitempty"`
	PCIAddress   string `json:"pciAddress,omitempty"`
	SpeedMbps    int    `json:"speedMbps,omitempty"`
	NUMANode     int    `json:"numaNode,omitempty"`
	// Virtual marks software interfaces (bridges, bonds, veth); they carry no
	// identity and are never devices.
	Virtual bool `json:"virtual,omitempty"`
	VFs     []VF `json:"vfs,omitempty"`
}

// VF is one SR-IOV virtual function; its MAC is its stable id.
type VF struct {
	Index      int    `json:"index"`
	MAC        string `json:"mac"`
	PCIAddress string `json:"pciAddress,omitempty"`
}

// GPUs is the accelerator section.
type GPUs struct {
	DriverVersion string     `json:"driverVersion,omitempty"`
	CUDAVersion   string     `json:"cudaVersion,omitempty"`
	ROCmVersion   string     `json:"rocmVersion,omitempty"`
	Devices       []GPU      `json:"devices"`
	NVSwitches    []NVSwitch `json:"nvswitches,omitempty"`
}

// GPU is one accelerator as NVML or AMD SMI reports it.
type GPU struct {
	Index      int    `json:"index"`
	UUID       string `json:"uuid"`
	Name       string `json:"name"` // NVML / AMD SMI name, normalized by core/gpu
	PCIBusID   string `json:"pciBusId,omitempty"`
	Serial     string `json:"serial,omitempty"`
	MemoryMiB  int64  `json:"memoryMiB"`
	VBIOS      string `json:"vbios,omitempty"`
	NUMANode   int    `json:"numaNode,omitempty"`
	PowerLimit int    `json:"powerLimitW,omitempty"`
	// MigMode is "enabled", "disabled" or empty when unsupported.
	MigMode      string        `json:"migMode,omitempty"`
	MigInstances []MigInstance `json:"migInstances,omitempty"`
	// NVLinkDomain names the set of GPUs joined by NVLink/NVSwitch (an HGX
	// baseboard's NVSwitch domain, or the fabric cluster UUID on GB200).
	NVLinkDomain string `json:"nvlinkDomain,omitempty"`
	NVLinkLinks  int    `json:"nvlinkLinks,omitempty"`
}

// MigInstance is one existing MIG compute instance.
type MigInstance struct {
	GI      int    `json:"gi"`
	CI      int    `json:"ci"`
	Profile string `json:"profile"`
	UUID    string `json:"uuid,omitempty"` // MIG-…
}

// NVSwitch is one NVSwitch of an HGX baseboard.
type NVSwitch struct {
	PCIBusID string `json:"pciBusId"`
	Name     string `json:"name,omitempty"`
	Domain   string `json:"domain,omitempty"`
}

// Firmware is BIOS and BMC firmware.
type Firmware struct {
	BIOSVendor   string `json:"biosVendor,omitempty"`
	BIOSVersion  string `json:"biosVersion,omitempty"`
	BIOSDate     string `json:"biosDate,omitempty"`
	BMCVendor    string `json:"bmcVendor,omitempty"`
	BMCVersion   string `json:"bmcVersion,omitempty"`
	CPUMicrocode string `json:"cpuMicrocode,omitempty"`
}

// Parse decodes and checks a NodeInventory v1 document. Unknown fields are
// rejected so that a newer agent's document is not silently truncated.
func Parse(data []byte) (*NodeInventory, error) {
	var inv NodeInventory
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&inv); err != nil {
		return nil, core.Wrap(core.CodeInvalidInput, err, "inventory: not a NodeInventory document")
	}
	if err := inv.Validate(); err != nil {
		return nil, err
	}
	return &inv, nil
}

// Validate checks the envelope and the fields devices are keyed by.
func (inv *NodeInventory) Validate() error {
	if inv.Kind != Kind || inv.Version != Version {
		return core.Errorf(core.CodeInvalidInput, "inventory: kind %q version %d, want %s v%d", inv.Kind, inv.Version, Kind, Version)
	}
	seen := map[string]bool{}
	for i, g := range inv.GPUs.Devices {
		if g.UUID == "" {
			return core.Errorf(core.CodeInvalidInput, "inventory: gpus.devices[%d] has no uuid", i)
		}
		if seen[g.UUID] {
			return core.Errorf(core.CodeInvalidInput, "inventory: GPU %s reported twice", g.UUID)
		}
		seen[g.UUID] = true
	}
	return nil
}

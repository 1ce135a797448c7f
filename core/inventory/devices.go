package inventory

import (
	"fmt"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/gpu"
)

// Device classes.
const (
	ClassGPU    = "gpu"
	ClassGPUMig = "gpu.mig"
	ClassSlot   = "gpu.slot"
	ClassNICVF  = "nic.vf"
	ClassDisk   = "disk"
	ClassNode   = "node"
)

// Sharing modes of a pool.
const (
	SharingExclusive = "exclusive"
	SharingMIG       = "mig"
	SharingTimeslice = "timeslice"
	SharingMPS       = "mps"
)

// Replica limits per GPU: MPS serves at most 48 clients per device.
const (
	MaxTimesliceReplicas = 64
	MaxMPSReplicas       = 48
)

// Condition types raised by Devices.
const (
	CondGpuModelUnknown   = "GpuModelUnknown"
	CondGpuCountMismatch  = "GpuCountMismatch"
	CondGpuModelMismatch  = "GpuModelMismatch"
	CondMigModeMismatch   = "MigModeMismatch"
	CondMigLayoutPending  = "MigLayoutPending"
	CondMigLayoutMismatch = "MigLayoutMismatch"
	CondMigLayoutInvalid  = "MigLayoutInvalid"
)

// Condition is a typed node condition derived from the inventory.
type Condition struct {
	Type    string `json:"type"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// Device is the device the condition is about, empty for the node.
	Device string `json:"device,omitempty"`
}

// HardwareProfile is what a pool's policy expects of its nodes.
type HardwareProfile struct {
	GPUCount int    `json:"gpuCount"`
	GPUModel string `json:"gpuModel,omitempty"`
}

// PartitionPolicy is the part of a pool's policy that turns GPUs into atoms.
type PartitionPolicy struct {
	// Sharing is exclusive (the default when empty), mig, timeslice or mps.
	Sharing string `json:"sharing,omitempty"`
	// MigLayout is applied to every GPU when Sharing is mig.
	MigLayout gpu.MigLayout `json:"migLayout,omitempty"`
	// Replicas is the number of slots per GPU for timeslice and mps.
	Replicas int `json:"replicas,omitempty"`
	// Profile, when set, is checked: GpuCountMismatch, GpuModelMismatch.
	Profile *HardwareProfile `json:"hardwareProfile,omitempty"`
	// Catalog maps GPU names; nil means the embedded gpu-models.json.
	Catalog *gpu.Catalog `json:"-"`
}

// Device is a unit with typed attributes in the style of Kubernetes dynamic
// resource allocation. Attribute values are string, int64 or bool.
type Device struct {
	ID         string         `json:"id"`
	Class      string         `json:"class"`
	Parent     string         `json:"parent,omitempty"`
	Bookable   bool           `json:"bookable"`
	Attributes map[string]any `json:"attributes"`
}

// DeviceSet is what an inventory yields under a partition policy.
type DeviceSet struct {
	Devices    []Device    `json:"devices"`
	Conditions []Condition `json:"conditions"`
}

// Atoms returns the bookable devices.
func (s *DeviceSet) Atoms() []Device {
	var out []Device
	for _, d := range s.Devices {
		if d.Bookable {
			out = append(out, d)
		}
	}
	return out
}

// Device returns a device by id.
func (s *DeviceSet) Device(id string) (Device, bool) {
	for _, d := range s.Devices {
		if d.ID == id {
			return d, true
		}
	}
	return Device{}, false
}

// HasCondition reports whether a condition of the type was raised.
func (s *DeviceSet) HasCondition(typ string) bool {
	return slices.ContainsFunc(s.Conditions, func(c Condition) bool { return c.Type == typ })
}

// Validate checks a partition policy on its own.
func (p PartitionPolicy) Validate() error {
	switch p.sharing() {
	case SharingExclusive:
	case SharingMIG:
		if len(p.MigLayout) == 0 {
			return core.Errorf(core.CodeInvalidInput, "sharing mig needs a migLayout")
		}
	case SharingTimeslice, SharingMPS:
		limit := MaxTimesliceReplicas
		if p.Sharing == SharingMPS {
			limit = MaxMPSReplicas
		}
		if p.Replicas < 1 || p.Replicas > limit {
			return core.Errorf(core.CodeInvalidInput, "sharing %s needs replicas from 1 to %d, got %d", p.Sharing, limit, p.Replicas)
		}
	default:
		return core.Errorf(core.CodeInvalidInput, "unknown sharing %q", p.Sharing)
	}
	return nil
}

func (p PartitionPolicy) sharing() string {
	if p.Sharing == "" {
		return SharingExclusive
	}
	return p.Sharing
}

// Devices turns an inventory into devices and atoms under a partition policy.
//
// The policy is the desired state and decides the atoms; where the node has
// not converged on it (MIG mode, MIG instances) a condition says so, and
// those conditions keep the node unschedulable (see BlocksScheduling).
// Device ids are stable: GPU UUID, <gpuUuid>/gi<g>/ci<c>, <gpuUuid>/s<k>, VF
// MAC, disk WWN; the list is sorted by id, so neither the run nor the order
// the agent enumerated hardware in changes it.
func Devices(inv *NodeInventory, p PartitionPolicy) (*DeviceSet, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	cat := p.Catalog
	if cat == nil {
		cat = gpu.Default()
	}
	set := &DeviceSet{Devices: []Device{}, Conditions: []Condition{}}
	cond := func(typ, reason, device, format string, args ...any) {
		set.Conditions = append(set.Conditions, Condition{Type: typ, Reason: reason, Message: fmt.Sprintf(format, args...), Device: device})
	}
	add := func(d Device) { set.Devices = append(set.Devices, d) }

	// The whole machine, booked by binding "node" reservations.
	add(Device{ID: nodeDeviceID(inv), Class: ClassNode, Bookable: true, Attributes: map[string]any{
		"vendor": inv.System.Vendor, "product": inv.System.Product,
		"gpuCount": int64(len(inv.GPUs.Devices)), "logicalCpus": int64(inv.CPU.LogicalCPUs),
		"memoryBytes": inv.Memory.TotalBytes,
	}})

	sharing := p.sharing()
	families := map[string]bool{}
	for _, g := range Canonical(inv).GPUs.Devices {
		info := cat.Normalize(g.Name)
		families[info.Model] = true
		id := strings.TrimSpace(g.UUID)
		mem := int64(info.MemoryGiB)
		if !info.Known {
			mem = g.MemoryMiB / 1024
			cond(CondGpuModelUnknown, "NotInCatalog", id, "GPU name %q is not in gpu-models.json v%d", g.Name, cat.Version)
		}
		base := map[string]any{
			"gpuModel": info.Model, "gpuProduct": info.Product, "vendor": info.Vendor,
			"memoryGiB": mem, "index": int64(g.Index),
		}
		if info.FormFactor != "" {
			base["formFactor"] = info.FormFactor
		}
		if g.PCIBusID != "" {
			base["pciBusId"] = strings.ToLower(g.PCIBusID)
		}
		if g.NVLinkDomain != "" {
			base["nvlinkDomain"] = g.NVLinkDomain
		}
		if g.NUMANode != 0 {
			base["numaNode"] = int64(g.NUMANode)
		}
		parent := Device{ID: id, Class: ClassGPU, Attributes: clone(base)}
		parent.Attributes["sharing"] = sharing
		parent.Attributes["migCapable"] = len(cat.MigProfiles(info.Product)) > 0
		migOn := g.MigMode == "enabled"
		if sharing != SharingMIG && migOn {
			cond(CondMigModeMismatch, "MigEnabled", id, "GPU %s has MIG enabled but the pool shares by %s", id, sharing)
		}

		switch sharing {
		case SharingExclusive:
			parent.Bookable = true
			add(parent)
		case SharingTimeslice, SharingMPS:
			add(parent)
			for k := range p.Replicas {
				a := clone(base)
				a["sharing"], a["slot"], a["replicas"] = sharing, int64(k), int64(p.Replicas)
				add(Device{ID: fmt.Sprintf("%s/s%d", id, k), Class: ClassSlot, Parent: id, Bookable: true, Attributes: a})
			}
		case SharingMIG:
			add(parent)
			profiles, err := cat.Expand(info.Product, p.MigLayout)
			if err != nil {
				cond(CondMigLayoutInvalid, "LayoutDoesNotFit", id, "migLayout %s on %s: %s", p.MigLayout, info.Product, core.AsError(err).Message)
				continue
			}
			if !migOn {
				cond(CondMigModeMismatch, "MigDisabled", id, "GPU %s does not have MIG enabled", id)
			}
			instances := plannedInstances(profiles)
			switch {
			case len(g.MigInstances) == 0:
				cond(CondMigLayoutPending, "NoInstances", id, "GPU %s reports no MIG instances yet; atoms use planned ids", id)
			case !sameProfiles(g.MigInstances, profiles):
				cond(CondMigLayoutMismatch, "InstancesDiffer", id, "GPU %s reports MIG instances %s, the pool wants %s", id, profileList(g.MigInstances), p.MigLayout)
			default:
				instances = reportedInstances(g.MigInstances)
			}
			for _, in := range instances {
				prof, _ := cat.MigProfile(info.Product, in.Profile)
				a := clone(base)
				a["sharing"], a["migProfile"] = sharing, in.Profile
				a["memoryGiB"], a["computeSlices"] = int64(prof.MemoryGiB), int64(prof.ComputeSlices)
				a["gi"], a["ci"] = int64(in.GI), int64(in.CI)
				if in.UUID != "" {
					a["migUuid"] = in.UUID
				}
				add(Device{ID: fmt.Sprintf("%s/gi%d/ci%d", id, in.GI, in.CI), Class: ClassGPUMig, Parent: id, Bookable: true, Attributes: a})
			}
		}
	}

	for _, nic := range inv.NICs {
		for _, vf := range nic.VFs {
			mac, why := NormalizeMAC(vf.MAC)
			if why == "malformed" || why == "empty" || mac == "00:00:00:00:00:00" {
				continue // a VF without an address has no stable id yet
			}
			a := map[string]any{"pf": nic.Name, "vfIndex": int64(vf.Index)}
			if vf.PCIAddress != "" {
				a["pciAddress"] = strings.ToLower(vf.PCIAddress)
			}
			if nic.SpeedMbps != 0 {
				a["speedMbps"] = int64(nic.SpeedMbps)
			}
			if nic.Model != "" {
				a["model"] = nic.Model
			}
			add(Device{ID: mac, Class: ClassNICVF, Bookable: true, Attributes: a})
		}
	}

	for _, d := range inv.Disks {
		id := diskID(d)
		if id == "" {
			continue
		}
		a := map[string]any{"name": d.Name, "sizeBytes": d.SizeBytes, "rotational": d.Rotational, "system": d.System}
		if d.Model != "" {
			a["model"] = d.Model
		}
		if d.Transport != "" {
			a["transport"] = d.Transport
		}
		add(Device{ID: id, Class: ClassDisk, Bookable: !d.System, Attributes: a})
	}

	if p.Profile != nil {
		if n := len(inv.GPUs.Devices); n != p.Profile.GPUCount {
			cond(CondGpuCountMismatch, "CountDiffers", "", "node has %d GPUs, the hardware profile expects %d", n, p.Profile.GPUCount)
		}
		if want := p.Profile.GPUModel; want != "" && len(inv.GPUs.Devices) > 0 && (len(families) != 1 || !families[want]) {
			got := make([]string, 0, len(families))
			for f := range families {
				got = append(got, f)
			}
			slices.Sort(got)
			cond(CondGpuModelMismatch, "ModelDiffers", "", "node has GPU models %s, the hardware profile expects %s", strings.Join(got, ","), want)
		}
	}

	slices.SortFunc(set.Devices, func(a, b Device) int { return strings.Compare(a.ID, b.ID) })
	slices.SortStableFunc(set.Conditions, func(a, b Condition) int {
		if c := strings.Compare(a.Type, b.Type); c != 0 {
			return c
		}
		return strings.Compare(a.Device, b.Device)
	})
	return set, nil
}

// BlocksScheduling reports whether a condition type keeps the node out of
// scheduling (it belongs in noScheduleReasons).
func BlocksScheduling(typ string) bool {
	switch typ {
	case CondGpuCountMismatch, CondGpuModelMismatch, CondMigModeMismatch, CondMigLayoutPending,
		CondMigLayoutMismatch, CondMigLayoutInvalid:
		return true
	}
	return false
}

// nodeDeviceID is node/<product UUID> when the product UUID is real, else
// node/<hardware key>.
func nodeDeviceID(inv *NodeInventory) string {
	if u, why := NormalizeUUID(inv.System.ProductUUID); why == "" {
		return "node/" + u[0:8] + "-" + u[8:12] + "-" + u[12:16] + "-" + u[16:20] + "-" + u[20:]
	}
	return "node/" + ComputeHardwareKey(inv).Key
}

// diskID is the disk's WWN (lower case, as in /dev/disk/by-id/wwn-…), else
// disk/<model>/<serial>; "" when neither is known.
func diskID(d Disk) string {
	if w := strings.ToLower(strings.TrimSpace(d.WWN)); w != "" {
		return w
	}
	if s, why := NormalizeSerial(d.Serial); why == "" {
		return "disk/" + strings.ReplaceAll(strings.TrimSpace(d.Model), " ", "_") + "/" + s
	}
	return ""
}

// plannedInstances gives layout instances ids before the driver creates
// them: GI by position in canonical layout order, CI 0.
func plannedInstances(profiles []gpu.MigProfile) []MigInstance {
	out := make([]MigInstance, len(profiles))
	for i, p := range profiles {
		out[i] = MigInstance{GI: i, CI: 0, Profile: p.Name}
	}
	return out
}

func reportedInstances(in []MigInstance) []MigInstance {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b MigInstance) int {
		if a.GI != b.GI {
			return a.GI - b.GI
		}
		return a.CI - b.CI
	})
	return out
}

func sameProfiles(in []MigInstance, want []gpu.MigProfile) bool {
	if len(in) != len(want) {
		return false
	}
	got := make([]string, len(in))
	for i, x := range in {
		got[i] = x.Profile
	}
	exp := make([]string, len(want))
	for i, x := range want {
		exp[i] = x.Name
	}
	slices.Sort(got)
	slices.Sort(exp)
	return slices.Equal(got, exp)
}

func profileList(in []MigInstance) string {
	l := gpu.MigLayout{}
	for _, x := range in {
		l[x.Profile]++
	}
	return l.String()
}

func clone(m map[string]any) map[string]any {
	out := make(map[string]any, len(m)+8)
	for k, v := range m {
		out[k] = v
	}
	return out
}

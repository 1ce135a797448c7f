//go:build linux && cgo

package inventory

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/core/inventory"
)

// NVML reads GPUs through libnvidia-ml.so.1, loaded at run time: a machine
// without the NVIDIA driver has no GPUs, which is not an error.
type NVML struct {
	// LibraryPath overrides the library to load; "" means libnvidia-ml.so.1.
	LibraryPath string
}

// migProfileName takes the profile off a MIG device name
// ("NVIDIA H100 80GB HBM3 MIG 3g.40gb").
var migProfileName = regexp.MustCompile(`MIG\s+(\S+)\s*$`)

// GPUs enumerates the GPUs. A GPU whose handle or UUID cannot be read
// (fallen off the bus) is left out, so the pool's GpuCountMismatch shows it
// rather than the whole inventory failing.
func (n NVML) GPUs(ctx context.Context) (inventory.GPUs, error) {
	var opts []nvml.LibraryOption
	if n.LibraryPath != "" {
		opts = append(opts, nvml.WithLibraryPath(n.LibraryPath))
	}
	lib := nvml.New(opts...)
	empty := inventory.GPUs{Devices: []inventory.GPU{}}
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		return empty, nil
	default:
		return empty, fmt.Errorf("nvml: init: %w", ret)
	}
	defer lib.Shutdown()
	// Symbols newer than the installed driver must not be called: go-nvml
	// binds them lazily and a missing one crashes.
	has := func(sym string) bool { return lib.Extensions().LookupSymbol(sym) == nil }

	out := empty
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		out.DriverVersion = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS && v > 0 {
		out.CUDAVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return empty, fmt.Errorf("nvml: device count: %w", ret)
	}
	for i := range count {
		if err := ctx.Err(); err != nil {
			return empty, fmt.Errorf("nvml: %w", err)
		}
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		g, ok := nvmlDevice(dev, i, has)
		if ok {
			out.Devices = append(out.Devices, g)
		}
	}
	return out, nil
}

func nvmlDevice(dev nvml.Device, index int, has func(string) bool) (inventory.GPU, bool) {
	g := inventory.GPU{Index: index}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS || uuid == "" {
		return g, false
	}
	g.UUID = uuid
	g.Name, _ = dev.GetName()
	if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
		g.PCIBusID = int8String(pci.BusId[:])
	}
	if s, ret := dev.GetSerial(); ret == nvml.SUCCESS {
		g.Serial = s
	}
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		g.MemoryMiB = int64(mem.Total >> 20)
	}
	if v, ret := dev.GetVbiosVersion(); ret == nvml.SUCCESS {
		g.VBIOS = v
	}
	if has("nvmlDeviceGetNumaNodeId") {
		if node, ret := dev.GetNumaNodeId(); ret == nvml.SUCCESS && node > 0 {
			g.NUMANode = node
		}
	}
	if g.NUMANode == 0 && g.PCIBusID != "" {
		if node, ok := readInt("/sys/bus/pci/devices/" + sysfsPCIAddress(g.PCIBusID) + "/numa_node"); ok && node > 0 {
			g.NUMANode = int(node)
		}
	}
	if mw, ret := dev.GetPowerManagementLimit(); ret == nvml.SUCCESS {
		g.PowerLimit = int(mw / 1000)
	}

	// MIG: the pending mode (after a GPU reset) has no field in the
	// document; the current mode decides which instances exist.
	if cur, _, ret := dev.GetMigMode(); ret == nvml.SUCCESS {
		g.MigMode = "disabled"
		if cur == nvml.DEVICE_MIG_ENABLE {
			g.MigMode = "enabled"
			g.MigInstances = migInstances(dev)
		}
	}

	for link := range nvml.NVLINK_MAX_LINKS {
		state, ret := dev.GetNvLinkState(link)
		if ret != nvml.SUCCESS {
			if errors.Is(ret, nvml.ERROR_NOT_SUPPORTED) || errors.Is(ret, nvml.ERROR_INVALID_ARGUMENT) {
				break
			}
			continue
		}
		if state == nvml.FEATURE_ENABLED {
			g.NVLinkLinks++
		}
	}
	// On NVLink fabrics (GB200 NVL72, HGX with a fabric manager that
	// assigns clusters) the cluster UUID and clique name the domain.
	if has("nvmlDeviceGetGpuFabricInfo") {
		if fi, ret := dev.GetGpuFabricInfo(); ret == nvml.SUCCESS && fi.State == nvml.GPU_FABRIC_STATE_COMPLETED {
			if u := clusterUUID(fi.ClusterUuid); u != "" {
				g.NVLinkDomain = u + "/" + strconv.FormatUint(uint64(fi.CliqueId), 10)
			}
		}
	}
	return g, true
}

func migInstances(dev nvml.Device) []inventory.MigInstance {
	max, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil
	}
	var out []inventory.MigInstance
	for j := range max {
		mig, ret := dev.GetMigDeviceHandleByIndex(j)
		if ret != nvml.SUCCESS {
			continue // empty slot
		}
		gi, r1 := mig.GetGpuInstanceId()
		ci, r2 := mig.GetComputeInstanceId()
		if r1 != nvml.SUCCESS || r2 != nvml.SUCCESS {
			continue
		}
		in := inventory.MigInstance{GI: gi, CI: ci}
		if u, ret := mig.GetUUID(); ret == nvml.SUCCESS {
			in.UUID = u
		}
		if name, ret := mig.GetName(); ret == nvml.SUCCESS {
			if m := migProfileName.FindStringSubmatch(name); m != nil {
				in.Profile = m[1]
			}
		}
		if in.Profile == "" {
			if a, ret := mig.GetAttributes(); ret == nvml.SUCCESS {
				in.Profile = fmt.Sprintf("%dg.%dgb", a.GpuInstanceSliceCount, (a.MemorySizeMB+512)/1024)
			}
		}
		out = append(out, in)
	}
	return out
}

func clusterUUID(b [16]uint8) string {
	zero := true
	for _, x := range b {
		if x != 0 {
			zero = false
		}
	}
	if zero {
		return ""
	}
	h := fmt.Sprintf("%x", b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func int8String(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// sysfsPCIAddress turns NVML's 00000000:18:00.0 into sysfs's 0000:18:00.0.
func sysfsPCIAddress(busID string) string {
	dom, rest, ok := strings.Cut(strings.ToLower(busID), ":")
	if !ok {
		return busID
	}
	if len(dom) > 4 {
		dom = dom[len(dom)-4:]
	}
	return dom + ":" + rest
}

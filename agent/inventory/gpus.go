package inventory

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/core/gpu"
	"github.com/better-compute/better-compute/core/inventory"
)

// GPUSource yields the gpus section: devices plus driver and CUDA versions.
// Names are reported raw (as NVML gives them); core/gpu normalizes them into
// gpuProduct and gpuModel when the inventory becomes devices.
type GPUSource interface {
	GPUs(ctx context.Context) (inventory.GPUs, error)
}

// ErrNVMLUnavailable is what NVML returns in builds without cgo or for
// another OS, where go-nvml cannot be linked.
var ErrNVMLUnavailable = errors.New("nvml: bcd was built without cgo (CGO_ENABLED=0) or for a non-Linux OS; rebuild with cgo or simulate GPUs")

// MaxSimulatedGPUs bounds a simulation spec; no single node carries more.
const MaxSimulatedGPUs = 16

// Simulated fakes Count GPUs of one gpu-models.json product. UUIDs derive
// from Seed (the hostname by default) and the index, so two simulated
// nodes never share a GPU UUID or a hardware key, and a restart keeps them.
type Simulated struct {
	Count   int
	Product string // gpuProduct, e.g. H100-SXM5-80GB
	Seed    string
	// Catalog resolves Product; nil means the embedded gpu-models.json.
	Catalog *gpu.Catalog
}

var simSpec = regexp.MustCompile(`^(\d+)[xX](.+)$`)

// ParseSimulated parses "<count>x<product>", e.g. "8xH100-SXM5-80GB". The
// product may be a gpuProduct key, a gpuModel family (its first product)
// or a name the catalog normalizes ("8xH100 80GB HBM3").
func ParseSimulated(spec, seed string) (*Simulated, error) {
	m := simSpec.FindStringSubmatch(strings.TrimSpace(spec))
	if m == nil {
		return nil, fmt.Errorf("inventory: simulated GPUs %q: want <count>x<product>, e.g. 8xH100-SXM5-80GB", spec)
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n < 1 || n > MaxSimulatedGPUs {
		return nil, fmt.Errorf("inventory: simulated GPUs %q: count must be 1 to %d", spec, MaxSimulatedGPUs)
	}
	cat := gpu.Default()
	product, err := resolveProduct(cat, m[2])
	if err != nil {
		return nil, fmt.Errorf("inventory: simulated GPUs %q: %w", spec, err)
	}
	return &Simulated{Count: n, Product: product, Seed: seed, Catalog: cat}, nil
}

func resolveProduct(cat *gpu.Catalog, key string) (string, error) {
	key = strings.TrimSpace(key)
	for _, m := range cat.Models {
		for _, p := range m.Products {
			if strings.EqualFold(p.Product, key) {
				return p.Product, nil
			}
		}
	}
	for _, m := range cat.Models {
		if strings.EqualFold(m.Family, key) {
			return m.Products[0].Product, nil
		}
	}
	if info := cat.Normalize(key); info.Known {
		return info.Product, nil
	}
	return "", fmt.Errorf("unknown GPU product %q (see core/gpu/gpu-models.json)", key)
}

// GPUs returns the simulated section.
func (s *Simulated) GPUs(context.Context) (inventory.GPUs, error) {
	cat := s.Catalog
	if cat == nil {
		cat = gpu.Default()
	}
	p, ok := cat.Product(s.Product)
	if !ok {
		return inventory.GPUs{}, fmt.Errorf("inventory: simulated GPU product %q is not in gpu-models.json", s.Product)
	}
	name := nvmlName(cat, p)
	migMode := ""
	if len(cat.MigProfiles(p.Product)) > 0 {
		migMode = "disabled"
	}
	// Baseboard form factors are NVLink/NVSwitch-connected; PCIe cards are
	// not.
	domain := ""
	switch p.FormFactor {
	case "SXM4", "SXM5", "SXM6", "OAM", "Superchip":
		if s.Count > 1 {
			domain = "sim-" + derive("nvlink", s.Seed)[:12]
		}
	}
	out := inventory.GPUs{Devices: make([]inventory.GPU, 0, s.Count)}
	for i := range s.Count {
		g := inventory.GPU{
			Index:        i,
			UUID:         "GPU-" + derivedUUID(derive("gpu", s.Seed, s.Product, strconv.Itoa(i))),
			Name:         name,
			PCIBusID:     fmt.Sprintf("00000000:%02X:00.0", 0x18+i*8),
			MemoryMiB:    int64(p.MemoryGiB) * 1024,
			MigMode:      migMode,
			NVLinkDomain: domain,
		}
		if s.Count > 1 {
			g.NUMANode = i * 2 / s.Count // two sockets, half the GPUs each
		}
		out.Devices = append(out.Devices, g)
	}
	return out, nil
}

// nvmlName is a name NVML would report for a product, checked to normalize
// back to it: the real NVML name where known, else one built from the key.
func nvmlName(cat *gpu.Catalog, p *gpu.Product) string {
	prefix := "NVIDIA "
	if p.Vendor == "amd" {
		prefix = "AMD Instinct "
	}
	parts := strings.Split(p.Product, "-")
	candidates := []string{
		realNVMLName(p.Product),
		prefix + p.Product,
		prefix + strings.Join(parts, " "),
		prefix + parts[0] + " " + parts[len(parts)-1],
		prefix + parts[0],
	}
	for _, c := range candidates {
		if info := cat.Normalize(c); c != "" && info.Known && info.Product == p.Product {
			return c
		}
	}
	return prefix + p.Product
}

// realNVMLName is what nvidia-smi shows for common data-centre products.
func realNVMLName(product string) string {
	switch product {
	case "H100-SXM5-80GB":
		return "NVIDIA H100 80GB HBM3"
	case "H100-PCIE-80GB":
		return "NVIDIA H100 PCIe"
	case "H100-NVL-94GB":
		return "NVIDIA H100 NVL"
	case "H200-SXM5-141GB":
		return "NVIDIA H200"
	case "A100-SXM4-80GB":
		return "NVIDIA A100-SXM4-80GB"
	case "A100-SXM4-40GB":
		return "NVIDIA A100-SXM4-40GB"
	case "A100-PCIE-40GB":
		return "NVIDIA A100-PCIE-40GB"
	case "A100-PCIE-80GB":
		return "NVIDIA A100 80GB PCIe"
	case "L40S-PCIE-48GB":
		return "NVIDIA L40S"
	case "L4-PCIE-24GB":
		return "NVIDIA L4"
	case "T4-PCIE-16GB":
		return "Tesla T4"
	case "B200-SXM6-180GB":
		return "NVIDIA B200"
	case "GH200-96GB":
		return "NVIDIA GH200 480GB"
	}
	return ""
}

func derive(parts ...string) string {
	sum := sha256.Sum256([]byte("bcd-simulated/" + strings.Join(parts, "/")))
	return hex.EncodeToString(sum[:])
}

// derivedUUID shapes 32 hex digits as a version-4 UUID.
func derivedUUID(h string) string {
	return h[0:8] + "-" + h[8:12] + "-4" + h[13:16] + "-8" + h[17:20] + "-" + h[20:32]
}

// collectNVSwitches finds HGX NVSwitches: NVIDIA PCI functions of class
// "bridge, other" (0x0680), which NVML does not enumerate.
func collectNVSwitches(o Options) []inventory.NVSwitch {
	dir := o.path("sys/bus/pci/devices")
	var out []inventory.NVSwitch
	for _, addr := range listDir(dir) {
		if readString(filepath.Join(dir, addr, "vendor")) != "0x10de" ||
			!strings.HasPrefix(readString(filepath.Join(dir, addr, "class")), "0x0680") {
			continue
		}
		out = append(out, inventory.NVSwitch{PCIBusID: nvmlBusID(addr), Name: "NVIDIA NVSwitch"})
	}
	slices.SortFunc(out, func(a, b inventory.NVSwitch) int { return strings.Compare(a.PCIBusID, b.PCIBusID) })
	return out
}

// nvmlBusID writes a sysfs PCI address (0000:05:00.0) the way NVML does
// (00000000:05:00.0).
func nvmlBusID(addr string) string {
	dom, rest, ok := strings.Cut(strings.ToUpper(addr), ":")
	if !ok {
		return addr
	}
	if len(dom) < 8 {
		dom = strings.Repeat("0", 8-len(dom)) + dom
	}
	return dom + ":" + rest
}

// nvlinkDomains names the NVSwitch domain of an HGX baseboard after the
// system's identity, and puts NVLink-connected GPUs the source left without
// a domain (no fabric cluster UUID) in it.
func nvlinkDomains(g *inventory.GPUs, sys inventory.System) {
	if len(g.NVSwitches) == 0 {
		return
	}
	id := ""
	if s, why := inventory.NormalizeSerial(sys.SerialNumber); why == "" {
		id = s
	} else if u, why := inventory.NormalizeUUID(sys.ProductUUID); why == "" {
		id = u
	} else {
		id = sys.Hostname
	}
	domain := "hgx-" + id
	for i := range g.NVSwitches {
		g.NVSwitches[i].Domain = domain
	}
	for i := range g.Devices {
		if g.Devices[i].NVLinkDomain == "" && g.Devices[i].NVLinkLinks > 0 {
			g.Devices[i].NVLinkDomain = domain
		}
	}
}

package inventory

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core/gpu"
	"github.com/better-compute/better-compute/core/inventory"
)

var fixedNow = func() time.Time { return time.UnixMilli(1767225600000) }

// twoSocket is what the testdata/two-socket tree must yield: a 2-socket
// server with 2 NVMe disks (root on nvme0n1p2), 2 physical NICs (one with
// SR-IOV VFs), lo, docker0, a VF netdev, and loop/dm/zram devices that are
// skipped.
func twoSocket() *inventory.NodeInventory {
	return &inventory.NodeInventory{
		Kind: inventory.Kind, Version: inventory.Version,
		CollectedAt: 1767225600000, AgentVersion: "bcd/test",
		System: inventory.System{
			Vendor: "Supermicro", Product: "SYS-221H-TNR",
			ProductUUID: "4c4c4544-0042-3510-8052-b4c04f4e3232", SerialNumber: "S123456X9A01234",
			SKU: "To Be Filled By O.E.M.", BoardVendor: "Supermicro", BoardProduct: "X13DEM",
			BoardSerial: "OM123S000001", ChassisType: "Rack Mount Chassis", Hostname: "gpu-test-01",
			OS: "Ubuntu 24.04.1 LTS", Kernel: "6.8.0-45-generic", Architecture: "x86_64",
		},
		CPU: inventory.CPU{
			Vendor: "GenuineIntel", Model: "Intel(R) Xeon(R) Gold 6430",
			Sockets: 2, CoresPerSocket: 4, ThreadsPerCore: 2, LogicalCPUs: 16, NUMANodes: 2, MaxMHz: 3400,
		},
		Memory: inventory.Memory{TotalBytes: 527958016 * 1024},
		Disks: []inventory.Disk{
			{Name: "nvme0n1", Model: "SAMSUNG MZQL2960HCJR-00A07", Serial: "S64FNE0T901234",
				WWN: "eui.36344630549012340025384500000001", SizeBytes: 1875385008 * 512, Transport: "nvme", System: true},
			{Name: "nvme1n1", Model: "SAMSUNG MZQL27T6HBLA-00A07", Serial: "S6CKNE0W700001",
				WWN: "eui.36434630547010010025384500000001", SizeBytes: 15002931888 * 512, Transport: "nvme"},
		},
		NICs: []inventory.NIC{
			{Name: "eno1", MAC: "7c:c2:55:4e:01:a2", PermanentMAC: "7c:c2:55:4e:01:a2", Driver: "ice",
				PCIAddress: "0000:17:00.0", SpeedMbps: 25000, VFs: []inventory.VF{
					{Index: 0, MAC: "7c:c2:55:4e:f0:00", PCIAddress: "0000:17:01.0"},
					{Index: 1, PCIAddress: "0000:17:01.1"},
				}},
			{Name: "eno2", MAC: "7c:c2:55:4e:01:a3", PermanentMAC: "7c:c2:55:4e:01:a3", Driver: "ice",
				PCIAddress: "0000:17:00.1", NUMANode: 1},
		},
		GPUs: inventory.GPUs{Devices: []inventory.GPU{}},
		Firmware: inventory.Firmware{
			BIOSVendor: "American Megatrends International, LLC.", BIOSVersion: "2.1", BIOSDate: "03/15/2024",
			CPUMicrocode: "0x2b0004d0",
		},
	}
}

func fixture(name string) Options {
	return Options{Root: filepath.Join("testdata", name), AgentVersion: "bcd/test", Now: fixedNow}
}

func TestCollectFixture(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		opts  func(Options) Options
		check func(t *testing.T, inv *inventory.NodeInventory)
	}{
		{
			name: "no GPUs",
			opts: func(o Options) Options { o.GPUs = Static{}; return o },
			check: func(t *testing.T, inv *inventory.NodeInventory) {
				if want := twoSocket(); !reflect.DeepEqual(inv, want) {
					t.Errorf("Collect:\n got %+v\nwant %+v", inv, want)
				}
				hk := inventory.ComputeHardwareKey(inv)
				if !hk.Trusted || !reflect.DeepEqual(hk.Identifiers, []string{inventory.IdentProductUUID, inventory.IdentSerial, inventory.IdentMAC}) {
					t.Errorf("hardware key = %+v, want trusted from productUuid, serialNumber, mac", hk)
				}
			},
		},
		{
			name: "simulated 8xH100",
			opts: func(o Options) Options { o.SimulateGPUs = "8xH100-SXM5-80GB"; return o },
			check: func(t *testing.T, inv *inventory.NodeInventory) {
				if n := len(inv.GPUs.Devices); n != 8 {
					t.Fatalf("%d GPUs, want 8", n)
				}
				set, err := inventory.Devices(inv, inventory.PartitionPolicy{Profile: &inventory.HardwareProfile{GPUCount: 8, GPUModel: "H100"}})
				if err != nil {
					t.Fatal(err)
				}
				if len(set.Conditions) != 0 {
					t.Errorf("conditions %+v, want none", set.Conditions)
				}
				gpus := 0
				for _, d := range set.Atoms() {
					if d.Class == inventory.ClassGPU {
						gpus++
						if d.Attributes["gpuModel"] != "H100" || d.Attributes["gpuProduct"] != "H100-SXM5-80GB" {
							t.Errorf("GPU atom %s attributes %v", d.ID, d.Attributes)
						}
					}
				}
				if gpus != 8 {
					t.Errorf("%d GPU atoms, want 8", gpus)
				}
				if _, ok := set.Device("7c:c2:55:4e:f0:00"); !ok {
					t.Error("VF with a MAC is not a nic.vf device")
				}
				hk := inventory.ComputeHardwareKey(inv)
				if len(hk.Identifiers) != 4 || len(hk.Rejected) != 0 {
					t.Errorf("hardware key = %+v, want 4 identifiers and no rejections", hk)
				}
				// The seed defaults to the fixture's hostname.
				want, _ := ParseSimulated("8xH100-SXM5-80GB", "gpu-test-01")
				section, _ := want.GPUs(ctx)
				if !reflect.DeepEqual(inv.GPUs, section) {
					t.Errorf("GPUs not seeded by hostname:\n got %+v\nwant %+v", inv.GPUs, section)
				}
			},
		},
		{
			name: "explicit source wins over simulation",
			opts: func(o Options) Options {
				o.SimulateGPUs = "8xH100"
				o.GPUs = Static{Section: inventory.GPUs{DriverVersion: "550.90.07", Devices: []inventory.GPU{
					{UUID: "GPU-5e9a1b2c-7d3f-4a8e-9b1c-2d3e4f5a6b70", Name: "NVIDIA L4", MemoryMiB: 23034},
				}}}
				return o
			},
			check: func(t *testing.T, inv *inventory.NodeInventory) {
				if len(inv.GPUs.Devices) != 1 || inv.GPUs.DriverVersion != "550.90.07" {
					t.Errorf("GPUs = %+v, want the static one", inv.GPUs)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv, err := Collect(ctx, tt.opts(fixture("two-socket")))
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, inv)
			if _, err := inventory.Hash(inv); err != nil {
				t.Errorf("Hash: %v", err)
			}
		})
	}
}

func TestCollectErrors(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		opts Options
		want string
	}{
		{"canceled", canceled, Options{Root: "testdata/two-socket", GPUs: Static{}}, "context canceled"},
		{"bad simulation", context.Background(), Options{Root: "testdata/two-socket", SimulateGPUs: "8xNOPE"}, "unknown GPU product"},
		{"duplicate GPU UUID", context.Background(), Options{Root: "testdata/two-socket", GPUs: Static{Section: inventory.GPUs{Devices: []inventory.GPU{
			{UUID: "GPU-5e9a1b2c-7d3f-4a8e-9b1c-2d3e4f5a6b70"}, {UUID: "GPU-5e9a1b2c-7d3f-4a8e-9b1c-2d3e4f5a6b70"},
		}}}}, "reported twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Collect(tt.ctx, tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Collect error = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestCollectEmptyRoot(t *testing.T) {
	// A tree with nothing readable (no /sys, non-root DMI) is not an error.
	inv, err := Collect(context.Background(), Options{Root: t.TempDir(), GPUs: Static{}})
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Disks) != 0 || len(inv.NICs) != 0 || inv.CPU.LogicalCPUs != 0 || inv.System.ProductUUID != "" {
		t.Errorf("empty tree yielded %+v", inv)
	}
}

func TestPrint(t *testing.T) {
	var buf bytes.Buffer
	o := fixture("two-socket")
	o.GPUs = Static{}
	if err := Print(context.Background(), &buf, o); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "\n  \"kind\": \"NodeInventory\",") {
		t.Errorf("not indented JSON:\n%s", buf.String())
	}
	inv, err := inventory.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(inv, twoSocket()) {
		t.Errorf("Print round trip:\n got %+v\nwant %+v", inv, twoSocket())
	}
}

func TestNVSwitchDomain(t *testing.T) {
	root := t.TempDir()
	write := func(path, content string) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// PCI addresses contain ':', which module zips do not allow, so this
	// tree is built here rather than kept in testdata.
	write("sys/class/dmi/id/product_serial", "S462390X3A17104")
	for _, addr := range []string{"0000:06:00.0", "0000:05:00.0"} {
		write("sys/bus/pci/devices/"+addr+"/vendor", "0x10de")
		write("sys/bus/pci/devices/"+addr+"/class", "0x068000")
	}
	write("sys/bus/pci/devices/0000:18:00.0/vendor", "0x10de") // the GPU itself
	write("sys/bus/pci/devices/0000:18:00.0/class", "0x030200")
	write("sys/bus/pci/devices/0000:17:00.0/vendor", "0x8086")
	write("sys/bus/pci/devices/0000:17:00.0/class", "0x068000")

	src := Static{Section: inventory.GPUs{Devices: []inventory.GPU{
		{Index: 0, UUID: "GPU-5e9a1b2c-7d3f-4a8e-9b1c-2d3e4f5a6b70", Name: "NVIDIA H100 80GB HBM3", NVLinkLinks: 18},
		{Index: 1, UUID: "GPU-8c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e51", Name: "NVIDIA H100 80GB HBM3"},
		{Index: 2, UUID: "GPU-1f2e3d4c-5b6a-7988-a7b6-c5d4e3f2a192", Name: "NVIDIA H100 80GB HBM3", NVLinkLinks: 18, NVLinkDomain: "fabric"},
	}}}
	inv, err := Collect(context.Background(), Options{Root: root, GPUs: src})
	if err != nil {
		t.Fatal(err)
	}
	const domain = "hgx-S462390X3A17104"
	wantSwitches := []inventory.NVSwitch{
		{PCIBusID: "00000000:05:00.0", Name: "NVIDIA NVSwitch", Domain: domain},
		{PCIBusID: "00000000:06:00.0", Name: "NVIDIA NVSwitch", Domain: domain},
	}
	if !reflect.DeepEqual(inv.GPUs.NVSwitches, wantSwitches) {
		t.Errorf("NVSwitches = %+v, want %+v", inv.GPUs.NVSwitches, wantSwitches)
	}
	for i, want := range []string{domain, "", "fabric"} {
		if got := inv.GPUs.Devices[i].NVLinkDomain; got != want {
			t.Errorf("GPU %d nvlinkDomain = %q, want %q", i, got, want)
		}
	}
}

func TestSimulated(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		spec, product, model string
		count                int
		wantErr              string
	}{
		{spec: "8xH100-SXM5-80GB", product: "H100-SXM5-80GB", model: "H100", count: 8},
		{spec: "4xa100-pcie-40gb", product: "A100-PCIE-40GB", model: "A100", count: 4},
		{spec: "2xH200", product: "H200-SXM5-141GB", model: "H200", count: 2},
		{spec: "1xNVIDIA L40S", product: "L40S-PCIE-48GB", model: "L40S", count: 1},
		{spec: "8xMI300X", product: "MI300X-OAM-192GB", model: "MI300X", count: 8},
		{spec: "H100", wantErr: "want <count>x<product>"},
		{spec: "0xH100", wantErr: "count must be"},
		{spec: "17xH100", wantErr: "count must be"},
		{spec: "8xRTX9090", wantErr: "unknown GPU product"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			s, err := ParseSimulated(tt.spec, "node-a")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			section, err := s.GPUs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(section.Devices) != tt.count {
				t.Fatalf("%d GPUs, want %d", len(section.Devices), tt.count)
			}
			seen := map[string]bool{}
			for i, g := range section.Devices {
				info := gpu.Normalize(g.Name)
				if info.Product != tt.product || info.Model != tt.model {
					t.Errorf("GPU %d name %q normalizes to %s/%s, want %s/%s", i, g.Name, info.Product, info.Model, tt.product, tt.model)
				}
				if _, why := inventory.NormalizeGPUUUID(g.UUID); why != "" || !strings.HasPrefix(g.UUID, "GPU-") {
					t.Errorf("GPU %d UUID %q rejected: %s", i, g.UUID, why)
				}
				if seen[g.UUID] || seen[g.PCIBusID] {
					t.Errorf("GPU %d repeats UUID %s or bus id %s", i, g.UUID, g.PCIBusID)
				}
				seen[g.UUID], seen[g.PCIBusID] = true, true
				if g.Index != i || g.MemoryMiB != int64(info.MemoryGiB)*1024 {
					t.Errorf("GPU %d = %+v", i, g)
				}
			}
			again, _ := ParseSimulated(tt.spec, "node-a")
			same, _ := again.GPUs(ctx)
			other, _ := ParseSimulated(tt.spec, "node-b")
			diff, _ := other.GPUs(ctx)
			if !reflect.DeepEqual(section, same) {
				t.Error("same seed gave different GPUs")
			}
			if diff.Devices[0].UUID == section.Devices[0].UUID {
				t.Error("different seeds gave the same GPU UUID")
			}
		})
	}
}

func TestSimulatedNamesNormalize(t *testing.T) {
	// Every catalog product must round-trip: simulated name → same product.
	cat := gpu.Default()
	for _, m := range cat.Models {
		for _, p := range m.Products {
			s := &Simulated{Count: 1, Product: p.Product, Seed: "x"}
			section, err := s.GPUs(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := cat.Normalize(section.Devices[0].Name); got.Product != p.Product || !got.Known {
				t.Errorf("%s: simulated name %q normalizes to %s", p.Product, section.Devices[0].Name, got.Product)
			}
		}
	}
}

// TestCollectHost runs on whatever machine runs the tests and asserts only
// what holds anywhere.
func TestCollectHost(t *testing.T) {
	inv, err := Collect(context.Background(), Options{})
	if errors.Is(err, ErrNVMLUnavailable) {
		t.Log("built without cgo: collecting without NVML")
		inv, err = Collect(context.Background(), Options{GPUs: Static{}})
	}
	if err != nil {
		t.Fatal(err)
	}
	if inv.CPU.LogicalCPUs < 1 || inv.CPU.Sockets < 1 || inv.CPU.CoresPerSocket < 1 || inv.CPU.ThreadsPerCore < 1 {
		t.Errorf("CPU = %+v", inv.CPU)
	}
	if inv.Memory.TotalBytes <= 0 {
		t.Errorf("memory = %d", inv.Memory.TotalBytes)
	}
	if _, err := os.Stat("/dev/nvidiactl"); err != nil && len(inv.GPUs.Devices) != 0 {
		t.Errorf("no NVIDIA driver but %d GPUs", len(inv.GPUs.Devices))
	}
	for _, n := range inv.NICs {
		if n.Name == "lo" || n.Virtual {
			t.Errorf("NIC %s should have been skipped", n.Name)
		}
	}
	for _, d := range inv.Disks {
		if skipDisk.MatchString(d.Name) {
			t.Errorf("disk %s should have been skipped", d.Name)
		}
	}
	// A host whose every identifier is rejected (a VM with a locally
	// administered MAC and no readable DMI) has no key at all.
	hk := inventory.ComputeHardwareKey(inv)
	if (len(hk.Identifiers) > 0) != (len(hk.Key) == 64) {
		t.Errorf("hardware key %+v", hk)
	}
	t.Logf("host: %d CPUs, %d bytes, %d disks, %d NICs, %d GPUs; hardware key %s trusted=%v identifiers=%v rejected=%v",
		inv.CPU.LogicalCPUs, inv.Memory.TotalBytes, len(inv.Disks), len(inv.NICs), len(inv.GPUs.Devices),
		hk.Key, hk.Trusted, hk.Identifiers, hk.Rejected)
}

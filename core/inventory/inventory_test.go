package inventory

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/core/gpu"
)

var fixtures = []string{"h100-8x-sxm", "h200-8x", "a100-4x-pcie-mig", "cpu-only"}

func load(t *testing.T, name string) *NodeInventory {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name + ".json")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return inv
}

func deepCopy(t *testing.T, inv *NodeInventory) *NodeInventory {
	t.Helper()
	raw, _ := json.Marshal(inv)
	var c NodeInventory
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// shuffled returns a deep copy of inv with every list in a random order.
func shuffled(t *testing.T, inv *NodeInventory, seed uint64) *NodeInventory {
	t.Helper()
	c := *deepCopy(t, inv)
	r := rand.New(rand.NewPCG(seed, seed))
	shuffle := func(n int, swap func(i, j int)) { r.Shuffle(n, swap) }
	shuffle(len(c.Disks), func(i, j int) { c.Disks[i], c.Disks[j] = c.Disks[j], c.Disks[i] })
	shuffle(len(c.NICs), func(i, j int) { c.NICs[i], c.NICs[j] = c.NICs[j], c.NICs[i] })
	shuffle(len(c.Memory.DIMMs), func(i, j int) { c.Memory.DIMMs[i], c.Memory.DIMMs[j] = c.Memory.DIMMs[j], c.Memory.DIMMs[i] })
	d := c.GPUs.Devices
	shuffle(len(d), func(i, j int) { d[i], d[j] = d[j], d[i] })
	for k := range d {
		m := d[k].MigInstances
		shuffle(len(m), func(i, j int) { m[i], m[j] = m[j], m[i] })
	}
	for k := range c.NICs {
		v := c.NICs[k].VFs
		shuffle(len(v), func(i, j int) { v[i], v[j] = v[j], v[i] })
	}
	return &c
}

func TestParseFixtures(t *testing.T) {
	for _, f := range fixtures {
		inv := load(t, f)
		if inv.Kind != Kind || inv.Version != Version {
			t.Errorf("%s: %s v%d", f, inv.Kind, inv.Version)
		}
	}
	for _, bad := range []string{
		`{"kind":"NodeInventory","version":2}`,
		`{"kind":"Other","version":1}`,
		`{"kind":"NodeInventory","version":1,"extra":true}`,
		`{"kind":"NodeInventory","version":1,"gpus":{"devices":[{"index":0,"name":"NVIDIA L4"}]}}`,
		`{"kind":"NodeInventory","version":1,"gpus":{"devices":[{"uuid":"GPU-1"},{"uuid":"GPU-1"}]}}`,
	} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s) succeeded", bad)
		}
	}
}

func TestHashesIgnoreOrderAndReportFields(t *testing.T) {
	for _, f := range fixtures {
		inv := load(t, f)
		h, err := Hash(inv)
		if err != nil {
			t.Fatal(err)
		}
		if len(h.Sections) != len(Sections) || !strings.HasPrefix(h.Digest, "sha256:") {
			t.Fatalf("%s: %+v", f, h)
		}
		for seed := range uint64(5) {
			s := shuffled(t, inv, seed)
			s.CollectedAt, s.AgentVersion = 42, "bcd/9.9.9"
			h2, _ := Hash(s)
			if h2.Digest != h.Digest {
				t.Errorf("%s: digest changed with list order or report fields", f)
			}
		}
	}
}

func TestSectionHashAndDiff(t *testing.T) {
	base := load(t, "h100-8x-sxm")
	tests := []struct {
		section string
		mutate  func(*NodeInventory)
		path    string
		op      string
	}{
		{SectionSystem, func(i *NodeInventory) { i.System.Kernel = "5.15.0-122-generic" }, "system.kernel", OpChanged},
		{SectionCPU, func(i *NodeInventory) { i.CPU.LogicalCPUs = 112 }, "cpu.logicalCpus", OpChanged},
		{SectionMemory, func(i *NodeInventory) { i.Memory.DIMMs = i.Memory.DIMMs[1:] }, "memory.dimms[locator=P0_DIMMA1]", OpRemoved},
		{SectionDisks, func(i *NodeInventory) { i.Disks[2].SizeBytes = 3840755982336 },
			"disks[wwn=" + base.Disks[2].WWN + "].sizeBytes", OpChanged},
		{SectionNICs, func(i *NodeInventory) { i.NICs[0].Firmware = "4.50" }, "nics[name=eno1].firmware", OpChanged},
		{SectionGPUs, func(i *NodeInventory) { i.GPUs.Devices = i.GPUs.Devices[:7] },
			"gpus.devices[uuid=GPU-d4c3b2a1-9f8e-47d6-85c4-b3a291807f67]", OpRemoved},
		{SectionGPUs, func(i *NodeInventory) { i.GPUs.Devices[3].MigMode = "enabled" },
			"gpus.devices[uuid=GPU-a1b2c3d4-e5f6-4789-8abc-def012345673].migMode", OpChanged},
		{SectionFirmware, func(i *NodeInventory) { i.Firmware.BIOSVersion = "2.2" }, "firmware.biosVersion", OpChanged},
		{SectionFirmware, func(i *NodeInventory) { i.Firmware.CPUMicrocode = "" }, "firmware.cpuMicrocode", OpRemoved},
	}
	h0, _ := Hash(base)
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			m := deepCopy(t, base)
			tt.mutate(m)
			m = shuffled(t, m, 7)
			h1, err := Hash(m)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range Sections {
				if changed := h0.Sections[s] != h1.Sections[s]; changed != (s == tt.section) {
					t.Errorf("section %s changed=%v", s, changed)
				}
			}
			if h0.Digest == h1.Digest {
				t.Error("digest did not change")
			}
			d, err := Diff(base, m)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(d.Changed, []string{tt.section}) || len(d.Sections) != 1 {
				t.Fatalf("Changed = %v", d.Changed)
			}
			sd := d.Sections[0]
			if sd.OldHash != h0.Sections[tt.section] || sd.NewHash != h1.Sections[tt.section] {
				t.Error("diff hashes differ from Hash")
			}
			if len(sd.Changes) != 1 || sd.Changes[0].Path != tt.path || sd.Changes[0].Op != tt.op {
				t.Fatalf("changes = %+v, want one %s %s", sd.Changes, tt.op, tt.path)
			}
		})
	}
	d, _ := Diff(base, shuffled(t, base, 3))
	if !d.Empty() || d.Changed == nil {
		t.Errorf("diff of a reordered copy = %+v", d)
	}
}

func TestCanonicalJSON(t *testing.T) {
	b, err := CanonicalJSON(map[string]any{"b": 1, "a": []any{"<x>", 2.5}, "c": map[string]any{"z": nil, "y": true}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"a":["<x>",2.5],"b":1,"c":{"y":true,"z":null}}`; string(b) != want {
		t.Errorf("got %s, want %s", b, want)
	}
}

func TestDevicesExclusive(t *testing.T) {
	tests := []struct {
		fixture, model, product string
		gpus                    int
		mem                     int64
		domain                  string
		vfs, disks              int
	}{
		{"h100-8x-sxm", "H100", "H100-SXM5-80GB", 8, 80, "hgx-S462390X3A17104", 4, 4},
		{"h200-8x", "H200", "H200-SXM5-141GB", 8, 141, "hgx-4Q9GN43", 0, 8},
		{"a100-4x-pcie-mig", "A100", "A100-PCIE-40GB", 4, 40, "", 4, 2},
		{"cpu-only", "", "", 0, 0, "", 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			inv := load(t, tt.fixture)
			set, err := Devices(inv, PartitionPolicy{Profile: &HardwareProfile{GPUCount: tt.gpus, GPUModel: tt.model}})
			if err != nil {
				t.Fatal(err)
			}
			counts := map[string]int{}
			bookable := map[string]int{}
			for _, d := range set.Devices {
				counts[d.Class]++
				if d.Bookable {
					bookable[d.Class]++
				}
			}
			want := map[string]int{ClassNode: 1, ClassGPU: tt.gpus, ClassNICVF: tt.vfs, ClassDisk: tt.disks + 1}
			for c, n := range want {
				if counts[c] != n {
					t.Errorf("%s: %d devices, want %d", c, counts[c], n)
				}
			}
			if bookable[ClassGPU] != tt.gpus || bookable[ClassDisk] != tt.disks || counts[ClassGPUMig]+counts[ClassSlot] != 0 {
				t.Errorf("bookable %v counts %v", bookable, counts)
			}
			for _, g := range inv.GPUs.Devices {
				d, ok := set.Device(g.UUID)
				if !ok || !d.Bookable || d.Class != ClassGPU {
					t.Fatalf("GPU %s: %+v", g.UUID, d)
				}
				a := d.Attributes
				if a["gpuModel"] != tt.model || a["gpuProduct"] != tt.product || a["memoryGiB"] != tt.mem {
					t.Errorf("attributes %v", a)
				}
				if tt.domain != "" && a["nvlinkDomain"] != tt.domain {
					t.Errorf("nvlinkDomain %v", a["nvlinkDomain"])
				}
			}
			for _, c := range set.Conditions {
				if c.Type != CondMigModeMismatch || tt.fixture != "a100-4x-pcie-mig" {
					t.Errorf("unexpected condition %+v", c)
				}
			}
			if tt.fixture == "a100-4x-pcie-mig" && len(set.Conditions) != 4 {
				t.Errorf("want MigModeMismatch per MIG-enabled GPU, got %+v", set.Conditions)
			}
		})
	}
}

func TestDevicesMIG(t *testing.T) {
	tests := []struct {
		fixture string
		layout  gpu.MigLayout
		ids     []string // per GPU suffixes
		cond    string
		profile string // profile of the first atom
	}{
		// The A100 box reports instances that match: real GI/CI ids.
		{"a100-4x-pcie-mig", gpu.MigLayout{"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2},
			[]string{"/gi1/ci0", "/gi13/ci0", "/gi14/ci0", "/gi5/ci0"}, "", "3g.20gb"},
		// A different layout than the one on the GPUs: planned ids, mismatch.
		{"a100-4x-pcie-mig", gpu.MigLayout{"1g.5gb": 7},
			[]string{"/gi0/ci0", "/gi1/ci0", "/gi2/ci0", "/gi3/ci0", "/gi4/ci0", "/gi5/ci0", "/gi6/ci0"}, CondMigLayoutMismatch, "1g.5gb"},
		// H100 and H200 have MIG off: planned ids, pending.
		{"h100-8x-sxm", gpu.MigLayout{"3g.40gb": 2},
			[]string{"/gi0/ci0", "/gi1/ci0"}, CondMigLayoutPending, "3g.40gb"},
		{"h200-8x", gpu.MigLayout{"1g.18gb": 7},
			[]string{"/gi0/ci0", "/gi1/ci0", "/gi2/ci0", "/gi3/ci0", "/gi4/ci0", "/gi5/ci0", "/gi6/ci0"}, CondMigLayoutPending, "1g.18gb"},
		{"cpu-only", gpu.MigLayout{"1g.10gb": 7}, nil, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.fixture+"/"+tt.layout.String(), func(t *testing.T) {
			inv := load(t, tt.fixture)
			set, err := Devices(inv, PartitionPolicy{Sharing: SharingMIG, MigLayout: tt.layout})
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range inv.GPUs.Devices {
				p, _ := set.Device(g.UUID)
				if p.Bookable || p.Class != ClassGPU {
					t.Errorf("parent %s bookable=%v", g.UUID, p.Bookable)
				}
				var got []string
				for _, d := range set.Devices {
					if d.Parent == g.UUID {
						if d.Class != ClassGPUMig || !d.Bookable || d.Attributes["migProfile"] == nil {
							t.Errorf("child %+v", d)
						}
						got = append(got, strings.TrimPrefix(d.ID, g.UUID))
					}
				}
				if !slices.Equal(got, tt.ids) {
					t.Errorf("%s atoms %v, want %v", g.UUID, got, tt.ids)
				}
			}
			if tt.cond != "" && !set.HasCondition(tt.cond) {
				t.Errorf("no %s in %+v", tt.cond, set.Conditions)
			}
			if tt.cond == "" && len(set.Conditions) != 0 {
				t.Errorf("conditions %+v", set.Conditions)
			}
			if len(inv.GPUs.Devices) > 0 {
				g := inv.GPUs.Devices[0].UUID
				var first Device
				for _, d := range set.Devices {
					if d.Parent == g {
						first = d
						break
					}
				}
				prof, _ := gpu.Default().MigProfile(first.Attributes["gpuProduct"].(string), tt.profile)
				if first.Attributes["memoryGiB"] != int64(prof.MemoryGiB) {
					t.Errorf("memoryGiB %v, profile %+v", first.Attributes["memoryGiB"], prof)
				}
			}
		})
	}
	// The atom ids of the converged A100 box are the MIG device names NVML uses.
	set, _ := Devices(load(t, "a100-4x-pcie-mig"), PartitionPolicy{Sharing: SharingMIG, MigLayout: gpu.MigLayout{"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}})
	if d, ok := set.Device("GPU-b7c1e0a2-4f3d-5e6a-1b2c-3d4e5f607182/gi1/ci0"); !ok || d.Attributes["migProfile"] != "3g.20gb" {
		t.Errorf("MIG atom: %+v", d)
	}
	// A layout that does not fit the product: no atoms, MigLayoutInvalid.
	set, _ = Devices(load(t, "a100-4x-pcie-mig"), PartitionPolicy{Sharing: SharingMIG, MigLayout: gpu.MigLayout{"7g.80gb": 1}})
	if len(set.Atoms()) != 1+4+2 || !set.HasCondition(CondMigLayoutInvalid) { // node, VFs, data disks
		t.Errorf("atoms %d conditions %+v", len(set.Atoms()), set.Conditions)
	}
}

func TestDevicesSlots(t *testing.T) {
	for _, sharing := range []string{SharingTimeslice, SharingMPS} {
		for _, f := range fixtures {
			for _, replicas := range []int{1, 4, 7} {
				inv := load(t, f)
				set, err := Devices(inv, PartitionPolicy{Sharing: sharing, Replicas: replicas})
				if err != nil {
					t.Fatal(err)
				}
				for _, g := range inv.GPUs.Devices {
					p, _ := set.Device(g.UUID)
					if p.Bookable {
						t.Errorf("%s %s: parent bookable", f, sharing)
					}
					for k := range replicas {
						d, ok := set.Device(fmt.Sprintf("%s/s%d", g.UUID, k))
						if !ok || !d.Bookable || d.Class != ClassSlot || d.Parent != g.UUID ||
							d.Attributes["sharing"] != sharing || d.Attributes["replicas"] != int64(replicas) {
							t.Errorf("%s %s slot %d: %+v", f, sharing, k, d)
						}
					}
					if _, ok := set.Device(fmt.Sprintf("%s/s%d", g.UUID, replicas)); ok {
						t.Errorf("slot %d beyond replicas", replicas)
					}
				}
				if f == "a100-4x-pcie-mig" && !set.HasCondition(CondMigModeMismatch) {
					t.Errorf("MIG-enabled GPUs shared by %s raise no MigModeMismatch", sharing)
				}
			}
		}
	}
}

func TestDevicesStableAcrossRunsAndOrder(t *testing.T) {
	policies := []PartitionPolicy{
		{},
		{Sharing: SharingMIG, MigLayout: gpu.MigLayout{"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}},
		{Sharing: SharingMIG, MigLayout: gpu.MigLayout{"1g.10gb": 3, "2g.20gb": 1, "1g.20gb": 1}},
		{Sharing: SharingTimeslice, Replicas: 4},
		{Sharing: SharingMPS, Replicas: 8},
	}
	for _, f := range fixtures {
		inv := load(t, f)
		for _, p := range policies {
			a, err := Devices(inv, p)
			if err != nil {
				t.Fatal(err)
			}
			ja, _ := json.Marshal(a)
			for seed := range uint64(10) {
				b, _ := Devices(shuffled(t, inv, seed), p)
				jb, _ := json.Marshal(b)
				if string(ja) != string(jb) {
					t.Fatalf("%s %+v: devices differ with input order (seed %d)", f, p, seed)
				}
			}
			ids := map[string]bool{}
			for _, d := range a.Devices {
				if ids[d.ID] {
					t.Errorf("%s: duplicate id %s", f, d.ID)
				}
				ids[d.ID] = true
			}
		}
	}
}

func TestDevicesConditions(t *testing.T) {
	inv := load(t, "h100-8x-sxm")
	set, _ := Devices(inv, PartitionPolicy{Profile: &HardwareProfile{GPUCount: 8, GPUModel: "H100"}})
	if len(set.Conditions) != 0 {
		t.Errorf("conditions %+v", set.Conditions)
	}
	set, _ = Devices(inv, PartitionPolicy{Profile: &HardwareProfile{GPUCount: 4, GPUModel: "H200"}})
	if !set.HasCondition(CondGpuCountMismatch) || !set.HasCondition(CondGpuModelMismatch) {
		t.Errorf("conditions %+v", set.Conditions)
	}

	// An unknown GPU maps to other, raises GpuModelUnknown and stays bookable
	// with its memory from NVML.
	inv.GPUs.Devices[0].Name = "NVIDIA RTX 6000 Ada Generation"
	inv.GPUs.Devices[0].MemoryMiB = 49140
	set, _ = Devices(inv, PartitionPolicy{Profile: &HardwareProfile{GPUCount: 8, GPUModel: "H100"}})
	d, _ := set.Device(inv.GPUs.Devices[0].UUID)
	if d.Attributes["gpuModel"] != gpu.Other || d.Attributes["gpuProduct"] != "RTX-6000-ADA-GENERATION" ||
		d.Attributes["memoryGiB"] != int64(47) || !d.Bookable {
		t.Errorf("unknown GPU %+v", d)
	}
	if !set.HasCondition(CondGpuModelUnknown) || !set.HasCondition(CondGpuModelMismatch) || set.HasCondition(CondGpuCountMismatch) {
		t.Errorf("conditions %+v", set.Conditions)
	}
	if BlocksScheduling(CondGpuModelUnknown) || !BlocksScheduling(CondGpuCountMismatch) {
		t.Error("BlocksScheduling")
	}
}

func TestDevicesPolicyValidation(t *testing.T) {
	inv := load(t, "h100-8x-sxm")
	for _, p := range []PartitionPolicy{
		{Sharing: "spatial"},
		{Sharing: SharingMIG},
		{Sharing: SharingTimeslice},
		{Sharing: SharingTimeslice, Replicas: MaxTimesliceReplicas + 1},
		{Sharing: SharingMPS, Replicas: MaxMPSReplicas + 1},
		{Sharing: SharingMPS, Replicas: -1},
	} {
		if _, err := Devices(inv, p); err == nil {
			t.Errorf("Devices accepted %+v", p)
		}
	}
}

func TestNodeAndDiskIDs(t *testing.T) {
	set, _ := Devices(load(t, "h100-8x-sxm"), PartitionPolicy{})
	if _, ok := set.Device("node/7b0e6a4c-3d2f-11ee-9c1a-7cc2554e01a2"); !ok {
		t.Error("node device id is not the product UUID")
	}
	if d, ok := set.Device("eui.36344630549012340025384500000001"); !ok || d.Bookable {
		t.Errorf("system disk %+v", d)
	}
	if d, ok := set.Device("b8:5c:d2:a1:f0:02"); !ok || d.Class != ClassNICVF || d.Attributes["pf"] != "ibp1as0" {
		t.Errorf("VF %+v", d)
	}
	cpu := load(t, "cpu-only")
	set, _ = Devices(cpu, PartitionPolicy{})
	if _, ok := set.Device("node/" + ComputeHardwareKey(cpu).Key); !ok {
		t.Error("placeholder product UUID: node id is not the hardware key")
	}
	if _, ok := set.Device("disk/Micron_7450_MTFDKCC15T3TFR/2306FFAA0011"); !ok {
		t.Error("disk without WWN: no model/serial id")
	}
}

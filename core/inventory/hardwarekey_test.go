package inventory

import (
	"slices"
	"strings"
	"testing"
)

func TestHardwareKeyFixtures(t *testing.T) {
	tests := []struct {
		fixture string
		trusted bool
		idents  []string
	}{
		{"h100-8x-sxm", true, []string{IdentProductUUID, IdentSerial, IdentMAC, IdentGPUUUID}},
		{"h200-8x", true, []string{IdentProductUUID, IdentSerial, IdentMAC, IdentGPUUUID}},
		{"a100-4x-pcie-mig", true, []string{IdentProductUUID, IdentSerial, IdentMAC, IdentGPUUUID}},
		// AMI default UUID and "To Be Filled By O.E.M.": only the MACs survive.
		{"cpu-only", false, []string{IdentMAC}},
	}
	keys := map[string]bool{}
	for _, tt := range tests {
		inv := load(t, tt.fixture)
		hk := ComputeHardwareKey(inv)
		if hk.Trusted != tt.trusted || !slices.Equal(hk.Identifiers, tt.idents) || len(hk.Key) != 64 {
			t.Errorf("%s: %+v", tt.fixture, hk)
		}
		if keys[hk.Key] {
			t.Errorf("%s: key collides", tt.fixture)
		}
		keys[hk.Key] = true
		// Stable under enumeration order and report fields.
		for seed := range uint64(5) {
			s := shuffled(t, inv, seed)
			s.CollectedAt = 1
			if ComputeHardwareKey(s).Key != hk.Key {
				t.Errorf("%s: key depends on order", tt.fixture)
			}
		}
	}
}

func TestHardwareKeyNormalization(t *testing.T) {
	base := load(t, "h100-8x-sxm")
	want := ComputeHardwareKey(base).Key
	tests := []struct {
		name   string
		mutate func(*NodeInventory)
	}{
		{"MAC lower case", func(i *NodeInventory) {
			for k := range i.NICs {
				i.NICs[k].PermanentMAC = strings.ToLower(i.NICs[k].PermanentMAC)
			}
		}},
		{"MAC dashes", func(i *NodeInventory) { i.NICs[0].PermanentMAC = "7c-c2-55-4e-01-a2" }},
		{"MAC Cisco dots", func(i *NodeInventory) { i.NICs[0].PermanentMAC = "7cc2.554e.01a2" }},
		{"MAC bare hex", func(i *NodeInventory) { i.NICs[0].PermanentMAC = "7CC2554E01A2" }},
		{"MAC padded", func(i *NodeInventory) { i.NICs[0].PermanentMAC = "  7C:C2:55:4E:01:A2 " }},
		{"duplicate MAC", func(i *NodeInventory) {
			i.NICs = append(i.NICs, NIC{Name: "bond0-slave", PermanentMAC: "7c:c2:55:4e:01:a2"})
		}},
		{"current MAC changed by a bond", func(i *NodeInventory) { i.NICs[1].MAC = "7C:C2:55:4E:01:A2" }},
		{"virtual NIC added", func(i *NodeInventory) {
			i.NICs = append(i.NICs, NIC{Name: "veth1", MAC: "0e:11:22:33:44:55", PermanentMAC: "0e:11:22:33:44:55", Virtual: true})
		}},
		{"product UUID upper case", func(i *NodeInventory) { i.System.ProductUUID = strings.ToUpper(i.System.ProductUUID) }},
		{"product UUID without dashes", func(i *NodeInventory) {
			i.System.ProductUUID = strings.ReplaceAll(i.System.ProductUUID, "-", "")
		}},
		{"serial case and spaces", func(i *NodeInventory) { i.System.SerialNumber = " s462390x3a17104 " }},
		{"GPU UUID case", func(i *NodeInventory) { i.GPUs.Devices[0].UUID = strings.ToUpper(i.GPUs.Devices[0].UUID) }},
		{"hostname, kernel and firmware", func(i *NodeInventory) {
			i.System.Hostname, i.System.Kernel, i.Firmware.BIOSVersion = "renamed", "6.8.0", "9.9"
		}},
	}
	for _, tt := range tests {
		m := deepCopy(t, base)
		tt.mutate(m)
		if got := ComputeHardwareKey(m); got.Key != want || !got.Trusted {
			t.Errorf("%s: key changed", tt.name)
		}
	}
	// A swapped GPU or NIC is different hardware.
	m := deepCopy(t, base)
	m.GPUs.Devices[2].UUID = "GPU-00112233-4455-6677-8899-aabbccddeeff"
	if ComputeHardwareKey(m).Key == want {
		t.Error("GPU swap kept the key")
	}
}

func TestHardwareKeyBlocklist(t *testing.T) {
	// One real identifier besides the tested one keeps the test about the
	// tested value: trusted iff it survives.
	const mac = "B8:3F:D2:A1:10:20"
	tests := []struct {
		name        string
		productUUID string
		serial      string
		permMAC     string
		gpuUUID     string
		reason      string
	}{
		{"serial O.E.M.", "", "To Be Filled By O.E.M.", mac, "", "placeholder"},
		{"serial O.E.M. lower", "", "to be filled by o.e.m.", mac, "", "placeholder"},
		{"serial Default string", "", "Default string", mac, "", "placeholder"},
		{"serial System Serial Number", "", "System Serial Number", mac, "", "placeholder"},
		{"serial Not Specified", "", "Not Specified", mac, "", "placeholder"},
		{"serial N/A", "", "N/A", mac, "", "placeholder"},
		{"serial 0123456789", "", "0123456789", mac, "", "placeholder"},
		{"serial zeros", "", "0000000000", mac, "", "repeated character"},
		{"serial XXXX", "", "XXXXXXXXXX", mac, "", "repeated character"},
		{"serial dots", "", "..........", mac, "", "repeated character"},
		{"serial too short", "", "A1", mac, "", "too short"},
		{"UUID all zero", "00000000-0000-0000-0000-000000000000", "", mac, "", "placeholder"},
		{"UUID all F", "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", "", mac, "", "placeholder"},
		{"UUID AMI default", "03000200-0400-0500-0006-000700080009", "", mac, "", "placeholder"},
		{"UUID malformed", "Not Settable", "", mac, "", "malformed"},
		{"MAC all zero", "", "S462390X3A17104", "00:00:00:00:00:00", "", "placeholder"},
		{"MAC broadcast", "", "S462390X3A17104", "FF:FF:FF:FF:FF:FF", "", "broadcast"},
		{"MAC multicast", "", "S462390X3A17104", "01:00:5e:00:00:fb", "", "multicast"},
		{"MAC locally administered", "", "S462390X3A17104", "02:42:ac:11:00:02", "", "locally administered"},
		{"MAC malformed", "", "S462390X3A17104", "not-a-mac", "", "malformed"},
		{"GPU UUID all zero", "", "S462390X3A17104", "", "GPU-00000000-0000-0000-0000-000000000000", "placeholder"},
		{"GPU UUID all F", "", "S462390X3A17104", "", "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff", "placeholder"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := &NodeInventory{Kind: Kind, Version: Version}
			inv.System.ProductUUID, inv.System.SerialNumber = tt.productUUID, tt.serial
			if tt.permMAC != "" {
				inv.NICs = []NIC{{Name: "eth0", PermanentMAC: tt.permMAC}}
			}
			if tt.gpuUUID != "" {
				inv.GPUs.Devices = []GPU{{UUID: tt.gpuUUID, Name: "NVIDIA H100 80GB HBM3"}}
			}
			hk := ComputeHardwareKey(inv)
			if hk.Trusted || len(hk.Identifiers) != 1 {
				t.Fatalf("trusted with a placeholder: %+v", hk)
			}
			if len(hk.Rejected) != 1 || hk.Rejected[0].Reason != tt.reason {
				t.Errorf("rejected %+v, want %s", hk.Rejected, tt.reason)
			}
		})
	}
}

func TestHardwareKeyTrust(t *testing.T) {
	const (
		uuid   = "7b0e6a4c-3d2f-11ee-9c1a-7cc2554e01a2"
		serial = "S462390X3A17104"
		mac    = "7C:C2:55:4E:01:A2"
		gpu    = "GPU-5e9a1b2c-7d3f-4a8e-9b1c-2d3e4f5a6b70"
	)
	tests := []struct {
		name         string
		uuid, serial string
		macs, gpus   []string
		trusted      bool
	}{
		{"nothing", "", "", nil, nil, false},
		{"product UUID only", uuid, "", nil, nil, false},
		{"many MACs are one source", "", "", []string{mac, "7C:C2:55:4E:01:A3", "B8:3F:D2:A1:10:20"}, nil, false},
		{"many GPUs are one source", "", "", nil, []string{gpu, "GPU-8c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e51"}, false},
		{"UUID and serial", uuid, serial, nil, nil, true},
		{"UUID and MAC", uuid, "", []string{mac}, nil, true},
		{"serial and GPU", "", serial, nil, []string{gpu}, true},
		{"MAC and GPU", "", "", []string{mac}, []string{gpu}, true},
		{"all four", uuid, serial, []string{mac}, []string{gpu}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := &NodeInventory{Kind: Kind, Version: Version}
			inv.System.ProductUUID, inv.System.SerialNumber = tt.uuid, tt.serial
			for _, m := range tt.macs {
				inv.NICs = append(inv.NICs, NIC{Name: "eth", PermanentMAC: m})
			}
			for _, g := range tt.gpus {
				inv.GPUs.Devices = append(inv.GPUs.Devices, GPU{UUID: g})
			}
			if hk := ComputeHardwareKey(inv); hk.Trusted != tt.trusted {
				t.Errorf("trusted = %v: %+v", hk.Trusted, hk)
			}
		})
	}
}

func TestHardwareKeyWithoutIdentifiersIsEmpty(t *testing.T) {
	inv := &NodeInventory{NICs: []NIC{{Name: "eth0", PermanentMAC: "02:fc:00:00:00:01"}}}
	hk := ComputeHardwareKey(inv)
	if hk.Key != "" || hk.Trusted || len(hk.Identifiers) != 0 || len(hk.Rejected) != 1 {
		t.Fatalf("hardware key of a machine without identifiers = %+v, want none", hk)
	}
}

package inventory

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/core"
)

// Hashes holds the SHA-256 of each section's canonical JSON ("sha256:<hex>")
// and Digest, the SHA-256 over the section hashes in section order.
type Hashes struct {
	Sections map[string]string `json:"sections"`
	Digest   string            `json:"digest"`
}

// Canonical returns a copy of the inventory with every list sorted by its
// natural key (GPUs by PCI bus id then UUID, disks by WWN then name, NICs by
// name, DIMMs by locator, VFs by index, MIG instances by GI/CI), so the order
// an agent enumerated hardware in changes neither hashes nor diffs.
func Canonical(inv *NodeInventory) *NodeInventory {
	c := *inv
	c.Memory.DIMMs = slices.Clone(inv.Memory.DIMMs)
	slices.SortStableFunc(c.Memory.DIMMs, func(a, b DIMM) int { return strings.Compare(a.Locator, b.Locator) })
	c.Disks = slices.Clone(inv.Disks)
	slices.SortStableFunc(c.Disks, func(a, b Disk) int {
		return cmp.Or(strings.Compare(a.WWN, b.WWN), strings.Compare(a.Name, b.Name), strings.Compare(a.Serial, b.Serial))
	})
	c.NICs = slices.Clone(inv.NICs)
	for i := range c.NICs {
		c.NICs[i].VFs = slices.Clone(c.NICs[i].VFs)
		slices.SortStableFunc(c.NICs[i].VFs, func(a, b VF) int { return cmp.Compare(a.Index, b.Index) })
	}
	slices.SortStableFunc(c.NICs, func(a, b NIC) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.PermanentMAC, b.PermanentMAC))
	})
	c.GPUs.Devices = slices.Clone(inv.GPUs.Devices)
	for i := range c.GPUs.Devices {
		c.GPUs.Devices[i].MigInstances = slices.Clone(c.GPUs.Devices[i].MigInstances)
		slices.SortStableFunc(c.GPUs.Devices[i].MigInstances, func(a, b MigInstance) int {
			return cmp.Or(cmp.Compare(a.GI, b.GI), cmp.Compare(a.CI, b.CI))
		})
	}
	slices.SortStableFunc(c.GPUs.Devices, func(a, b GPU) int {
		return cmp.Or(strings.Compare(strings.ToLower(a.PCIBusID), strings.ToLower(b.PCIBusID)), strings.Compare(a.UUID, b.UUID))
	})
	c.GPUs.NVSwitches = slices.Clone(inv.GPUs.NVSwitches)
	slices.SortStableFunc(c.GPUs.NVSwitches, func(a, b NVSwitch) int { return strings.Compare(a.PCIBusID, b.PCIBusID) })
	return &c
}

// section returns the value of one section.
func (inv *NodeInventory) section(name string) any {
	switch name {
	case SectionSystem:
		return inv.System
	case SectionCPU:
		return inv.CPU
	case SectionMemory:
		return inv.Memory
	case SectionDisks:
		return orEmpty(inv.Disks)
	case SectionNICs:
		return orEmpty(inv.NICs)
	case SectionGPUs:
		g := inv.GPUs
		g.Devices = orEmpty(g.Devices)
		return g
	case SectionFirmware:
		return inv.Firmware
	}
	return nil
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func decodeTree(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, err
	}
	return tree, nil
}

func encodeTree(tree any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(tree); err != nil { // maps encode with sorted keys
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// SectionTrees returns each section of the canonical inventory as a decoded
// JSON tree (map[string]any, []any, json.Number, string, bool, nil).
func SectionTrees(inv *NodeInventory) (map[string]any, error) {
	c := Canonical(inv)
	out := make(map[string]any, len(Sections))
	for _, s := range Sections {
		raw, err := json.Marshal(c.section(s))
		if err != nil {
			return nil, core.Wrap(core.CodeInternal, err, "inventory: cannot encode section "+s)
		}
		tree, err := decodeTree(raw)
		if err != nil {
			return nil, core.Wrap(core.CodeInternal, err, "inventory: cannot decode section "+s)
		}
		out[s] = tree
	}
	return out, nil
}

// Hash computes the section hashes and the digest of an inventory.
func Hash(inv *NodeInventory) (Hashes, error) {
	trees, err := SectionTrees(inv)
	if err != nil {
		return Hashes{}, err
	}
	h := Hashes{Sections: make(map[string]string, len(Sections))}
	all := sha256.New()
	for _, s := range Sections {
		b, err := encodeTree(trees[s])
		if err != nil {
			return Hashes{}, core.Wrap(core.CodeInternal, err, "inventory: cannot encode section "+s)
		}
		sum := sha256.Sum256(b)
		h.Sections[s] = "sha256:" + hex.EncodeToString(sum[:])
		all.Write([]byte(s + "=" + h.Sections[s] + "\n"))
	}
	h.Digest = "sha256:" + hex.EncodeToString(all.Sum(nil))
	return h, nil
}

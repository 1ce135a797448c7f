package inventory

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"strings"
)

// The sample inventories are the shapes of real machines (8×H100 SXM,
// 8×H200, 4×A100 PCIe with MIG, a CPU-only box). Tests use them, and the dev
// stack fills its demo pool with copies of them until agents report real
// inventories.
//
//go:embed testdata/*.json
var samples embed.FS

// Sample parses the sample inventory name (e.g. "h100-8x-sxm.json").
func Sample(name string) (*NodeInventory, error) {
	raw, err := samples.ReadFile("testdata/" + name)
	if err != nil {
		return nil, fmt.Errorf("inventory: no sample %q", name)
	}
	return Parse(raw)
}

// Copy returns inv as machine number n of identical machines: every
// identifier (product UUID, serials, MACs, disk WWNs, GPU and MIG UUIDs) is
// derived from the original and n, so each copy has a hardware key and
// device ids of its own, deterministically.
func (inv *NodeInventory) Copy(n int) *NodeInventory {
	c := *inv
	salt := fmt.Sprintf("/%d", n)
	if _, rejected := NormalizeUUID(inv.System.ProductUUID); rejected == "" {
		c.System.ProductUUID = derivedUUID(inv.System.ProductUUID + salt) // a placeholder stays one
	}
	c.System.SerialNumber = derivedSerial(inv.System.SerialNumber, n)
	c.System.BoardSerial = derivedSerial(inv.System.BoardSerial, n)
	c.System.Hostname = fmt.Sprintf("%s-%d", inv.System.Hostname, n)
	c.Disks = append([]Disk(nil), inv.Disks...)
	for i := range c.Disks {
		c.Disks[i].Serial = derivedSerial(c.Disks[i].Serial, n)
		if c.Disks[i].WWN != "" {
			c.Disks[i].WWN = derivedWWN(c.Disks[i].WWN, salt)
		}
	}
	c.NICs = append([]NIC(nil), inv.NICs...)
	for i := range c.NICs {
		c.NICs[i].MAC = derivedMAC(c.NICs[i].MAC, salt)
		c.NICs[i].PermanentMAC = derivedMAC(c.NICs[i].PermanentMAC, salt)
		c.NICs[i].VFs = append([]VF(nil), c.NICs[i].VFs...)
		for j := range c.NICs[i].VFs {
			c.NICs[i].VFs[j].MAC = derivedMAC(c.NICs[i].VFs[j].MAC, salt)
		}
	}
	c.GPUs.Devices = append([]GPU(nil), inv.GPUs.Devices...)
	for i := range c.GPUs.Devices {
		g := &c.GPUs.Devices[i]
		g.UUID = "GPU-" + derivedUUID(g.UUID+salt)
		g.Serial = derivedSerial(g.Serial, n)
		g.MigInstances = append([]MigInstance(nil), g.MigInstances...)
		for j := range g.MigInstances {
			if g.MigInstances[j].UUID != "" {
				g.MigInstances[j].UUID = "MIG-" + derivedUUID(g.MigInstances[j].UUID+salt)
			}
		}
	}
	return &c
}

func derivedHex(seed string) string {
	sum := sha256.Sum256([]byte(seed))
	return hex.EncodeToString(sum[:])
}

func derivedUUID(seed string) string {
	h := derivedHex(seed)
	return strings.Join([]string{h[0:8], h[8:12], "4" + h[13:16], "8" + h[17:20], h[20:32]}, "-")
}

// derivedSerial keeps empty (and placeholder) serials as they are: a copy
// must not turn a blocklisted value into a trusted one.
func derivedSerial(serial string, n int) string {
	if _, rejected := NormalizeSerial(serial); rejected != "" {
		return serial
	}
	return fmt.Sprintf("%s-%d", serial, n)
}

// derivedMAC keeps the vendor's OUI and derives the rest.
func derivedMAC(mac, salt string) string {
	norm, rejected := NormalizeMAC(mac)
	if rejected != "" {
		return mac // keep a rejected MAC rejected
	}
	h := derivedHex(norm + salt)
	return norm[:9] + h[0:2] + ":" + h[2:4] + ":" + h[4:6]
}

func derivedWWN(wwn, salt string) string {
	h := derivedHex(wwn + salt)
	// Keep the form ("0x…", "eui.…") and the length; derive the digits.
	prefix := ""
	for _, p := range []string{"0x", "eui.", "naa."} {
		if strings.HasPrefix(wwn, p) {
			prefix = p
		}
	}
	return prefix + h[:min(len(wwn)-len(prefix), len(h))]
}

package inventory

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"regexp"
	"slices"
	"strings"
)

// Identifier kinds of the hardware key. Each kind is one independent source:
// several MACs (ports of one card) or several GPU UUIDs count once.
const (
	IdentProductUUID = "productUuid"
	IdentSerial      = "serialNumber"
	IdentMAC         = "mac"
	IdentGPUUUID     = "gpuUuid"
)

// MinTrustedIdentifiers is how many independent identifier kinds must survive
// the placeholder blocklist for the key to be trusted.
const MinTrustedIdentifiers = 2

// Rejected is an identifier the blocklist removed.
type Rejected struct {
	Kind   string `json:"kind"`
	Value  string `json:"value"`
	Reason string `json:"reason"`
}

// HardwareKey is a node's hardware key: the SHA-256 (hex) of its normalized
// product UUID, serial number, permanent MACs and GPU UUIDs, counting only
// identifiers that survive the placeholder blocklist. Key is empty when none
// survives.
type HardwareKey struct {
	Key string `json:"key"`
	// Trusted is true when at least MinTrustedIdentifiers kinds survived.
	Trusted bool `json:"trusted"`
	// Identifiers lists the surviving kinds, in fixed order.
	Identifiers []string   `json:"identifiers"`
	Rejected    []Rejected `json:"rejected,omitempty"`
}

// placeholders are DMI strings firmware vendors leave in place of a real
// value, compared after upper-casing and collapsing white space.
var placeholders = map[string]bool{
	"TO BE FILLED BY O.E.M.": true, "TO BE FILLED BY OEM": true, "DEFAULT STRING": true,
	"SYSTEM SERIAL NUMBER": true, "CHASSIS SERIAL NUMBER": true, "SERIAL NUMBER": true,
	"SYSTEM PRODUCT NAME": true, "BASE BOARD SERIAL NUMBER": true, "NOT SPECIFIED": true,
	"NOT APPLICABLE": true, "NOT AVAILABLE": true, "NOT PRESENT": true, "NONE": true, "NULL": true,
	"N/A": true, "NA": true, "UNKNOWN": true, "INVALID": true, "EMPTY": true, "OEM": true,
	"O.E.M.": true, "SERNUM": true, "SERIAL": true, "123456789": true, "1234567890": true,
	"0123456789": true, "01234567890": true, "ABCDEFGHIJ": true,
}

// placeholderUUIDs are product UUIDs shared by many boards: the all-zero and
// all-F UUIDs and the well-known AMI/Supermicro default.
var placeholderUUIDs = map[string]bool{
	"00000000000000000000000000000000": true,
	"ffffffffffffffffffffffffffffffff": true,
	"03000200040005000006000700080009": true,
	"00020003000400050006000700080009": true,
	"12345678123412341234123456789abc": true,
}

var (
	ws       = regexp.MustCompile(`\s+`)
	hex32    = regexp.MustCompile(`^[0-9a-f]{32}$`)
	macPlain = regexp.MustCompile(`^[0-9a-f]{12}$`)
)

// sameChar reports whether s is one character repeated (000000, XXXXXXX, ....).
func sameChar(s string) bool {
	return len(s) > 0 && strings.Count(s, s[:1]) == len(s)
}

// NormalizeSerial upper-cases and trims a serial; ok is false with a reason
// when it is a placeholder.
func NormalizeSerial(s string) (norm string, reason string) {
	n := strings.ToUpper(strings.TrimSpace(ws.ReplaceAllString(s, " ")))
	switch {
	case n == "":
		return "", "empty"
	case placeholders[n]:
		return n, "placeholder"
	case sameChar(strings.ReplaceAll(n, " ", "")):
		return n, "repeated character"
	case len(n) < 4:
		return n, "too short"
	}
	return n, ""
}

// NormalizeUUID lower-cases a UUID and removes dashes and braces; reason is
// set when it is malformed or a placeholder.
func NormalizeUUID(s string) (norm string, reason string) {
	n := strings.ToLower(strings.TrimSpace(s))
	n = strings.NewReplacer("-", "", "{", "", "}", "").Replace(n)
	switch {
	case n == "":
		return "", "empty"
	case !hex32.MatchString(n):
		return n, "malformed"
	case placeholderUUIDs[n]:
		return n, "placeholder"
	}
	return n, ""
}

// NormalizeGPUUUID lower-cases an NVIDIA (GPU-…) or AMD UUID; its body must be
// a real UUID.
func NormalizeGPUUUID(s string) (norm string, reason string) {
	t := strings.ToLower(strings.TrimSpace(s))
	prefix := ""
	if strings.HasPrefix(t, "gpu-") {
		prefix, t = "gpu-", t[4:]
	}
	body, reason := NormalizeUUID(t)
	return prefix + body, reason
}

// NormalizeMAC renders a MAC as lower-case colon-separated octets whatever
// its input format (colons, dashes, dots, none); reason is set for malformed,
// all-zero, broadcast, multicast and locally administered addresses, which
// are not permanent factory addresses.
func NormalizeMAC(s string) (norm string, reason string) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return "", "empty"
	}
	if macPlain.MatchString(t) {
		t = t[0:2] + ":" + t[2:4] + ":" + t[4:6] + ":" + t[6:8] + ":" + t[8:10] + ":" + t[10:12]
	}
	hw, err := net.ParseMAC(t)
	if err != nil || len(hw) != 6 {
		return t, "malformed"
	}
	n := hw.String()
	switch {
	case n == "00:00:00:00:00:00":
		return n, "placeholder"
	case n == "ff:ff:ff:ff:ff:ff":
		return n, "broadcast"
	case hw[0]&1 == 1:
		return n, "multicast"
	case hw[0]&2 == 2:
		return n, "locally administered"
	}
	return n, ""
}

// ComputeHardwareKey derives the node's hardware key from its inventory.
// Normalization makes it independent of case, MAC notation and the order
// NICs and GPUs were enumerated in. Virtual interfaces and SR-IOV VFs are not
// identifiers; a NIC without a permanent MAC contributes nothing.
func ComputeHardwareKey(inv *NodeInventory) HardwareKey {
	hk := HardwareKey{Identifiers: []string{}}
	reject := func(kind, value, reason string) {
		hk.Rejected = append(hk.Rejected, Rejected{Kind: kind, Value: value, Reason: reason})
	}
	var lines []string

	if inv.System.ProductUUID != "" {
		if n, why := NormalizeUUID(inv.System.ProductUUID); why == "" {
			lines = append(lines, IdentProductUUID+"="+n)
			hk.Identifiers = append(hk.Identifiers, IdentProductUUID)
		} else {
			reject(IdentProductUUID, inv.System.ProductUUID, why)
		}
	}
	if inv.System.SerialNumber != "" {
		if n, why := NormalizeSerial(inv.System.SerialNumber); why == "" {
			lines = append(lines, IdentSerial+"="+n)
			hk.Identifiers = append(hk.Identifiers, IdentSerial)
		} else {
			reject(IdentSerial, inv.System.SerialNumber, why)
		}
	}
	var macs []string
	for _, nic := range inv.NICs {
		if nic.Virtual || nic.PermanentMAC == "" {
			continue
		}
		if n, why := NormalizeMAC(nic.PermanentMAC); why == "" {
			macs = append(macs, n)
		} else {
			reject(IdentMAC, nic.PermanentMAC, why)
		}
	}
	slices.Sort(macs)
	macs = slices.Compact(macs)
	if len(macs) > 0 {
		for _, m := range macs {
			lines = append(lines, IdentMAC+"="+m)
		}
		hk.Identifiers = append(hk.Identifiers, IdentMAC)
	}
	var gpus []string
	for _, g := range inv.GPUs.Devices {
		if n, why := NormalizeGPUUUID(g.UUID); why == "" {
			gpus = append(gpus, n)
		} else {
			reject(IdentGPUUUID, g.UUID, why)
		}
	}
	slices.Sort(gpus)
	gpus = slices.Compact(gpus)
	if len(gpus) > 0 {
		for _, g := range gpus {
			lines = append(lines, IdentGPUUUID+"="+g)
		}
		hk.Identifiers = append(hk.Identifiers, IdentGPUUUID)
	}

	if len(lines) == 0 {
		// No identifier survived: there is no key, rather than one every
		// such machine would share.
		return hk
	}
	sum := sha256.Sum256([]byte("hardware-key/v1\n" + strings.Join(lines, "\n")))
	hk.Key = hex.EncodeToString(sum[:])
	hk.Trusted = len(hk.Identifiers) >= MinTrustedIdentifiers
	return hk
}

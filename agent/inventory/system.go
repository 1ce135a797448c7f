package inventory

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/core/inventory"
)

// collectSystem reads DMI identity, the OS and kernel, and BIOS firmware.
// product_uuid and the serials are root-only; as non-root they stay empty
// and the hardware key falls back to MACs and GPU UUIDs.
func collectSystem(o Options) (inventory.System, inventory.Firmware) {
	dmi := func(name string) string { return readString(o.path("sys/class/dmi/id", name)) }
	s := inventory.System{
		Vendor:       dmi("sys_vendor"),
		Product:      dmi("product_name"),
		ProductUUID:  dmi("product_uuid"),
		SerialNumber: dmi("product_serial"),
		SKU:          dmi("product_sku"),
		BoardVendor:  dmi("board_vendor"),
		BoardProduct: dmi("board_name"),
		BoardSerial:  dmi("board_serial"),
		ChassisType:  chassisType(dmi("chassis_type")),
		Hostname:     hostname(o),
		OS:           osName(o),
		Kernel:       readString(o.path("proc/sys/kernel/osrelease")),
	}
	fw := inventory.Firmware{
		BIOSVendor:  dmi("bios_vendor"),
		BIOSVersion: dmi("bios_version"),
		BIOSDate:    dmi("bios_date"),
	}
	return s, fw
}

func hostname(o Options) string {
	if h := readString(o.path("proc/sys/kernel/hostname")); h != "" {
		return h
	}
	if o.host() {
		if h, err := os.Hostname(); err == nil {
			return h
		}
	}
	return ""
}

// osName is os-release's PRETTY_NAME, else NAME VERSION.
func osName(o Options) string {
	f, err := os.Open(o.path("etc/os-release"))
	if err != nil {
		return ""
	}
	defer f.Close()
	kv := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		} else {
			v = strings.Trim(v, `'"`)
		}
		kv[k] = v
	}
	if p := kv["PRETTY_NAME"]; p != "" {
		return p
	}
	return strings.TrimSpace(kv["NAME"] + " " + kv["VERSION"])
}

// architecture is the uname machine name: inferred from /proc/cpuinfo for a
// fixture tree, from the running binary otherwise.
func architecture(o Options) string {
	if !o.host() {
		info := readString(o.path("proc/cpuinfo"))
		switch {
		case strings.Contains(info, "vendor_id"):
			return "x86_64"
		case strings.Contains(info, "CPU implementer"):
			return "aarch64"
		}
	}
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64"
	case "arm64":
		return "aarch64"
	case "ppc64le":
		return "ppc64le"
	}
	return runtime.GOARCH
}

// chassisType names the SMBIOS chassis type code DMI exposes as a number.
func chassisType(code string) string {
	n, err := strconv.Atoi(code)
	if err != nil {
		return code
	}
	switch n {
	case 1:
		return "Other"
	case 2:
		return "Unknown"
	case 3:
		return "Desktop"
	case 4:
		return "Low Profile Desktop"
	case 6:
		return "Mini Tower"
	case 7:
		return "Tower"
	case 9:
		return "Laptop"
	case 10:
		return "Notebook"
	case 17:
		return "Main Server Chassis"
	case 23:
		return "Rack Mount Chassis"
	case 24:
		return "Sealed-case PC"
	case 25:
		return "Multi-system"
	case 28:
		return "Blade"
	case 29:
		return "Blade Enclosure"
	case 35:
		return "Mini PC"
	}
	return code
}

package inventory

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/core/inventory"
)

// collectNICs reads /sys/class/net. Only interfaces backed by a device are
// reported: lo, bridges, bonds, veths and tunnels have no device link and
// come and go, which would churn the nics hash. A VF's own netdev is listed
// under its PF, not as a NIC.
func collectNICs(o Options) []inventory.NIC {
	classNet := o.path("sys/class/net")
	names := listDir(classNet)
	slices.Sort(names)
	nics := []inventory.NIC{}
	for _, name := range names {
		dir := filepath.Join(classNet, name)
		dev := filepath.Join(dir, "device")
		if name == "lo" || !exists(dev) || exists(filepath.Join(dev, "physfn")) {
			continue
		}
		ev := uevent(filepath.Join(dev, "uevent"))
		nic := inventory.NIC{
			Name:       name,
			MAC:        readString(filepath.Join(dir, "address")),
			Driver:     ev["DRIVER"],
			PCIAddress: ev["PCI_SLOT_NAME"],
			VFs:        collectVFs(dev),
		}
		if nic.Driver == "" {
			nic.Driver = linkBase(filepath.Join(dev, "driver"))
		}
		if nic.PCIAddress == "" && ev["PCI_ID"] != "" {
			nic.PCIAddress = linkBase(dev)
		}
		if n, ok := readInt(filepath.Join(dir, "speed")); ok && n > 0 {
			nic.SpeedMbps = int(n) // -1 or EINVAL while the link is down
		}
		if n, ok := readInt(filepath.Join(dev, "numa_node")); ok && n > 0 {
			nic.NUMANode = int(n)
		}
		nic.PermanentMAC = nic.MAC
		if o.host() {
			// The address file is the current MAC, which bonding and
			// udev may have changed; the factory one needs ethtool.
			info := ethtool(name)
			if info.permAddr != "" {
				nic.PermanentMAC = info.permAddr
			}
			nic.Firmware = info.firmware
			if nic.Driver == "" {
				nic.Driver = info.driver
			}
		}
		nics = append(nics, nic)
	}
	return nics
}

// collectVFs lists a PF's SR-IOV virtual functions from its virtfn<N> links.
// A VF's MAC is known only while a host driver has its netdev bound.
func collectVFs(dev string) []inventory.VF {
	var vfs []inventory.VF
	for _, e := range listDir(dev) {
		idx, err := strconv.Atoi(strings.TrimPrefix(e, "virtfn"))
		if err != nil || !strings.HasPrefix(e, "virtfn") {
			continue
		}
		vfDir := filepath.Join(dev, e)
		vf := inventory.VF{Index: idx, PCIAddress: uevent(filepath.Join(vfDir, "uevent"))["PCI_SLOT_NAME"]}
		if vf.PCIAddress == "" {
			vf.PCIAddress = linkBase(vfDir)
		}
		for _, n := range listDir(filepath.Join(vfDir, "net")) {
			vf.MAC = readString(filepath.Join(vfDir, "net", n, "address"))
			break
		}
		vfs = append(vfs, vf)
	}
	slices.SortFunc(vfs, func(a, b inventory.VF) int { return a.Index - b.Index })
	return vfs
}

// linkBase is the last element of a symlink's target, "" when path is not a
// link.
func linkBase(path string) string {
	target, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}

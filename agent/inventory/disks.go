package inventory

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/core/inventory"
)

// skipDisk matches block devices that are not hardware: loop, ram, zram,
// device-mapper, md RAID, optical drives, and the hidden per-path nodes of
// NVMe multipath (nvme0c0n1).
var skipDisk = regexp.MustCompile(`^(loop|ram|zram|dm-|md|sr|fd|nbd)|^nvme\d+c\d+n\d+$`)

// collectDisks reads /sys/block. Sizes are in 512-byte sectors whatever the
// logical block size.
func collectDisks(o Options) []inventory.Disk {
	sysBlock := o.path("sys/block")
	names := listDir(sysBlock)
	slices.Sort(names)
	system := systemDisks(o, names)
	disks := []inventory.Disk{}
	for _, name := range names {
		if skipDisk.MatchString(name) {
			continue
		}
		dir := filepath.Join(sysBlock, name)
		sectors, _ := readInt(filepath.Join(dir, "size"))
		if sectors <= 0 {
			continue // empty card readers, ejected media
		}
		d := inventory.Disk{
			Name:       name,
			SizeBytes:  sectors * 512,
			Model:      strings.Join(strings.Fields(readString(filepath.Join(dir, "device/model"))), " "),
			Serial:     firstNonEmpty(readString(filepath.Join(dir, "device/serial")), readString(filepath.Join(dir, "serial"))),
			WWN:        wwn(firstNonEmpty(readString(filepath.Join(dir, "wwid")), readString(filepath.Join(dir, "device/wwid")))),
			Transport:  transport(dir, name),
			Rotational: readString(filepath.Join(dir, "queue/rotational")) == "1",
			System:     system[name],
		}
		disks = append(disks, d)
	}
	return disks
}

// wwn keeps the kernel's wwid when it is a real world-wide name (naa., eui.,
// uuid.); t10. and nvme. ids are synthesized from vendor, model and serial,
// which the disk reports on its own.
func wwn(wwid string) string {
	w := strings.ToLower(strings.TrimSpace(wwid))
	for _, p := range []string{"naa.", "eui.", "uuid.", "0x"} {
		if strings.HasPrefix(w, p) {
			return w
		}
	}
	return ""
}

// transport derives the bus from the name and the resolved sysfs path.
func transport(dir, name string) string {
	if strings.HasPrefix(name, "nvme") {
		return "nvme"
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		real = dir
	}
	switch {
	case strings.Contains(real, "/usb"):
		return "usb"
	case strings.Contains(real, "/ata"):
		return "sata"
	case strings.Contains(real, "/end_device-") || strings.Contains(real, "/expander-"):
		return "sas"
	case strings.HasPrefix(name, "vd") || strings.Contains(real, "/virtio"):
		return "virtio"
	}
	return ""
}

// systemDisks returns the disks the root filesystem lives on, following
// device-mapper and md layers down through their slaves.
func systemDisks(o Options, disks []string) map[string]bool {
	out := map[string]bool{}
	rootDev := rootDevice(o)
	if rootDev == "" {
		return out
	}
	// Map every disk and partition's major:minor, and partitions to disks.
	byDev := map[string]string{}
	parent := map[string]string{}
	for _, d := range disks {
		dir := o.path("sys/block", d)
		byDev[readString(filepath.Join(dir, "dev"))] = d
		for _, sub := range listDir(dir) {
			if exists(filepath.Join(dir, sub, "partition")) {
				byDev[readString(filepath.Join(dir, sub, "dev"))] = sub
				parent[sub] = d
			}
		}
	}
	var mark func(name string, depth int)
	mark = func(name string, depth int) {
		if depth > 8 {
			return
		}
		if p, ok := parent[name]; ok {
			out[p] = true
			return
		}
		slaves := listDir(o.path("sys/block", name, "slaves"))
		if len(slaves) == 0 {
			out[name] = true
			return
		}
		for _, s := range slaves {
			mark(s, depth+1)
		}
	}
	if name, ok := byDev[rootDev]; ok {
		mark(name, 0)
	}
	return out
}

// rootDevice is the major:minor of the filesystem mounted at /, from
// /proc/self/mountinfo; "" for overlay and other device-less roots.
func rootDevice(o Options) string {
	data, err := os.ReadFile(o.path("proc/self/mountinfo"))
	if err != nil {
		return ""
	}
	dev := ""
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && f[4] == "/" {
			dev = f[2] // the last mount on / is the visible one
		}
	}
	if strings.HasPrefix(dev, "0:") {
		return ""
	}
	return dev
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

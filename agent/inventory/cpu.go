package inventory

import (
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/core/inventory"
)

// collectCPU summarizes /proc/cpuinfo. Topology comes from "physical id" and
// "core id"; where cpuinfo lacks them (arm64) the sysfs topology files are
// used. It also returns the microcode revision for the firmware section.
func collectCPU(o Options) (inventory.CPU, string) {
	var c inventory.CPU
	var microcode string
	sockets := map[string]bool{}
	cores := map[string]bool{}
	var maxMHz float64

	blocks := strings.Split(readString(o.path("proc/cpuinfo")), "\n\n")
	for _, block := range blocks {
		kv := map[string]string{}
		for _, line := range strings.Split(block, "\n") {
			k, v, ok := strings.Cut(line, ":")
			if ok {
				kv[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		}
		cpuID, isCPU := kv["processor"]
		if !isCPU {
			continue
		}
		c.LogicalCPUs++
		if c.Vendor == "" {
			c.Vendor = kv["vendor_id"]
		}
		if c.Model == "" {
			c.Model = kv["model name"]
		}
		if microcode == "" {
			microcode = kv["microcode"]
		}
		pkg, hasPkg := kv["physical id"]
		core, hasCore := kv["core id"]
		if !hasPkg || !hasCore {
			// arm64 and some hypervisors omit them; sysfs has the topology.
			dir := o.path("sys/devices/system/cpu", "cpu"+cpuID, "topology")
			p, ok1 := readInt(dir + "/physical_package_id")
			k, ok2 := readInt(dir + "/core_id")
			switch {
			case ok1 && ok2:
				pkg, core = strconv.FormatInt(p, 10), strconv.FormatInt(k, 10)
			default:
				pkg, core = "0", cpuID // one socket, no SMT as a last resort
			}
		}
		sockets[pkg] = true
		cores[pkg+"/"+core] = true
		if mhz, err := strconv.ParseFloat(kv["cpu MHz"], 64); err == nil && mhz > maxMHz {
			maxMHz = mhz
		}
	}
	if c.LogicalCPUs == 0 {
		return c, microcode
	}
	if c.Model == "" {
		c.Model = armModel(blocks)
	}
	c.Sockets = len(sockets)
	c.CoresPerSocket = len(cores) / c.Sockets
	c.ThreadsPerCore = c.LogicalCPUs / len(cores)
	c.NUMANodes = numaNodes(o)
	// cpuinfo_max_freq is the rated maximum; "cpu MHz" is only the current
	// clock, used when cpufreq is absent (VMs).
	if khz, ok := readInt(o.path("sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")); ok && khz > 0 {
		c.MaxMHz = int(khz / 1000)
	} else {
		c.MaxMHz = int(maxMHz)
	}
	return c, microcode
}

// armModel names an arm64 CPU from its implementer and part, the only model
// data arm64 cpuinfo carries.
func armModel(blocks []string) string {
	for _, block := range blocks {
		var impl, part string
		for _, line := range strings.Split(block, "\n") {
			k, v, _ := strings.Cut(line, ":")
			switch strings.TrimSpace(k) {
			case "CPU implementer":
				impl = strings.TrimSpace(v)
			case "CPU part":
				part = strings.TrimSpace(v)
			}
		}
		if impl != "" {
			return "arm implementer " + impl + " part " + part
		}
	}
	return ""
}

// numaNodes counts /sys/devices/system/node/node<N>; a kernel without NUMA
// has one node.
func numaNodes(o Options) int {
	n := 0
	for _, name := range listDir(o.path("sys/devices/system/node")) {
		if _, err := strconv.Atoi(strings.TrimPrefix(name, "node")); err == nil && strings.HasPrefix(name, "node") {
			n++
		}
	}
	return max(n, 1)
}

// collectMemory reads MemTotal, the memory the kernel manages (a little less
// than what is installed).
func collectMemory(o Options) inventory.Memory {
	var m inventory.Memory
	for _, line := range strings.Split(readString(o.path("proc/meminfo")), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != "MemTotal" {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			break
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			break
		}
		if len(f) > 1 && strings.EqualFold(f[1], "kB") {
			n *= 1024
		}
		m.TotalBytes = n
	}
	return m
}

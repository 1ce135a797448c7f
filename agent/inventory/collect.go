// Package inventory collects the NodeInventory v1 document bcd reports: DMI
// identity, CPUs, memory, disks and NICs from /sys, /proc and /etc, and GPUs
// from NVML (or a simulated or static source).
package inventory

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/core/inventory"
)

// Options configures Collect.
type Options struct {
	// Root is the filesystem root /sys, /proc and /etc are read under; ""
	// means "/". Tests point it at a fixture tree. Host-only probes (the
	// ethtool ioctl, os.Hostname) run only when Root is "/".
	Root string
	// SimulateGPUs, e.g. "8xH100-SXM5-80GB", replaces NVML with simulated
	// GPUs. Ignored when GPUs is set.
	SimulateGPUs string
	// Seed makes simulated GPU UUIDs differ between nodes; "" means the
	// hostname.
	Seed string
	// GPUs is the GPU source; nil means NVML (or SimulateGPUs when set).
	GPUs GPUSource
	// AgentVersion is copied into the document, e.g. "bcd/0.1.0".
	AgentVersion string
	// Now stamps collectedAt; nil means time.Now.
	Now func() time.Time
}

func (o Options) root() string {
	if o.Root == "" {
		return "/"
	}
	return o.Root
}

// host reports whether Collect reads the running machine rather than a
// fixture tree, so that probes which bypass the tree may run.
func (o Options) host() bool { return filepath.Clean(o.root()) == "/" }

func (o Options) path(parts ...string) string {
	return filepath.Join(append([]string{o.root()}, parts...)...)
}

// gpuSource picks the source Collect reads GPUs from.
func (o Options) gpuSource(hostname string) (GPUSource, error) {
	if o.GPUs != nil {
		return o.GPUs, nil
	}
	if o.SimulateGPUs != "" {
		seed := o.Seed
		if seed == "" {
			seed = hostname
		}
		return ParseSimulated(o.SimulateGPUs, seed)
	}
	return NVML{}, nil
}

// Collect gathers the machine's inventory. Files that are missing or
// unreadable (DMI serials as non-root) leave their fields empty; only a
// failing GPU source or an invalid result is an error.
func Collect(ctx context.Context, o Options) (*inventory.NodeInventory, error) {
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	inv := &inventory.NodeInventory{
		Kind:         inventory.Kind,
		Version:      inventory.Version,
		AgentVersion: o.AgentVersion,
	}
	inv.System, inv.Firmware = collectSystem(o)
	cpu, microcode := collectCPU(o)
	inv.CPU = cpu
	if inv.Firmware.CPUMicrocode == "" {
		inv.Firmware.CPUMicrocode = microcode
	}
	if inv.System.Architecture == "" {
		inv.System.Architecture = architecture(o)
	}
	inv.Memory = collectMemory(o)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("inventory: collect: %w", err)
	}
	inv.Disks = collectDisks(o)
	inv.NICs = collectNICs(o)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("inventory: collect: %w", err)
	}

	src, err := o.gpuSource(inv.System.Hostname)
	if err != nil {
		return nil, err
	}
	gpus, err := src.GPUs(ctx)
	if err != nil {
		return nil, fmt.Errorf("inventory: collect GPUs: %w", err)
	}
	if gpus.Devices == nil {
		gpus.Devices = []inventory.GPU{}
	}
	// NVSwitches are PCI functions NVML does not enumerate; a source that
	// knows them (static, tests) wins.
	if len(gpus.NVSwitches) == 0 && len(gpus.Devices) > 0 {
		gpus.NVSwitches = collectNVSwitches(o)
		nvlinkDomains(&gpus, inv.System)
	}
	inv.GPUs = gpus

	inv.CollectedAt = now().UnixMilli()
	if err := inv.Validate(); err != nil {
		return nil, fmt.Errorf("inventory: collected document is invalid: %w", err)
	}
	return inv, nil
}

// Print collects the inventory and writes it as indented JSON.
func Print(ctx context.Context, w io.Writer, o Options) error {
	inv, err := Collect(ctx, o)
	if err != nil {
		return err
	}
	out, err := json.MarshalIndent(inv, "", "  ")
	if err != nil {
		return fmt.Errorf("inventory: encode: %w", err)
	}
	if _, err := w.Write(append(out, '\n')); err != nil {
		return fmt.Errorf("inventory: write: %w", err)
	}
	return nil
}

// readString returns a sysfs/procfs file trimmed, "" when it cannot be read
// (missing, or root-only such as DMI serials).
func readString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// readInt returns a file's integer, ok false when missing or not a number.
func readInt(path string) (int64, bool) {
	n, err := strconv.ParseInt(readString(path), 10, 64)
	return n, err == nil
}

// exists reports whether path exists (a link is followed).
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// uevent parses a sysfs uevent file (KEY=value lines).
func uevent(path string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(readString(path), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}

// listDir returns the entry names of a directory, nil when unreadable.
func listDir(path string) []string {
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

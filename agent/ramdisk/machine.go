package ramdisk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/better-compute/better-compute/agent/inventory"
	coreinv "github.com/better-compute/better-compute/core/inventory"
)

// Host is the machine the ramdisk runs on.
type Host struct {
	// SimulateGPUs, e.g. "8xH100-SXM5-80GB", reports simulated GPUs; ""
	// reports none (the ramdisk has no NVIDIA driver).
	SimulateGPUs string
	// AgentVersion is copied into the inventory.
	AgentVersion string
	// Dev and Sys are where block devices and sysfs are; "" means /dev and
	// /sys.
	Dev, Sys string
}

// noGPUs is the ramdisk's GPU source: it carries no NVIDIA driver, so GPUs
// are the running OS's business once deployed.
type noGPUs struct{}

func (noGPUs) GPUs(context.Context) (coreinv.GPUs, error) {
	return coreinv.GPUs{Devices: []coreinv.GPU{}}, nil
}

// Inventory collects the machine's NodeInventory v1 with agent/inventory.
func (h Host) Inventory(ctx context.Context) (*coreinv.NodeInventory, error) {
	o := inventory.Options{AgentVersion: h.AgentVersion, SimulateGPUs: h.SimulateGPUs}
	if h.SimulateGPUs == "" {
		o.GPUs = noGPUs{}
	}
	return inventory.Collect(ctx, o)
}

// WipeDisks wipes every disk of the inventory (it already left out RAM,
// loop, optical and other virtual block devices) except the one the
// running system lives on.
func (h Host) WipeDisks(ctx context.Context, disks []coreinv.Disk) (string, error) {
	dev, sys := firstNonEmpty(h.Dev, "/dev"), firstNonEmpty(h.Sys, "/sys")
	var done []string
	var errs []error
	for _, d := range disks {
		if err := ctx.Err(); err != nil {
			return strings.Join(done, "; "), fmt.Errorf("wipe: %w", err)
		}
		if d.System {
			continue
		}
		parts, err := wipeDisk(dev, sys, d.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, fmt.Sprintf("%s (%d bytes, %d partitions)", d.Name, d.SizeBytes, parts))
	}
	msg := "wiped " + strings.Join(done, ", ")
	if len(done) == 0 {
		msg = "no disks to wipe"
	}
	return msg, errors.Join(errs...)
}

// PowerOff syncs the disks and powers the machine off.
func (Host) PowerOff(context.Context) error { return powerOff() }

// OpenDisk opens the block device of d (/dev/<name>) for reading and
// writing, exclusively.
func (h Host) OpenDisk(_ context.Context, d coreinv.Disk) (Disk, error) {
	if d.Name == "" || strings.ContainsAny(d.Name, "/.") {
		return nil, fmt.Errorf("open disk: invalid name %q", d.Name)
	}
	disk, err := openBlockDisk(joinDev(firstNonEmpty(h.Dev, "/dev"), d.Name))
	if err != nil {
		return nil, fmt.Errorf("open disk %s: %w", d.Name, err)
	}
	return disk, nil
}

// Reboot syncs the disks and restarts the machine (the firmware then boots
// what its boot device says, the disk after a deploy).
func (Host) Reboot(context.Context) error { return reboot() }

// Simulated is a machine without hardware, for the simulated machines'
// boot hook: its inventory is a file's, wiping touches nothing, its disks
// are files, power off calls OnPowerOff and reboot OnReboot.
type Simulated struct {
	// InventoryFile holds a NodeInventory v1 document; Document, when
	// set, is used instead.
	InventoryFile string
	Document      *coreinv.NodeInventory
	// OnPowerOff runs when the machine is told to power off; nil does
	// nothing.
	OnPowerOff func()
	// DiskFiles maps a disk's name in the inventory (e.g. "nvme0n1") to the
	// file that holds its bytes (the simulated machine's disk, of the
	// disk's size); write-image and write-seed write there. A disk not in
	// the map cannot be opened.
	DiskFiles map[string]string
	// DiskBytesPerSecond, when positive, is how fast the disk files are
	// written, so a test can act while an image is being written.
	DiskBytesPerSecond int64
	// OnReboot runs when the machine is told to reboot (the simulated
	// machine then boots from its disk); nil does nothing.
	OnReboot func()

	mu    sync.Mutex
	wiped []string
}

// Inventory reads and validates the inventory file.
func (s *Simulated) Inventory(context.Context) (*coreinv.NodeInventory, error) {
	if s.Document != nil {
		inv := *s.Document
		if err := inv.Validate(); err != nil {
			return nil, err
		}
		return &inv, nil
	}
	b, err := os.ReadFile(s.InventoryFile)
	if err != nil {
		return nil, err
	}
	var inv coreinv.NodeInventory
	if err := json.Unmarshal(b, &inv); err != nil {
		return nil, fmt.Errorf("%s: %w", s.InventoryFile, err)
	}
	if err := inv.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", s.InventoryFile, err)
	}
	return &inv, nil
}

// WipeDisks records the disks it would wipe.
func (s *Simulated) WipeDisks(_ context.Context, disks []coreinv.Disk) (string, error) {
	var names []string
	for _, d := range disks {
		if !d.System {
			names = append(names, d.Name)
		}
	}
	s.mu.Lock()
	s.wiped = append(s.wiped, names...)
	s.mu.Unlock()
	if len(names) == 0 {
		return "no disks to wipe", nil
	}
	return "wiped " + strings.Join(names, ", ") + " (simulated)", nil
}

// Wiped lists the disks WipeDisks was given so far.
func (s *Simulated) Wiped() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.wiped...)
}

// PowerOff calls OnPowerOff.
func (s *Simulated) PowerOff(context.Context) error {
	if s.OnPowerOff != nil {
		s.OnPowerOff()
	}
	return nil
}

// OpenDisk opens the file DiskFiles names for d.
func (s *Simulated) OpenDisk(_ context.Context, d coreinv.Disk) (Disk, error) {
	p, ok := s.DiskFiles[d.Name]
	if !ok {
		return nil, fmt.Errorf("open disk %s: the simulated machine has no file for it", d.Name)
	}
	disk, err := openFileDisk(p, s.DiskBytesPerSecond)
	if err != nil {
		return nil, fmt.Errorf("open disk %s: %w", d.Name, err)
	}
	return disk, nil
}

// Reboot calls OnReboot.
func (s *Simulated) Reboot(context.Context) error {
	if s.OnReboot != nil {
		s.OnReboot()
	}
	return nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// joinDev is the device node of a block device name.
func joinDev(dev, name string) string { return filepath.Join(dev, name) }

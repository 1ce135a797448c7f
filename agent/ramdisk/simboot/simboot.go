// Package simboot runs the ramdisk on the Redfish emulator's simulated
// machines: a sim.BootHook that, when a machine boots from a CD holding a
// ramdisk ISO, reads that boot's config out of the ISO and runs the ramdisk
// agent in process, with an inventory made from the machine's identity;
// the agent's power-off is the guest's. Lifecycle tests then run the real
// conversation, tokens and all, without booting a kernel.
package simboot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/better-compute/better-compute/agent/ramdisk"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
	coreinv "github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/sim"
)

// Options configures Hook.
type Options struct {
	// Inventory makes a machine's inventory; nil means InventoryFor.
	Inventory func(machines.Info) *coreinv.NodeInventory
	// APIURL, when set, replaces the config's: the ISO names the API as a
	// VM reaches it (10.0.2.2), a simulated machine runs on the host.
	APIURL string
	// Client is the agent's HTTP client (nil: the agent's default).
	Client *http.Client
	// RetryMin, RetryMax and WaitInterval are the agent's (zero: its
	// defaults).
	RetryMin, RetryMax, WaitInterval time.Duration
	// Done, when set, is told how each boot's agent ended.
	Done func(b sim.Boot, err error)
}

// Hook returns the boot hook. A boot from anything but a CD, or a CD that
// is not a ramdisk ISO, does nothing (the machine sits there, as one with
// an empty disk does).
func Hook(o Options) sim.BootHook {
	return func(ctx context.Context, b sim.Boot) {
		err := run(ctx, o, b)
		if o.Done != nil {
			o.Done(b, err)
		}
	}
}

func run(ctx context.Context, o Options, b sim.Boot) error {
	if b.Device != drivers.BootCD || b.MediaPath == "" {
		return nil
	}
	console := b.Machine.Console()
	log := slog.New(slog.NewTextHandler(console, nil)).With("agent", "bcd-ramdisk", "boot", b.Seq)
	cfg, err := image.ISOBootConfig(ctx, b.MediaPath)
	if err != nil {
		log.Error("no ramdisk on the CD", "error", err.Error())
		return err
	}
	if o.APIURL != "" {
		cfg.APIURL = o.APIURL
	}
	info := b.Machine.Info()
	invFor := o.Inventory
	if invFor == nil {
		invFor = InventoryFor
	}
	a := &ramdisk.Agent{
		Config: cfg,
		Machine: &ramdisk.Simulated{
			Document:   invFor(info),
			OnPowerOff: b.PowerOff,
		},
		BootMAC:      strings.ToLower(info.MAC),
		Client:       o.Client,
		Log:          log,
		RetryMin:     o.RetryMin,
		RetryMax:     o.RetryMax,
		WaitInterval: o.WaitInterval,
	}
	log.Info("starting", "api", cfg.APIURL, "purpose", cfg.Purpose, "bootId", cfg.BootID)
	err = a.Run(ctx)
	if err == nil || errors.Is(err, context.Canceled) {
		// Powered off, or the boot ended under it (reset, power off).
		return nil
	}
	// As the real ramdisk does as PID 1: say why, and power off.
	log.Error("ramdisk failed; powering off", "error", err.Error())
	b.PowerOff()
	return fmt.Errorf("simboot: boot %d: %w", b.Seq, err)
}

// InventoryFor is the inventory of a simulated machine: its BMC identity
// (UUID, serial, maker, model) as DMI, its CPUs and memory, its boot NIC,
// and one 960 GB NVMe disk. The hardware key the control plane derives
// from it is the machine's, so a re-join matches.
func InventoryFor(info machines.Info) *coreinv.NodeInventory {
	cpus := max(info.CPUs, 1)
	mem := info.MemoryMiB
	if mem <= 0 {
		mem = 512
	}
	return &coreinv.NodeInventory{
		Kind:         coreinv.Kind,
		Version:      coreinv.Version,
		AgentVersion: "bcd/simulated-ramdisk",
		System: coreinv.System{
			Vendor: info.Manufacturer, Product: info.Model,
			ProductUUID: strings.ToLower(info.UUID), SerialNumber: info.SerialNumber,
			Architecture: "x86_64",
		},
		CPU:    coreinv.CPU{Sockets: 1, CoresPerSocket: cpus, ThreadsPerCore: 1, LogicalCPUs: cpus, NUMANodes: 1},
		Memory: coreinv.Memory{TotalBytes: mem << 20},
		Disks:  []coreinv.Disk{{Name: "nvme0n1", SizeBytes: 960_197_124_096, Transport: "nvme", Serial: info.SerialNumber + "-D0"}},
		NICs:   []coreinv.NIC{{Name: "eth0", MAC: strings.ToLower(info.MAC), Driver: "virtio_net"}},
		GPUs:   coreinv.GPUs{Devices: []coreinv.GPU{}},
	}
}

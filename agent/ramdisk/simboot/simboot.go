// Package simboot runs the ramdisk on the Redfish emulator's simulated
// machines: a sim.BootHook that, when a machine boots from a CD holding a
// ramdisk ISO, reads that boot's config out of the ISO and runs the ramdisk
// agent in process, with an inventory made from the machine's identity;
// the agent's power-off is the guest's. When a machine boots from its disk
// and a deploy left a CIDATA seed there, it runs the installed system's
// first boot (agent/firstboot) in process with the same inventory.
// Lifecycle tests then run the real conversation, tokens and all, without
// booting a kernel.
package simboot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/better-compute/agent/commands"
	"github.com/better-compute/better-compute/agent/firstboot"
	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/ramdisk"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
	"github.com/better-compute/better-compute/agent/session"
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
	// DiskBytesPerSecond, when positive, limits how fast the ramdisk
	// writes the machine's disk, so a test can act during an image write.
	DiskBytesPerSecond int64
	// AgentEndpoint, when set, replaces the seed's agent endpoint on a
	// disk boot, as APIURL replaces its API URL.
	AgentEndpoint string
	// Session runs the installed system's node session once its first
	// boot joined; nil runs the real one (agent/session, commands
	// simulated) until the boot ends.
	Session func(ctx context.Context, b sim.Boot, id join.Identity) error
}

// Hook returns the boot hook. A CD boot runs its ramdisk; a disk boot runs
// the first boot of the system a deploy installed when the disk holds a
// seed; any other boot, a CD that is not a ramdisk ISO or a disk without a
// seed does nothing (the machine sits there, as one with an empty disk
// does).
func Hook(o Options) sim.BootHook {
	return func(ctx context.Context, b sim.Boot) {
		err := run(ctx, o, b)
		if o.Done != nil {
			o.Done(b, err)
		}
	}
}

func run(ctx context.Context, o Options, b sim.Boot) error {
	if b.Device == drivers.BootDisk {
		return diskBoot(ctx, o, b)
	}
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
	inv := inventoryOf(o, b)
	machine := &ramdisk.Simulated{
		Document:   inv,
		OnPowerOff: b.PowerOff,
		// The guest's reboot: the firmware then boots what the boot
		// device says (the disk, once a deploy set it).
		OnReboot:           b.Reboot,
		DiskBytesPerSecond: o.DiskBytesPerSecond,
	}
	if disk, err := b.Machine.Disk(); err == nil && len(inv.Disks) > 0 {
		// The deploy steps write the machine's disk file.
		machine.DiskFiles = map[string]string{inv.Disks[0].Name: disk}
	}
	a := &ramdisk.Agent{
		Config:       cfg,
		Machine:      machine,
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

// inventoryOf is the machine's inventory on every boot, ramdisk and
// installed system alike, so that the hardware key matches: o.Inventory's
// (InventoryFor's by default), its first disk the size of the machine's
// disk file.
func inventoryOf(o Options, b sim.Boot) *coreinv.NodeInventory {
	invFor := o.Inventory
	if invFor == nil {
		invFor = InventoryFor
	}
	inv := invFor(b.Machine.Info())
	if len(inv.Disks) > 0 {
		if p, err := b.Machine.Disk(); err == nil {
			if st, err := os.Stat(p); err == nil {
				inv.Disks = append([]coreinv.Disk(nil), inv.Disks...)
				inv.Disks[0].SizeBytes = st.Size()
			}
		}
	}
	return inv
}

// diskBoot is the installed system's boot: its first boot's join with the
// seed a deploy wrote after the image, then its node session.
func diskBoot(ctx context.Context, o Options, b sim.Boot) error {
	console := b.Machine.Console()
	log := slog.New(slog.NewTextHandler(console, nil)).With("agent", "bcd-firstboot", "boot", b.Seq)
	disk, err := b.Machine.Disk()
	if err != nil {
		log.Error("no disk", "error", err.Error())
		return err
	}
	fsys, closeFS, err := image.SeedFS(disk)
	if errors.Is(err, image.ErrNoSeed) {
		// An empty disk, or an image with no seed: nothing to run.
		return nil
	}
	if err != nil {
		log.Error("cannot read the disk", "error", err.Error())
		return fmt.Errorf("simboot: boot %d: %w", b.Seq, err)
	}
	seed, err := firstboot.ReadSeed(fsys)
	closeFS()
	if err != nil {
		log.Error("bad seed", "error", err.Error())
		return fmt.Errorf("simboot: boot %d: %w", b.Seq, err)
	}
	if o.APIURL != "" {
		seed.Join.APIURL = o.APIURL
	}
	if o.AgentEndpoint != "" {
		seed.Join.AgentEndpoint = o.AgentEndpoint
	}
	// The installed system's state lives beside its disk, as on its own
	// root filesystem: a reboot finds the identity and spends no token.
	stateDir := disk + ".bcd-state"
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return fmt.Errorf("simboot: boot %d: %w", b.Seq, err)
	}
	inv := inventoryOf(o, b)
	runSession := o.Session
	if runSession == nil {
		runSession = func(ctx context.Context, _ sim.Boot, id join.Identity) error {
			return nodeSession(ctx, id, stateDir, inv, log)
		}
	}
	err = firstboot.Run(ctx, firstboot.Options{
		Seed: seed, StateDir: stateDir, HTTPClient: o.Client, Logger: log,
		RetryMin: o.RetryMin, RetryMax: o.RetryMax,
		Inventory: func(context.Context) (*coreinv.NodeInventory, error) { return inv, nil },
		Session:   func(ctx context.Context, id join.Identity) error { return runSession(ctx, b, id) },
	})
	if err == nil || errors.Is(err, context.Canceled) {
		return nil
	}
	// An installed system whose agent stopped stays up: the control
	// plane sees it never re-joined.
	log.Error("first boot failed", "error", err.Error())
	return fmt.Errorf("simboot: boot %d: %w", b.Seq, err)
}

// nodeSession is what `bcd node run` does, in process and simulated.
func nodeSession(ctx context.Context, id join.Identity, stateDir string, inv *coreinv.NodeInventory, log *slog.Logger) error {
	spec, err := nodespec.Open(stateDir)
	if err != nil {
		return err
	}
	exec := &commands.Executor{StateDir: stateDir, CDIDir: filepath.Join(stateDir, "cdi"), Simulate: true, ObservedGeneration: spec.Observed}
	return session.Run(ctx, session.Options{
		Identity: id, StateDir: stateDir, Executor: exec, AgentVersion: inv.AgentVersion, Logger: log, NodeSpec: spec,
		Inventory: func(context.Context) (*coreinv.NodeInventory, error) { return inv, nil },
	})
}

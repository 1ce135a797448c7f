// Package sim is a simulated machine: power, boot override and virtual
// media in memory, and a boot that calls the test's BootHook with what the
// machine booted from. It stands in for a QEMU machine wherever no real boot
// is needed, so tests stay fast.
package sim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines"
)

// Boot is one boot of the machine: the device it booted from and, for a CD,
// the inserted image (its URL and the BMC's local copy).
type Boot struct {
	// Seq counts the machine's boots from 1.
	Seq       int
	Device    drivers.BootDevice
	MediaURL  string
	MediaPath string
	MAC       string
	Machine   *Machine
}

// PowerOff is this boot's guest turning the machine off. It does nothing
// once the boot has ended (a reset or power off since), so a late hook
// cannot turn off a later boot.
func (b Boot) PowerOff() {
	m := b.Machine
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on && len(m.boots) == b.Seq {
		m.offLocked()
	}
}

// Reboot is this boot's guest restarting the machine (reboot inside the
// OS): the firmware boots again from the override or the boot order, as a
// warm reset does. Like PowerOff it does nothing once the boot has ended.
func (b Boot) Reboot() {
	m := b.Machine
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on && len(m.boots) == b.Seq {
		m.endBootLocked()
		m.bootLocked()
	}
}

// BootHook runs each boot's "operating system": it is called in its own
// goroutine when the machine powers on or resets, and its context is
// cancelled when that boot ends (power off, reset, Close). The hook's code
// powers the machine off from inside with Machine.GuestPowerOff.
type BootHook func(ctx context.Context, b Boot)

// Config is a simulated machine's hardware and behaviour.
type Config struct {
	Info machines.Info
	// BootOrder is tried when no override is set (machines.DefaultBootOrder
	// when empty).
	BootOrder []drivers.BootDevice
	Hook      BootHook
	// IgnoreShutdown makes the guest ignore an ACPI shutdown request, as a
	// ramdisk without an ACPI daemon does.
	IgnoreShutdown bool
	// DiskPath is the file holding the machine's disk; "" means one in a
	// temporary directory of the machine's own, removed by Close. It is
	// made, sparse, the first time Disk is asked for it.
	DiskPath string
	// DiskBytes is the disk's size (DefaultDiskBytes when zero).
	DiskBytes int64
}

// DefaultDiskBytes is a simulated machine's disk: a 960 GB NVMe drive's
// size, a sparse file that holds only what was written to it.
const DefaultDiskBytes = 960_197_124_096

// Machine is a simulated machine.
type Machine struct {
	cfg    Config
	serial *machines.Ring

	mu       sync.Mutex
	on       bool
	closed   bool
	override machines.Override
	media    map[string]machines.Media
	boots    []Boot
	nmis     int
	cancel   context.CancelFunc
	running  sync.WaitGroup
	disk     string
	diskDir  string
}

var _ machines.Machine = (*Machine)(nil)
var _ machines.Shutdowner = (*Machine)(nil)
var _ machines.NMIer = (*Machine)(nil)

// New makes a machine, powered off.
func New(cfg Config) *Machine {
	return &Machine{cfg: cfg, serial: machines.NewRing(0), media: map[string]machines.Media{}}
}

// Info is the machine's hardware identity.
func (m *Machine) Info() machines.Info { return m.cfg.Info }

// PowerOn boots the machine unless it is on.
func (m *Machine) PowerOn(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return machines.ErrClosed
	}
	if m.on {
		return nil
	}
	m.on = true
	m.bootLocked()
	return nil
}

// PowerOff cuts the power.
func (m *Machine) PowerOff(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.offLocked()
	return nil
}

// Shutdown asks the guest to shut down; it does unless IgnoreShutdown.
func (m *Machine) Shutdown(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on || m.cfg.IgnoreShutdown {
		return nil
	}
	m.offLocked()
	return nil
}

// NMI counts an interrupt delivered to a running machine.
func (m *Machine) NMI(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on {
		return machines.ErrPoweredOff
	}
	m.nmis++
	return nil
}

// NMIs is how many NMIs the machine took.
func (m *Machine) NMIs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.nmis
}

// GuestPowerOff is the guest turning the machine off (poweroff inside the
// OS). The hook's code calls it; the hook's context is then cancelled.
func (m *Machine) GuestPowerOff() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.offLocked()
}

// Reset ends the running boot and boots again.
func (m *Machine) Reset(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on {
		return machines.ErrPoweredOff
	}
	m.endBootLocked()
	m.bootLocked()
	return nil
}

// PowerState is on or off.
func (m *Machine) PowerState(context.Context) (drivers.PowerState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on {
		return drivers.PowerOn, nil
	}
	return drivers.PowerOff, nil
}

// SetBootOverride sets or clears the override.
func (m *Machine) SetBootOverride(_ context.Context, target drivers.BootDevice, persistent bool) error {
	o, err := machines.NewOverride(target, persistent)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.override = o
	return nil
}

// BootOverride is the override in force.
func (m *Machine) BootOverride(context.Context) (machines.Override, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.override, nil
}

// InsertMedia fills the drive of the media's kind.
func (m *Machine) InsertMedia(_ context.Context, media machines.Media) error {
	if media.Kind != machines.MediaCD && media.Kind != machines.MediaUSB {
		return fmt.Errorf("media kind %q: %w", media.Kind, machines.ErrUnsupported)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.media[media.Kind] = media
	return nil
}

// EjectMedia empties the drive of that kind.
func (m *Machine) EjectMedia(_ context.Context, kind string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.media, kind)
	return nil
}

// Media is the image in the drive of that kind, if any.
func (m *Machine) Media(kind string) (machines.Media, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	media, ok := m.media[kind]
	return media, ok
}

// Boots is every boot so far, oldest first.
func (m *Machine) Boots() []Boot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Boot(nil), m.boots...)
}

// Console is the serial console the hook's code writes to.
func (m *Machine) Console() *machines.Ring { return m.serial }

// SerialLog is what the guest wrote to its console.
func (m *Machine) SerialLog() []byte { return m.serial.Bytes() }

// Disk is the file holding the machine's disk, made sparse (of
// Config.DiskBytes) when it does not exist yet.
func (m *Machine) Disk() (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.disk != "" {
		return m.disk, nil
	}
	if m.closed {
		return "", machines.ErrClosed
	}
	p := m.cfg.DiskPath
	if p == "" {
		dir, err := os.MkdirTemp("", "sim-machine-")
		if err != nil {
			return "", fmt.Errorf("sim: disk: %w", err)
		}
		m.diskDir, p = dir, filepath.Join(dir, "disk.raw")
	}
	size := m.cfg.DiskBytes
	if size <= 0 {
		size = DefaultDiskBytes
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return "", fmt.Errorf("sim: disk: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() == 0 {
		if err := f.Truncate(size); err != nil {
			return "", fmt.Errorf("sim: disk: %w", err)
		}
	}
	m.disk = p
	return p, nil
}

// Close powers off, waits for the running hook to return, and removes a
// disk file the machine made in a directory of its own.
func (m *Machine) Close() error {
	m.mu.Lock()
	m.offLocked()
	m.closed = true
	m.mu.Unlock()
	m.running.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.diskDir != "" {
		dir := m.diskDir
		m.diskDir = ""
		return os.RemoveAll(dir)
	}
	return nil
}

func (m *Machine) offLocked() {
	m.on = false
	m.endBootLocked()
}

func (m *Machine) endBootLocked() {
	if m.cancel != nil {
		m.cancel()
		m.cancel = nil
	}
}

func (m *Machine) bootLocked() {
	cd, cdInserted := m.media[machines.MediaCD]
	dev, consumed := machines.ChooseBoot(m.override, m.cfg.BootOrder, cdInserted)
	if consumed {
		m.override = machines.Override{}
	}
	b := Boot{Seq: len(m.boots) + 1, Device: dev, MAC: m.cfg.Info.MAC, Machine: m}
	if dev == drivers.BootCD {
		b.MediaURL, b.MediaPath = cd.URL, cd.Path
	}
	m.boots = append(m.boots, b)
	fmt.Fprintf(m.serial, "sim: boot %d from %s\n", b.Seq, dev)
	if m.cfg.Hook == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.running.Add(1)
	go func() {
		defer m.running.Done()
		defer cancel()
		m.cfg.Hook(ctx, b)
	}()
}

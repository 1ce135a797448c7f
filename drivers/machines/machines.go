// Package machines is the machine behind an emulated BMC: what the Redfish
// emulator drives when a client powers a system on, overrides its boot
// device or inserts virtual media. Two kinds implement it: simulated machines
// (package sim, state in memory, for fast tests) and QEMU TCG virtual
// machines (package qemu) that really boot.
package machines

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/better-compute/better-compute/drivers"
)

// Info is the machine's fixed hardware identity, what a BMC reports about
// its system before the machine boots.
type Info struct {
	UUID         string
	SerialNumber string
	Manufacturer string
	Model        string
	// MAC is the boot NIC's address (lower-case, colon-separated).
	MAC       string
	CPUs      int
	MemoryMiB int64
}

// Media kinds, as the BMC's virtual media slots name them.
const (
	MediaCD  = "cd"
	MediaUSB = "usb"
)

// Media is an image inserted as virtual media: the URL the BMC was given
// and the local copy it fetched from there.
type Media struct {
	Kind string
	URL  string
	Path string
}

// Override is a boot source override. A zero Target means none: the machine
// boots from its boot order.
type Override struct {
	Target     drivers.BootDevice
	Persistent bool
}

// Machine is what a BMC controls. Every method is safe for concurrent use.
type Machine interface {
	Info() Info
	// PowerOn starts the machine; it boots from the override (once) or its
	// boot order. A machine that is on stays on.
	PowerOn(ctx context.Context) error
	// PowerOff removes power at once, without asking the guest.
	PowerOff(ctx context.Context) error
	// Reset is a warm reset of a running machine (ErrPoweredOff when off).
	Reset(ctx context.Context) error
	PowerState(ctx context.Context) (drivers.PowerState, error)
	// SetBootOverride sets the next boot device; persistent keeps it for
	// every boot, otherwise it is cleared once used. A zero target clears.
	SetBootOverride(ctx context.Context, target drivers.BootDevice, persistent bool) error
	BootOverride(ctx context.Context) (Override, error)
	// InsertMedia puts an image (already fetched to Media.Path) in the
	// machine's virtual drive of that kind; EjectMedia empties it.
	InsertMedia(ctx context.Context, m Media) error
	EjectMedia(ctx context.Context, kind string) error
	// SerialLog is the serial console's output, its most recent bytes.
	SerialLog() []byte
	// Close powers the machine off and releases what it holds.
	Close() error
}

// Shutdowner is a machine that can ask its guest to shut down (an ACPI
// power button press); the guest may ignore it.
type Shutdowner interface {
	Shutdown(ctx context.Context) error
}

// NMIer is a machine that can take a non-maskable interrupt.
type NMIer interface {
	NMI(ctx context.Context) error
}

// Errors machines return.
var (
	ErrPoweredOff  = errors.New("the machine is powered off")
	ErrUnsupported = errors.New("the machine does not support this")
	ErrClosed      = errors.New("the machine is closed")
)

// DefaultBootOrder is a server's usual order: its disk, then the network.
var DefaultBootOrder = []drivers.BootDevice{drivers.BootDisk, drivers.BootPXE}

// NewOverride is the override a Redfish PATCH of Boot sets: target "" clears
// it; a device the firmware does not know is ErrUnsupported.
func NewOverride(target drivers.BootDevice, persistent bool) (Override, error) {
	switch target {
	case "", drivers.BootPXE, drivers.BootCD, drivers.BootDisk, drivers.BootBIOS:
		return Override{Target: target, Persistent: persistent && target != ""}, nil
	}
	return Override{}, fmt.Errorf("boot device %q: %w", target, ErrUnsupported)
}

// ChooseBoot is the firmware's choice of boot device: the override's target
// when one is set, else the first entry of the order. A CD without media is
// skipped, as firmware falls through an empty drive. It reports whether a
// one-time override was consumed.
func ChooseBoot(ov Override, order []drivers.BootDevice, cdInserted bool) (dev drivers.BootDevice, consumedOnce bool) {
	if ov.Target != "" {
		consumedOnce = !ov.Persistent
		if ov.Target != drivers.BootCD || cdInserted {
			return ov.Target, consumedOnce
		}
	}
	if len(order) == 0 {
		order = DefaultBootOrder
	}
	for _, d := range order {
		if d == drivers.BootCD && !cdInserted {
			continue
		}
		return d, consumedOnce
	}
	return drivers.BootDisk, consumedOnce
}

// Ring keeps the last Size bytes written to it: a serial console's buffer.
type Ring struct {
	mu    sync.Mutex
	size  int
	buf   []byte
	total int64
}

// NewRing makes a ring of size bytes (1 MiB when size <= 0).
func NewRing(size int) *Ring {
	if size <= 0 {
		size = 1 << 20
	}
	return &Ring{size: size}
}

// Write appends p, dropping the oldest bytes past the ring's size.
func (r *Ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = append(r.buf, p...)
	r.total += int64(len(p))
	if over := len(r.buf) - r.size; over > 0 {
		r.buf = append(r.buf[:0], r.buf[over:]...)
	}
	return len(p), nil
}

// Bytes is a copy of what the ring holds.
func (r *Ring) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte(nil), r.buf...)
}

// Written is how many bytes were ever written, dropped ones included.
func (r *Ring) Written() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

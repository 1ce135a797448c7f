package drivers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
)

// Driver is a named driver. It implements the concern interfaces it can;
// Endpoint says which of a machine's endpoints it speaks to (nil when the
// machine has none for its protocol).
type Driver interface {
	Name() string
	Endpoint(m Machine) *Endpoint
}

// Limits bound how hard the site agent drives BMCs. BMCs serve few
// sessions and fall over under parallel calls, and a site's management
// network is shared, so both bounds hold calls back (they queue, in
// arrival order per BMC) rather than fail them.
type Limits struct {
	// PerBMC is how many calls may be in flight to one BMC address at once
	// (default 1).
	PerBMC int
	// PerSite is how many calls may be in flight across a site (default 16).
	PerSite int
}

// Registry resolves a machine's concern to the driver that serves it,
// bounds the calls in flight, and fails over between a machine's two
// protocols. The site agent holds one; it is safe for concurrent use.
type Registry struct {
	drivers []Driver // in failover order
	limits  Limits
	log     *slog.Logger

	mu   sync.Mutex
	bmc  map[string]chan struct{}
	site map[string]chan struct{}
}

// NewRegistry is a registry of drivers, tried in the order given when a
// machine's bindings leave a concern unbound.
func NewRegistry(limits Limits, log *slog.Logger, drivers ...Driver) *Registry {
	if limits.PerBMC <= 0 {
		limits.PerBMC = 1
	}
	if limits.PerSite <= 0 {
		limits.PerSite = 16
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registry{drivers: drivers, limits: limits, log: log,
		bmc: map[string]chan struct{}{}, site: map[string]chan struct{}{}}
}

// Driver is the registered driver of that name, or nil.
func (r *Registry) Driver(name string) Driver {
	for _, d := range r.drivers {
		if d.Name() == name {
			return d
		}
	}
	return nil
}

// candidates are the drivers that may serve c for m, the bound one first.
// A binding to a driver that cannot serve the machine is ErrUnsupported:
// the operator chose it, so no other driver silently stands in.
func candidates[D any](r *Registry, m Machine, c Concern) ([]Driver, error) {
	serves := func(d Driver) bool {
		_, ok := d.(D)
		return ok && d.Endpoint(m) != nil
	}
	var out []Driver
	if name := m.Bindings[c]; name != "" {
		d := r.Driver(name)
		if d == nil {
			return nil, wrapf(ErrUnsupported, "%s is bound to %q, which this site does not have", c, name)
		}
		if !serves(d) {
			return nil, wrapf(ErrUnsupported, "%s is bound to %s, which has no endpoint or does not serve it", c, name)
		}
		out = append(out, d)
	}
	for _, d := range r.drivers {
		if d.Name() != m.Bindings[c] && serves(d) {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, wrapf(ErrUnsupported, "no driver serves %s for node %s", c, m.NodeID)
	}
	return out, nil
}

// slot takes a slot of the semaphore key names in m, making it on first use.
func (r *Registry) slot(ctx context.Context, sems map[string]chan struct{}, key string, n int) (func(), error) {
	r.mu.Lock()
	s, ok := sems[key]
	if !ok {
		s = make(chan struct{}, n)
		sems[key] = s
	}
	r.mu.Unlock()
	select {
	case s <- struct{}{}:
		return func() { <-s }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a BMC call slot: %w", ctx.Err())
	}
}

// hold takes the machine's BMC slot, then the site's. The BMC's first: a
// call queued behind a busy BMC must not hold a site slot that calls to
// idle BMCs could use.
func (r *Registry) hold(ctx context.Context, d Driver, m Machine) (func(), error) {
	release, err := r.slot(ctx, r.bmc, d.Name()+" "+d.Endpoint(m).Address, r.limits.PerBMC)
	if err != nil {
		return nil, err
	}
	releaseSite, err := r.slot(ctx, r.site, m.SiteID, r.limits.PerSite)
	if err != nil {
		release()
		return nil, err
	}
	return func() { releaseSite(); release() }, nil
}

// call runs op on the first driver that serves c for m, failing over to
// the next on an availability error (never on ErrAuth or ErrNotApplied:
// another protocol would not fix a refused credential, and a second write
// to a BMC that ignores writes hides the fault). It answers which driver
// served.
func call[D any, T any](ctx context.Context, r *Registry, m Machine, c Concern, op func(context.Context, D) (T, error)) (T, string, error) {
	var zero T
	ds, err := candidates[D](r, m, c)
	if err != nil {
		return zero, "", err
	}
	var errs []error
	for i, d := range ds {
		v, err := func() (T, error) {
			release, err := r.hold(ctx, d, m)
			if err != nil {
				return zero, err
			}
			defer release()
			return op(ctx, d.(D))
		}()
		if err == nil {
			if i > 0 {
				r.log.InfoContext(ctx, "BMC call failed over", "node", m.NodeID, "concern", c, "served", d.Name(), "errors", errors.Join(errs...).Error())
			}
			return v, d.Name(), nil
		}
		err = fmt.Errorf("%s: %w", d.Name(), err)
		errs = append(errs, err)
		if !Unavailable(err) || ctx.Err() != nil {
			break
		}
		if i+1 < len(ds) {
			r.log.WarnContext(ctx, "BMC unavailable, failing over", "node", m.NodeID, "concern", c, "driver", d.Name(), "next", ds[i+1].Name(), "error", err.Error())
		}
	}
	return zero, "", errors.Join(errs...)
}

// PowerState reads the machine's power state.
func (r *Registry) PowerState(ctx context.Context, m Machine) (PowerState, string, error) {
	return call(ctx, r, m, ConcernPower, func(ctx context.Context, d PowerDriver) (PowerState, error) { return d.PowerState(ctx, m) })
}

// SetPower applies a and answers the state read back.
func (r *Registry) SetPower(ctx context.Context, m Machine, a PowerAction) (PowerState, string, error) {
	return call(ctx, r, m, ConcernPower, func(ctx context.Context, d PowerDriver) (PowerState, error) { return d.SetPower(ctx, m, a) })
}

// Verify opens a session with the credentials and reads the BMC.
func (r *Registry) Verify(ctx context.Context, m Machine) (BMCInfo, string, error) {
	return call(ctx, r, m, ConcernManagement, func(ctx context.Context, d ManagementDriver) (BMCInfo, error) { return d.Verify(ctx, m) })
}

// SetBootDevice sets the next boot device.
func (r *Registry) SetBootDevice(ctx context.Context, m Machine, dev BootDevice, persistent bool) (string, error) {
	_, served, err := call(ctx, r, m, ConcernBoot, func(ctx context.Context, d BootDriver) (struct{}, error) {
		return struct{}{}, d.SetBootDevice(ctx, m, dev, persistent)
	})
	return served, err
}

// InsertMedia inserts virtual media.
func (r *Registry) InsertMedia(ctx context.Context, m Machine, media Media) (string, error) {
	_, served, err := call(ctx, r, m, ConcernVirtualMedia, func(ctx context.Context, d VirtualMediaDriver) (struct{}, error) {
		return struct{}{}, d.InsertMedia(ctx, m, media)
	})
	return served, err
}

// EjectMedia ejects virtual media.
func (r *Registry) EjectMedia(ctx context.Context, m Machine) (string, error) {
	_, served, err := call(ctx, r, m, ConcernVirtualMedia, func(ctx context.Context, d VirtualMediaDriver) (struct{}, error) {
		return struct{}{}, d.EjectMedia(ctx, m)
	})
	return served, err
}

// Inspect reads the hardware out of band.
func (r *Registry) Inspect(ctx context.Context, m Machine) (HardwareSummary, string, error) {
	return call(ctx, r, m, ConcernInspect, func(ctx context.Context, d InspectDriver) (HardwareSummary, error) { return d.Inspect(ctx, m) })
}

// ConsoleLog reads the tail of the serial console.
func (r *Registry) ConsoleLog(ctx context.Context, m Machine, maxBytes int) ([]byte, string, error) {
	return call(ctx, r, m, ConcernConsole, func(ctx context.Context, d ConsoleDriver) ([]byte, error) { return d.ConsoleLog(ctx, m, maxBytes) })
}

// ResetBIOS resets BIOS settings to their defaults.
func (r *Registry) ResetBIOS(ctx context.Context, m Machine) (string, error) {
	_, served, err := call(ctx, r, m, ConcernBIOS, func(ctx context.Context, d BIOSDriver) (struct{}, error) {
		return struct{}{}, d.ResetBIOS(ctx, m)
	})
	return served, err
}

// Firmware lists firmware versions.
func (r *Registry) Firmware(ctx context.Context, m Machine) ([]FirmwareComponent, string, error) {
	return call(ctx, r, m, ConcernFirmware, func(ctx context.Context, d FirmwareDriver) ([]FirmwareComponent, error) { return d.Firmware(ctx, m) })
}

// Serves lists the concerns d implements, in Concerns order.
func Serves(d any) []Concern {
	var out []Concern
	for _, c := range Concerns {
		var ok bool
		switch c {
		case ConcernPower:
			_, ok = d.(PowerDriver)
		case ConcernManagement:
			_, ok = d.(ManagementDriver)
		case ConcernBoot:
			_, ok = d.(BootDriver)
		case ConcernVirtualMedia:
			_, ok = d.(VirtualMediaDriver)
		case ConcernInspect:
			_, ok = d.(InspectDriver)
		case ConcernConsole:
			_, ok = d.(ConsoleDriver)
		case ConcernBIOS:
			_, ok = d.(BIOSDriver)
		case ConcernFirmware:
			_, ok = d.(FirmwareDriver)
		}
		if ok {
			out = append(out, c)
		}
	}
	return out
}

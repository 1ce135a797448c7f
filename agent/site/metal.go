package site

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/workflows/metal"
)

// BMC is what the metal activities call: every concern the site serves,
// resolved per machine from its bindings (with read-back, failover and
// the per-BMC and per-site limits) by drivers.Registry. Each call also
// answers the name of the driver that served it.
type BMC interface {
	PowerState(ctx context.Context, m drivers.Machine) (drivers.PowerState, string, error)
	SetPower(ctx context.Context, m drivers.Machine, a drivers.PowerAction) (drivers.PowerState, string, error)
	Verify(ctx context.Context, m drivers.Machine) (drivers.BMCInfo, string, error)
	SetBootDevice(ctx context.Context, m drivers.Machine, d drivers.BootDevice, persistent bool) (string, error)
	InsertMedia(ctx context.Context, m drivers.Machine, media drivers.Media) (string, error)
	EjectMedia(ctx context.Context, m drivers.Machine) (string, error)
	Inspect(ctx context.Context, m drivers.Machine) (drivers.HardwareSummary, string, error)
	ConsoleLog(ctx context.Context, m drivers.Machine, maxBytes int) ([]byte, string, error)
	ResetBIOS(ctx context.Context, m drivers.Machine) (string, error)
}

var _ BMC = (*drivers.Registry)(nil)

// The ways a ramdisk boot starts (metal.BootRequest.Via).
const (
	ViaVirtualMedia = "virtual-media"
	ViaPXE          = "pxe"
)

// heartbeatEvery is how often a long activity heartbeats, so that the
// workflow's cancellation reaches it within a heartbeat timeout.
const heartbeatEvery = 5 * time.Second

// maxConsoleBytes bounds ConsoleLog's answer (it lands in a history).
const maxConsoleBytes = 256 << 10

// term is one lease term: the site, the fencing epoch, and a context that
// ends when the term does, so calls in flight stop with it.
type term struct {
	siteID string
	epoch  int64
	ctx    context.Context
	a      *agent
}

func (t *term) auth() protocol.SiteAuth { return protocol.SiteAuth{Token: t.a.o.Token, Epoch: t.epoch} }

// post calls a site endpoint under this term's epoch.
func (t *term) post(ctx context.Context, path string, body, out any) error {
	return t.a.post(ctx, path, body, out)
}

// metalActivities implements metal.SiteActivities for one lease term.
type metalActivities struct {
	t    *term
	bmc  BMC
	boot *bootServer
}

var _ metal.SiteActivities = (*metalActivities)(nil)

// call runs f under a context that also ends with the lease term, while
// heartbeating, after fetching the machine's credentials; it fails with a
// lease-lost error when the term ended before or during the call.
func (s *metalActivities) call(ctx context.Context, ref metal.MachineRef, f func(context.Context, drivers.Machine) error) error {
	ctx, done, err := s.enter(ctx, ref)
	if err != nil {
		return err
	}
	defer done()
	if activity.IsActivity(ctx) {
		go heartbeat(ctx)
	}
	if s.bmc == nil {
		return temporal.NewNonRetryableApplicationError("this site agent has no BMC drivers", metal.ErrTypeUnsupported, nil)
	}
	m, err := s.machine(ctx, ref)
	if err == nil {
		err = f(ctx, m)
	}
	if s.t.ctx.Err() != nil {
		return leaseLost()
	}
	return err
}

// enter checks that the machine is of this agent's site and that the
// term goes on, and answers a context that also ends with the term.
func (s *metalActivities) enter(ctx context.Context, ref metal.MachineRef) (context.Context, func(), error) {
	if ref.SiteID != "" && ref.SiteID != s.t.siteID {
		return nil, nil, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("this agent serves site %s, not %s", s.t.siteID, ref.SiteID), "WrongSite", nil)
	}
	if s.t.ctx.Err() != nil {
		return nil, nil, leaseLost()
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.t.ctx, cancel)
	return ctx, func() { stop(); cancel() }, nil
}

func heartbeat(ctx context.Context) {
	tk := time.NewTicker(heartbeatEvery)
	defer tk.Stop()
	for {
		activity.RecordHeartbeat(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
	}
}

func leaseLost() error {
	return temporal.NewApplicationError("this site agent no longer holds the site lease", metal.ErrTypeLeaseLost)
}

// machine fetches the node's BMC credentials just before use: they live
// in memory for this call only.
func (s *metalActivities) machine(ctx context.Context, ref metal.MachineRef) (drivers.Machine, error) {
	var got protocol.SiteBMCCredentialsResult
	err := s.t.post(ctx, protocol.SiteBMCCredentialsPath,
		protocol.SiteBMCCredentialsRequest{SiteAuth: s.t.auth(), NodeID: ref.NodeID}, &got)
	if err != nil {
		return drivers.Machine{}, apiError("fetch the BMC credentials", err)
	}
	if got.Redfish == nil && got.IPMI == nil {
		return drivers.Machine{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("node %s has no BMC endpoint", ref.NodeID), metal.ErrTypeNotFound, nil)
	}
	m := drivers.Machine{NodeID: ref.NodeID, SiteID: s.t.siteID, Redfish: endpoint(got.Redfish), IPMI: endpoint(got.IPMI)}
	if len(ref.Bindings) > 0 {
		m.Bindings = make(map[drivers.Concern]string, len(ref.Bindings))
		for c, d := range ref.Bindings {
			m.Bindings[drivers.Concern(c)] = d
		}
	}
	return m, nil
}

func endpoint(c *protocol.BMCCredentials) *drivers.Endpoint {
	if c == nil {
		return nil
	}
	return &drivers.Endpoint{Address: c.Address, Username: c.Username, Password: drivers.Secret(c.Password),
		CAPEM: c.CAPEM, InsecureSkipVerify: c.InsecureSkipVerify}
}

// apiError maps the API's refusal of a site call: a lease lost (CONFLICT
// with reason leaseLost) or a refused token means this agent does not
// serve the site any more; an unknown node or boot, or another conflict
// (a boot's token minted already, by an agent that lost the site since),
// will not change by retrying.
func apiError(what string, err error) error {
	var e *core.Error
	if errors.As(err, &e) {
		switch {
		case e.Code == core.CodeConflict && e.Details["reason"] != nil && e.Details["reason"] != "leaseLost":
			return temporal.NewNonRetryableApplicationError(what+": "+e.Message, string(e.Code), nil)
		}
		switch e.Code {
		case core.CodeConflict, core.CodeUnauthn, core.CodeAccessDenied:
			return temporal.NewApplicationError(what+": "+e.Message, metal.ErrTypeLeaseLost)
		case core.CodeNotFound:
			return temporal.NewNonRetryableApplicationError(what+": "+e.Message, metal.ErrTypeNotFound, nil)
		case core.CodeInvalidInput, core.CodeInvalidState:
			return temporal.NewNonRetryableApplicationError(what+": "+e.Message, string(e.Code), nil)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// bmcError maps a driver's error to an application error of a stable
// type; the message is the driver's reason (drivers redact secrets).
func bmcError(what string, err error) error {
	if err == nil {
		return nil
	}
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		return err
	}
	msg := what + ": " + err.Error()
	switch {
	case errors.Is(err, drivers.ErrAuth):
		return temporal.NewNonRetryableApplicationError(msg, metal.ErrTypeBMCAuth, nil)
	case errors.Is(err, drivers.ErrUnsupported):
		return temporal.NewNonRetryableApplicationError(msg, metal.ErrTypeUnsupported, nil)
	case errors.Is(err, drivers.ErrNotApplied):
		return temporal.NewNonRetryableApplicationError(msg, metal.ErrTypeNotApplied, nil)
	case errors.Is(err, drivers.ErrUnreachable):
		return temporal.NewApplicationError(msg, metal.ErrTypeBMCUnreachable)
	}
	return temporal.NewApplicationError(msg, metal.ErrTypeBMCUnreachable)
}

// boundTo names the driver bound to concern c for m, or the first
// protocol with an endpoint (the registry's order) when none is bound.
func boundTo(m drivers.Machine, c drivers.Concern) string {
	if d := m.Bindings[c]; d != "" {
		return d
	}
	if m.Redfish != nil {
		return drivers.DriverRedfish
	}
	return drivers.DriverIPMI
}

// VerifyBMC checks that the BMC answers with the stored credentials.
func (s *metalActivities) VerifyBMC(ctx context.Context, ref metal.MachineRef) (metal.BMCStatus, error) {
	var out metal.BMCStatus
	err := s.call(ctx, ref, func(ctx context.Context, m drivers.Machine) error {
		info, served, err := s.bmc.Verify(ctx, m)
		if err != nil {
			return bmcError("verify the BMC", err)
		}
		out = metal.BMCStatus{Driver: served, Manufacturer: info.Manufacturer, Model: info.Model,
			Firmware: info.Firmware, Power: string(info.Power)}
		return nil
	})
	return out, err
}

// Power changes the power (read back by the driver) or, for "status",
// only reads it.
func (s *metalActivities) Power(ctx context.Context, r metal.PowerRequest) (metal.PowerResult, error) {
	var out metal.PowerResult
	switch drivers.PowerAction(r.Action) {
	case drivers.ActionOn, drivers.ActionOff, drivers.ActionCycle, drivers.ActionReset, "status":
	default:
		return out, temporal.NewNonRetryableApplicationError(fmt.Sprintf("unknown power action %q", r.Action),
			string(core.CodeInvalidInput), nil)
	}
	err := s.call(ctx, r.Machine, func(ctx context.Context, m drivers.Machine) error {
		var (
			ps     drivers.PowerState
			served string
			err    error
		)
		if r.Action == "status" {
			ps, served, err = s.bmc.PowerState(ctx, m)
		} else {
			ps, served, err = s.bmc.SetPower(ctx, m, drivers.PowerAction(r.Action))
		}
		if err != nil {
			return bmcError("power "+r.Action, err)
		}
		out = metal.PowerResult{Power: string(ps), Driver: served}
		return nil
	})
	return out, err
}

// InspectOOB reads the hardware summary out of band, when a bound driver
// can.
func (s *metalActivities) InspectOOB(ctx context.Context, ref metal.MachineRef) (metal.InspectOOBResult, error) {
	var out metal.InspectOOBResult
	err := s.call(ctx, ref, func(ctx context.Context, m drivers.Machine) error {
		hw, _, err := s.bmc.Inspect(ctx, m)
		if errors.Is(err, drivers.ErrUnsupported) {
			return nil
		}
		if err != nil {
			return bmcError("inspect out of band", err)
		}
		out = metal.InspectOOBResult{Supported: true, Manufacturer: hw.Manufacturer, Model: hw.Model,
			SerialNumber: hw.SerialNumber, UUID: hw.UUID, MACs: hw.MACs}
		return nil
	})
	return out, err
}

// BootRamdisk boots the machine into the ramdisk for one boot: it mints
// the boot's token (once: a retry reuses the registered boot), serves the
// boot's pieces, points the machine at them (virtual media, or PXE by its
// MAC), and powers it on, or resets it when it is on.
func (s *metalActivities) BootRamdisk(ctx context.Context, r metal.BootRequest) (metal.BootResult, error) {
	var out metal.BootResult
	if r.BootID == "" {
		return out, temporal.NewNonRetryableApplicationError("a boot needs its boot id", string(core.CodeInvalidInput), nil)
	}
	err := s.call(ctx, r.Machine, func(ctx context.Context, m drivers.Machine) error {
		via, err := chooseVia(r, m)
		if err != nil {
			return err
		}
		b, err := s.register(ctx, r, via)
		if err != nil {
			return err
		}
		switch via {
		case ViaVirtualMedia:
			if _, err := s.bmc.InsertMedia(ctx, m, drivers.Media{URL: s.boot.isoURL(b.id), Kind: "cd"}); err != nil {
				return bmcError("insert the ramdisk's virtual media", err)
			}
			if _, err := s.bmc.SetBootDevice(ctx, m, drivers.BootCD, false); err != nil {
				return bmcError("set the boot device to cd once", err)
			}
		case ViaPXE:
			if _, err := s.bmc.SetBootDevice(ctx, m, drivers.BootPXE, false); err != nil {
				return bmcError("set the boot device to pxe once", err)
			}
		}
		ps, _, err := s.bmc.PowerState(ctx, m)
		if err != nil {
			return bmcError("read the power state", err)
		}
		action := drivers.ActionOn
		if ps == drivers.PowerOn {
			action = drivers.ActionReset
		}
		if ps, _, err = s.bmc.SetPower(ctx, m, action); err != nil {
			return bmcError("power "+string(action), err)
		}
		out = metal.BootResult{Via: via, Power: string(ps)}
		return nil
	})
	return out, err
}

// chooseVia is the request's way, or virtual media where a Redfish
// endpoint can serve it and PXE otherwise.
func chooseVia(r metal.BootRequest, m drivers.Machine) (string, error) {
	via := r.Via
	if via == "" {
		via = ViaPXE
		if m.Redfish != nil && boundTo(m, drivers.ConcernVirtualMedia) == drivers.DriverRedfish {
			via = ViaVirtualMedia
		}
	}
	switch via {
	case ViaVirtualMedia:
		return via, nil
	case ViaPXE:
		if r.Machine.BootMAC == "" {
			return "", temporal.NewNonRetryableApplicationError(
				"a PXE boot needs the node's boot MAC (metal.confirmMac)", metal.ErrTypeUnsupported, nil)
		}
		return via, nil
	}
	return "", temporal.NewNonRetryableApplicationError(fmt.Sprintf("unknown boot way %q", via),
		string(core.CodeInvalidInput), nil)
}

// register serves the boot's pieces, minting its token unless this term
// already did for the boot.
func (s *metalActivities) register(ctx context.Context, r metal.BootRequest, via string) (*boot, error) {
	if s.boot == nil || !s.boot.canBoot() {
		return nil, temporal.NewNonRetryableApplicationError(
			"this site agent serves no ramdisk (bcd site --boot-listen, --kernel, --ramdisk)", metal.ErrTypeUnsupported, nil)
	}
	if b := s.boot.lookup(r.BootID); b != nil && b.nodeID == r.Machine.NodeID {
		if b.via == via && b.mac == normalizeMAC(r.Machine.BootMAC) {
			return b, nil
		}
		// A retry another way: the same token, other pieces.
		spec := b.bootSpec
		spec.via, spec.mac = via, r.Machine.BootMAC
		nb, err := s.boot.register(ctx, s.t, spec)
		if err != nil {
			return nil, fmt.Errorf("serve boot %s: %w", r.BootID, err)
		}
		return nb, nil
	}
	var tok protocol.SiteBootTokenResult
	if err := s.t.post(ctx, protocol.SiteBootTokenPath, protocol.SiteBootTokenRequest{SiteAuth: s.t.auth(), BootID: r.BootID},
		&tok); err != nil {
		return nil, apiError("mint the boot token", err)
	}
	if tok.NodeID != "" && tok.NodeID != r.Machine.NodeID {
		return nil, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("boot %s is not node %s's", r.BootID, r.Machine.NodeID), metal.ErrTypeNotFound, nil)
	}
	purpose := tok.Purpose
	if purpose == "" {
		purpose = r.Purpose
	}
	spec := bootSpec{id: r.BootID, nodeID: r.Machine.NodeID, mac: r.Machine.BootMAC,
		via: via, cfg: protocol.RamdiskBootConfig{Token: tok.Token, BootID: r.BootID, Purpose: purpose}}
	if tok.ExpiresAt > 0 {
		spec.expires = time.UnixMilli(tok.ExpiresAt)
	}
	b, err := s.boot.register(ctx, s.t, spec)
	if err != nil {
		return nil, fmt.Errorf("serve boot %s: %w", r.BootID, err)
	}
	return b, nil
}

// EndBoot ejects the media, stops serving the boot's pieces, and powers
// the machine off when asked.
func (s *metalActivities) EndBoot(ctx context.Context, r metal.EndBootRequest) error {
	return s.call(ctx, r.Machine, func(ctx context.Context, m drivers.Machine) error {
		if m.Redfish != nil || m.Bindings[drivers.ConcernVirtualMedia] != "" {
			if _, err := s.bmc.EjectMedia(ctx, m); err != nil && !errors.Is(err, drivers.ErrUnsupported) {
				return bmcError("eject the virtual media", err)
			}
		}
		if s.boot != nil {
			s.boot.unregister(r.BootID)
		}
		if r.PowerOff {
			if _, _, err := s.bmc.SetPower(ctx, m, drivers.ActionOff); err != nil {
				return bmcError("power off", err)
			}
		}
		return nil
	})
}

// ResetBIOS resets BIOS settings to their defaults, when a bound driver
// can.
func (s *metalActivities) ResetBIOS(ctx context.Context, ref metal.MachineRef) (metal.ResetBIOSResult, error) {
	var out metal.ResetBIOSResult
	err := s.call(ctx, ref, func(ctx context.Context, m drivers.Machine) error {
		_, err := s.bmc.ResetBIOS(ctx, m)
		if errors.Is(err, drivers.ErrUnsupported) {
			return nil
		}
		if err != nil {
			return bmcError("reset the BIOS settings", err)
		}
		out.Supported = true
		return nil
	})
	return out, err
}

// ConsoleLog is the tail of the machine's serial console.
func (s *metalActivities) ConsoleLog(ctx context.Context, r metal.ConsoleLogRequest) ([]byte, error) {
	n := r.MaxBytes
	if n <= 0 || n > maxConsoleBytes {
		n = maxConsoleBytes
	}
	var out []byte
	err := s.call(ctx, r.Machine, func(ctx context.Context, m drivers.Machine) error {
		b, _, err := s.bmc.ConsoleLog(ctx, m, n)
		if err != nil {
			return bmcError("read the console", err)
		}
		if len(b) > n {
			b = b[len(b)-n:]
		}
		out = b
		return nil
	})
	return out, err
}

// bootDevices are the devices a provisioning step may set.
var bootDevices = map[string]drivers.BootDevice{"disk": drivers.BootDisk, "pxe": drivers.BootPXE, "cd": drivers.BootCD}

// SetBootDevice sets the machine's boot device through the driver bound to
// its boot concern, which returns only once a read of the BMC shows the
// device (where the BMC reports it).
func (s *metalActivities) SetBootDevice(ctx context.Context, r metal.BootDeviceRequest) (metal.BootDeviceResult, error) {
	var out metal.BootDeviceResult
	dev, ok := bootDevices[r.Device]
	if !ok {
		return out, temporal.NewNonRetryableApplicationError(fmt.Sprintf("unknown boot device %q (disk, pxe or cd)", r.Device),
			string(core.CodeInvalidInput), nil)
	}
	err := s.call(ctx, r.Machine, func(ctx context.Context, m drivers.Machine) error {
		served, err := s.bmc.SetBootDevice(ctx, m, dev, r.Persistent)
		if err != nil {
			return bmcError("set the boot device to "+r.Device, err)
		}
		out = metal.BootDeviceResult{Device: r.Device, Persistent: r.Persistent, Driver: served}
		return nil
	})
	return out, err
}

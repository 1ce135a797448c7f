// Package bmc implements the drivers over bmclib: "redfish/v1" (bmclib's
// gofish provider over HTTPS) and "ipmi/v1" (bmclib's ipmitool provider,
// Debian's ipmitool binary). Each call opens a session, does its work and
// reads every write back, and closes the session; the drivers.Registry
// around them bounds the calls in flight and fails over between the two.
package bmc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"time"

	bmclib "github.com/bmc-toolbox/bmclib/v2"
	"github.com/bmc-toolbox/bmclib/v2/providers/ipmitool"

	"github.com/better-compute/better-compute/drivers"
)

// IPMIOptions configure the IPMI driver. The zero value takes defaults.
type IPMIOptions struct {
	Policy drivers.Policy
	// ConnectTimeout bounds the probe that tells an absent BMC from a
	// slow one (default 2s): ipmitool itself retries for about a minute
	// before it gives up on an address that never answers.
	ConnectTimeout time.Duration
	// CallTimeout bounds one ipmitool command (default 30s).
	CallTimeout time.Duration
	// IpmitoolPath is the ipmitool binary ("" finds it on PATH).
	IpmitoolPath string
	// CipherSuite forces one RMCP+ cipher suite; "" tries 3, then 17, as
	// bmclib does.
	CipherSuite string
}

// IPMI is the "ipmi/v1" driver.
type IPMI struct {
	o IPMIOptions
}

// NewIPMI is the IPMI driver.
func NewIPMI(o IPMIOptions) *IPMI {
	o.Policy = o.Policy.WithDefaults()
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 2 * time.Second
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 30 * time.Second
	}
	return &IPMI{o: o}
}

// Name implements drivers.Driver.
func (*IPMI) Name() string { return drivers.DriverIPMI }

// Endpoint implements drivers.Driver.
func (*IPMI) Endpoint(m drivers.Machine) *drivers.Endpoint { return m.IPMI }

// ipmiSession is one call's bmclib client over one endpoint.
type ipmiSession struct {
	d          *IPMI
	ep         drivers.Endpoint
	host, port string
	c          *bmclib.Client
}

func splitIPMI(addr string) (string, string) {
	if host, port, err := net.SplitHostPort(addr); err == nil {
		return host, port
	}
	return strings.Trim(addr, "[]"), "623"
}

// open probes the BMC, then opens bmclib's ipmitool provider (which runs
// one power status with the credentials).
func (d *IPMI) open(ctx context.Context, m drivers.Machine) (*ipmiSession, error) {
	if m.IPMI == nil {
		return nil, fmt.Errorf("%w: node %s has no IPMI endpoint", drivers.ErrUnsupported, m.NodeID)
	}
	ep := *m.IPMI
	host, port := splitIPMI(ep.Address)
	if err := probeIPMI(ctx, net.JoinHostPort(host, port), d.o.ConnectTimeout); err != nil {
		return nil, err
	}
	c := bmclib.NewClient(host, ep.Username, ep.Password.Reveal(),
		bmclib.WithIpmitoolPort(port), bmclib.WithIpmitoolPath(d.o.IpmitoolPath),
		bmclib.WithIpmitoolCipherSuite(d.o.CipherSuite), bmclib.WithPerProviderTimeout(d.o.CallTimeout))
	c.Registry.Drivers = c.Registry.For(ipmitool.ProviderName)
	if len(c.Registry.Drivers) == 0 {
		return nil, fmt.Errorf("%w: the ipmitool binary is not installed on this site agent", drivers.ErrUnsupported)
	}
	s := &ipmiSession{d: d, ep: ep, host: host, port: port, c: c}
	if _, err := drivers.Retry(ctx, d.o.Policy, func() (struct{}, error) {
		return struct{}{}, s.classify(ctx, c.Open(ctx))
	}); err != nil {
		return nil, fmt.Errorf("opening an IPMI session with %s: %w", ep.Address, err)
	}
	return s, nil
}

func (s *ipmiSession) close(ctx context.Context) { _ = s.c.Close(ctx) }

// classify maps ipmitool's failures onto the drivers' errors. The probe
// has already seen the BMC answer, so a session it will not establish is
// a refused credential (ipmitool says only "Unable to establish IPMI v2 /
// RMCP+ session" for a wrong password or user).
func (s *ipmiSession) classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	msg := strings.Join(strings.Fields(err.Error()), " ")
	switch {
	case ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: no answer from %s within %s", drivers.ErrUnreachable, s.ep.Address, s.d.o.CallTimeout)
	case strings.Contains(msg, "Unable to establish IPMI v2 / RMCP+ session"),
		strings.Contains(msg, "RAKP"), strings.Contains(msg, "Insufficient privilege"):
		return fmt.Errorf("%w: %s: %s", drivers.ErrAuth, s.ep.Address, msg)
	case strings.Contains(msg, "Node busy"), strings.Contains(msg, "Timeout"):
		return fmt.Errorf("%w: %s: %s", drivers.ErrTransient, s.ep.Address, msg)
	}
	return fmt.Errorf("%s: %s", s.ep.Address, msg)
}

func (s *ipmiSession) power(ctx context.Context) (drivers.PowerState, error) {
	return drivers.Retry(ctx, s.d.o.Policy, func() (drivers.PowerState, error) {
		out, err := s.c.GetPowerState(ctx)
		if err != nil {
			return drivers.PowerUnknown, s.classify(ctx, err)
		}
		return drivers.NormalisePower(out), nil
	})
}

func (s *ipmiSession) setPower(ctx context.Context, state string, want drivers.PowerState) error {
	return drivers.WriteAndReadBack(ctx, s.d.o.Policy, "power "+state,
		func() error {
			_, err := s.c.SetPowerState(ctx, state)
			return s.classify(ctx, err)
		},
		func() (bool, string, error) {
			p, err := s.power(ctx)
			return p == want, string(p), err
		})
}

// ipmitool runs Debian's ipmitool for what bmclib's provider does not
// read (the boot flags, the BMC's identity). The password travels in the
// environment (-E), never on the command line.
func (s *ipmiSession) ipmitool(ctx context.Context, args ...string) (string, error) {
	path := s.d.o.IpmitoolPath
	if path == "" {
		var err error
		if path, err = exec.LookPath("ipmitool"); err != nil {
			return "", fmt.Errorf("%w: the ipmitool binary is not installed on this site agent", drivers.ErrUnsupported)
		}
	}
	ciphers := []string{"3", "17"}
	if s.d.o.CipherSuite != "" {
		ciphers = []string{s.d.o.CipherSuite}
	}
	var out []byte
	var err error
	for _, cs := range ciphers {
		cctx, cancel := context.WithTimeout(ctx, s.d.o.CallTimeout)
		cmd := exec.CommandContext(cctx, path, append([]string{"-I", "lanplus", "-U", s.ep.Username, "-E", "-N", "5",
			"-H", s.host, "-p", s.port, "-C", cs}, args...)...)
		cmd.Env = []string{"IPMITOOL_PASSWORD=" + s.ep.Password.Reveal()}
		out, err = cmd.CombinedOutput()
		cerr := cctx.Err()
		cancel()
		if err == nil {
			return string(out), nil
		}
		if cerr != nil {
			err = cerr
			break
		}
	}
	return string(out), s.classify(ctx, fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out))))
}

// field is the value of "Key : value" in ipmitool's output.
func field(out, key string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(strings.TrimLeft(k, " -")) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// PowerState implements drivers.PowerDriver.
func (d *IPMI) PowerState(ctx context.Context, m drivers.Machine) (drivers.PowerState, error) {
	s, err := d.open(ctx, m)
	if err != nil {
		return drivers.PowerUnknown, err
	}
	defer s.close(ctx)
	p, err := s.power(ctx)
	return p, err
}

// SetPower implements drivers.PowerDriver. fakebmc, like some real BMCs,
// has no power cycle, and a cycle nobody can see is no proof, so a cycle
// is off then on, each read back; a reset of a machine that is off powers
// it on.
func (d *IPMI) SetPower(ctx context.Context, m drivers.Machine, a drivers.PowerAction) (drivers.PowerState, error) {
	s, err := d.open(ctx, m)
	if err != nil {
		return drivers.PowerUnknown, err
	}
	defer s.close(ctx)
	switch a {
	case drivers.ActionOn:
		err = s.setPower(ctx, "on", drivers.PowerOn)
	case drivers.ActionOff:
		err = s.setPower(ctx, "off", drivers.PowerOff)
	case drivers.ActionCycle:
		if err = s.setPower(ctx, "off", drivers.PowerOff); err == nil {
			err = s.setPower(ctx, "on", drivers.PowerOn)
		}
	case drivers.ActionReset:
		var p drivers.PowerState
		if p, err = s.power(ctx); err == nil {
			if p == drivers.PowerOn {
				err = s.setPower(ctx, "reset", drivers.PowerOn)
			} else {
				err = s.setPower(ctx, "on", drivers.PowerOn)
			}
		}
	default:
		return drivers.PowerUnknown, fmt.Errorf("unknown power action %q", a)
	}
	if err != nil {
		return drivers.PowerUnknown, err
	}
	p, err := s.power(ctx)
	return p, err
}

// Verify implements drivers.ManagementDriver: a session with the
// credentials, the power state, and the BMC's identity from "mc info".
func (d *IPMI) Verify(ctx context.Context, m drivers.Machine) (drivers.BMCInfo, error) {
	s, err := d.open(ctx, m)
	if err != nil {
		return drivers.BMCInfo{}, err
	}
	defer s.close(ctx)
	p, err := s.power(ctx)
	if err != nil {
		return drivers.BMCInfo{}, err
	}
	info := drivers.BMCInfo{Driver: d.Name(), Power: p}
	out, err := drivers.Retry(ctx, d.o.Policy, func() (string, error) { return s.ipmitool(ctx, "mc", "info") })
	if err != nil {
		return drivers.BMCInfo{}, fmt.Errorf("reading the BMC's identity: %w", err)
	}
	info.Manufacturer = field(out, "Manufacturer Name")
	info.Model = field(out, "Product Name")
	info.Firmware = field(out, "Firmware Revision")
	return info, nil
}

// ipmiBootDevices are ipmitool's names of the boot devices, and what
// "chassis bootparam get 5" prints for each (its Boot Device Selector).
var ipmiBootDevices = map[drivers.BootDevice]struct{ set, selector string }{
	drivers.BootPXE:  {"pxe", "Force PXE"},
	drivers.BootDisk: {"disk", "Force Boot from default Hard-Drive"},
	drivers.BootCD:   {"cdrom", "Force Boot from CD/DVD"},
	drivers.BootBIOS: {"bios", "Force Boot into BIOS Setup"},
}

// SetBootDevice implements drivers.BootDriver, reading the device back
// from the boot flags (parameter 5). Whether the flags persist is not read
// back: fakebmc, like many BMCs, reports every override as one-time.
func (d *IPMI) SetBootDevice(ctx context.Context, m drivers.Machine, dev drivers.BootDevice, persistent bool) error {
	names, ok := ipmiBootDevices[dev]
	if !ok {
		return fmt.Errorf("unknown boot device %q", dev)
	}
	s, err := d.open(ctx, m)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	return drivers.WriteAndReadBack(ctx, d.o.Policy, "boot device "+string(dev),
		func() error {
			_, err := s.c.SetBootDevice(ctx, names.set, persistent, false)
			return s.classify(ctx, err)
		},
		func() (bool, string, error) {
			out, err := s.ipmitool(ctx, "chassis", "bootparam", "get", "5")
			if err != nil {
				return false, "", err
			}
			sel := field(out, "Boot Device Selector")
			return sel == names.selector, sel, nil
		})
}

package bmc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	bmclib "github.com/bmc-toolbox/bmclib/v2"
	bmcpkg "github.com/bmc-toolbox/bmclib/v2/bmc"
	"github.com/bmc-toolbox/bmclib/v2/providers/redfish"
	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/common"
	rf "github.com/stmcginnis/gofish/redfish"

	"github.com/better-compute/better-compute/drivers"
)

// RedfishOptions configure the Redfish driver. The zero value takes
// defaults.
type RedfishOptions struct {
	Policy drivers.Policy
	// ConnectTimeout bounds the TCP connect and the TLS handshake
	// (default 3s), so that an absent BMC reports fast.
	ConnectTimeout time.Duration
	// CallTimeout bounds one request (default 30s).
	CallTimeout time.Duration
	// BasicAuth authenticates each request instead of opening a session
	// (for BMCs whose session service is broken).
	BasicAuth bool
}

// Redfish is the "redfish/v1" driver: bmclib's gofish provider for what
// bmclib does (power, boot override, virtual media, BIOS reset), gofish
// itself for the reads bmclib has no call for (virtual media state, the
// system's identity, the host console log, the firmware inventory).
type Redfish struct {
	o RedfishOptions
}

// NewRedfish is the Redfish driver.
func NewRedfish(o RedfishOptions) *Redfish {
	o.Policy = o.Policy.WithDefaults()
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 3 * time.Second
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 30 * time.Second
	}
	return &Redfish{o: o}
}

// Name implements drivers.Driver.
func (*Redfish) Name() string { return drivers.DriverRedfish }

// Endpoint implements drivers.Driver.
func (*Redfish) Endpoint(m drivers.Machine) *drivers.Endpoint { return m.Redfish }

// rfSession is one call's bmclib client, and a gofish client for reads,
// opened on first use.
type rfSession struct {
	d    *Redfish
	ep   drivers.Endpoint
	base string // scheme://host:port
	c    *bmclib.Client
	gc   *gofish.APIClient
}

func (d *Redfish) httpClient(ep drivers.Endpoint) (*http.Client, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: ep.InsecureSkipVerify} //nolint:gosec // an operator's choice at enrollment
	if ep.CAPEM != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(ep.CAPEM)) {
			return nil, errors.New("the endpoint's CA certificate is not PEM")
		}
		tc.RootCAs = pool
	}
	dialer := &net.Dialer{Timeout: d.o.ConnectTimeout}
	return &http.Client{Timeout: d.o.CallTimeout, Transport: &http.Transport{
		DialContext: dialer.DialContext, TLSClientConfig: tc, TLSHandshakeTimeout: d.o.ConnectTimeout,
		ResponseHeaderTimeout: d.o.CallTimeout, MaxIdleConnsPerHost: 1, IdleConnTimeout: 30 * time.Second,
	}}, nil
}

func (d *Redfish) open(ctx context.Context, m drivers.Machine) (*rfSession, error) {
	if m.Redfish == nil {
		return nil, fmt.Errorf("%w: node %s has no Redfish endpoint", drivers.ErrUnsupported, m.NodeID)
	}
	ep := *m.Redfish
	u, err := url.Parse(ep.Address)
	if err != nil || u.Hostname() == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("the Redfish address %q is not an https URL", ep.Address)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[u.Scheme]
	}
	host := u.Scheme + "://" + u.Hostname()
	if strings.Contains(u.Hostname(), ":") {
		host = u.Scheme + "://[" + u.Hostname() + "]"
	}
	hc, err := d.httpClient(ep)
	if err != nil {
		return nil, err
	}
	c := bmclib.NewClient(host, ep.Username, ep.Password.Reveal(), bmclib.WithHTTPClient(hc),
		bmclib.WithRedfishPort(port), bmclib.WithRedfishUseBasicAuth(d.o.BasicAuth),
		bmclib.WithPerProviderTimeout(d.o.CallTimeout))
	c.Registry.Drivers = c.Registry.For(redfish.ProviderName)
	s := &rfSession{d: d, ep: ep, base: host + ":" + port, c: c}
	if _, err := drivers.Retry(ctx, d.o.Policy, func() (struct{}, error) {
		return struct{}{}, s.classify(ctx, c.Open(ctx))
	}); err != nil {
		return nil, fmt.Errorf("opening a Redfish session with %s: %w", ep.Address, err)
	}
	return s, nil
}

func (s *rfSession) close(ctx context.Context) {
	_ = s.c.Close(ctx)
	if s.gc != nil {
		s.gc.Logout()
	}
}

// gofish is a gofish client over basic auth: a second session per call
// would count against a BMC's few.
func (s *rfSession) gofish(ctx context.Context) (*gofish.APIClient, error) {
	if s.gc != nil {
		return s.gc, nil
	}
	hc, err := s.d.httpClient(s.ep)
	if err != nil {
		return nil, err
	}
	gc, err := drivers.Retry(ctx, s.d.o.Policy, func() (*gofish.APIClient, error) {
		gc, err := gofish.ConnectContext(ctx, gofish.ClientConfig{Endpoint: s.base, Username: s.ep.Username,
			Password: s.ep.Password.Reveal(), HTTPClient: hc, BasicAuth: true})
		return gc, s.classify(ctx, err)
	})
	if err != nil {
		return nil, err
	}
	s.gc = gc
	return gc, nil
}

// system is the machine's ComputerSystem (the first one: a BMC of ours
// controls one machine).
func (s *rfSession) system(ctx context.Context) (*rf.ComputerSystem, error) {
	gc, err := s.gofish(ctx)
	if err != nil {
		return nil, err
	}
	return drivers.Retry(ctx, s.d.o.Policy, func() (*rf.ComputerSystem, error) {
		systems, err := gc.Service.Systems()
		if err != nil {
			return nil, s.classify(ctx, err)
		}
		if len(systems) == 0 {
			return nil, errors.New("the BMC lists no system")
		}
		return systems[0], nil
	})
}

func (s *rfSession) manager(ctx context.Context) (*rf.Manager, error) {
	gc, err := s.gofish(ctx)
	if err != nil {
		return nil, err
	}
	return drivers.Retry(ctx, s.d.o.Policy, func() (*rf.Manager, error) {
		ms, err := gc.Service.Managers()
		if err != nil {
			return nil, s.classify(ctx, err)
		}
		if len(ms) == 0 {
			return nil, errors.New("the BMC lists no manager")
		}
		return ms[0], nil
	})
}

// classify maps HTTP and transport failures onto the drivers' errors,
// keeping the BMC's own message.
func (s *rfSession) classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	msg := strings.Join(strings.Fields(err.Error()), " ")
	status := 0
	var ce *common.Error
	if errors.As(err, &ce) {
		status = ce.HTTPReturnedStatusCode
	}
	for _, code := range []int{401, 403, 429, 500, 502, 503, 504} {
		if status == 0 && (strings.HasPrefix(msg, fmt.Sprint(code)+":") || strings.Contains(msg, " "+fmt.Sprint(code)+":")) {
			status = code
		}
	}
	var opErr *net.OpError
	var netErr net.Error
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return fmt.Errorf("%w: %s: %s", drivers.ErrAuth, s.ep.Address, msg)
	case status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests ||
		status == http.StatusBadGateway || status == http.StatusGatewayTimeout:
		return fmt.Errorf("%w: %s: %s", drivers.ErrTransient, s.ep.Address, msg)
	case errors.As(err, &opErr) && opErr.Op == "dial", errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH), strings.Contains(msg, "connection refused"),
		strings.Contains(msg, "no route to host"), strings.Contains(msg, "dial tcp"):
		return fmt.Errorf("%w: %s: %s", drivers.ErrUnreachable, s.ep.Address, msg)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", s.ep.Address, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.As(err, &netErr) && netErr.Timeout(), strings.Contains(msg, "EOF"),
		strings.Contains(msg, "connection reset"), strings.Contains(msg, "Client.Timeout"):
		return fmt.Errorf("%w: %s: %s", drivers.ErrTransient, s.ep.Address, msg)
	}
	return fmt.Errorf("%s: %s", s.ep.Address, msg)
}

func (s *rfSession) power(ctx context.Context) (drivers.PowerState, error) {
	return drivers.Retry(ctx, s.d.o.Policy, func() (drivers.PowerState, error) {
		out, err := s.c.GetPowerState(ctx)
		if err != nil {
			return drivers.PowerUnknown, s.classify(ctx, err)
		}
		return drivers.NormalisePower(out), nil
	})
}

func (s *rfSession) setPower(ctx context.Context, state string, want drivers.PowerState) error {
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

// PowerState implements drivers.PowerDriver.
func (d *Redfish) PowerState(ctx context.Context, m drivers.Machine) (drivers.PowerState, error) {
	s, err := d.open(ctx, m)
	if err != nil {
		return drivers.PowerUnknown, err
	}
	defer s.close(ctx)
	return s.power(ctx)
}

// SetPower implements drivers.PowerDriver. A cycle is off then on, each
// read back (a PowerCycle reset would show nothing to read back); a reset
// of a machine that is off powers it on.
func (d *Redfish) SetPower(ctx context.Context, m drivers.Machine, a drivers.PowerAction) (drivers.PowerState, error) {
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
	return s.power(ctx)
}

// Verify implements drivers.ManagementDriver: a session with the
// credentials, the power state, the system's maker and model and the
// manager's firmware.
func (d *Redfish) Verify(ctx context.Context, m drivers.Machine) (drivers.BMCInfo, error) {
	s, err := d.open(ctx, m)
	if err != nil {
		return drivers.BMCInfo{}, err
	}
	defer s.close(ctx)
	p, err := s.power(ctx)
	if err != nil {
		return drivers.BMCInfo{}, err
	}
	sys, err := s.system(ctx)
	if err != nil {
		return drivers.BMCInfo{}, err
	}
	info := drivers.BMCInfo{Driver: d.Name(), Power: p, Manufacturer: sys.Manufacturer, Model: sys.Model}
	if mgr, err := s.manager(ctx); err == nil {
		info.Firmware = mgr.FirmwareVersion
	}
	return info, nil
}

// rfBootDevices are bmclib's names of the boot devices.
var rfBootDevices = map[drivers.BootDevice]bmcpkg.BootDeviceType{
	drivers.BootPXE: bmcpkg.BootDeviceTypePXE, drivers.BootCD: bmcpkg.BootDeviceTypeCDROM,
	drivers.BootDisk: bmcpkg.BootDeviceTypeDisk, drivers.BootBIOS: bmcpkg.BootDeviceTypeBIOS,
}

// SetBootDevice implements drivers.BootDriver, reading back the system's
// BootSourceOverrideTarget and whether it persists.
func (d *Redfish) SetBootDevice(ctx context.Context, m drivers.Machine, dev drivers.BootDevice, persistent bool) error {
	want, ok := rfBootDevices[dev]
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
			_, err := s.c.SetBootDevice(ctx, string(want), persistent, false)
			return s.classify(ctx, err)
		},
		func() (bool, string, error) {
			ov, err := drivers.Retry(ctx, d.o.Policy, func() (bmcpkg.BootDeviceOverride, error) {
				ov, err := s.c.GetBootDeviceOverride(ctx)
				return ov, s.classify(ctx, err)
			})
			if err != nil {
				return false, "", err
			}
			return ov.Device == want && ov.IsPersistent == persistent, fmt.Sprintf("%s persistent=%t", ov.Device, ov.IsPersistent), nil
		})
}

// rfMediaKinds are bmclib's names of the media kinds, and the Redfish
// media type a slot lists for each.
var rfMediaKinds = map[string]struct {
	bmclib string
	typ    rf.VirtualMediaType
}{
	"cd":  {"CD", rf.CDMediaType},
	"usb": {"USBStick", rf.USBStickMediaType},
}

// slots reads the virtual media slots (the manager's, else the system's).
func (s *rfSession) slots(ctx context.Context) ([]*rf.VirtualMedia, error) {
	mgr, err := s.manager(ctx)
	if err != nil {
		return nil, err
	}
	return drivers.Retry(ctx, s.d.o.Policy, func() ([]*rf.VirtualMedia, error) {
		vm, err := mgr.VirtualMedia()
		if err == nil && len(vm) == 0 {
			var sys *rf.ComputerSystem
			if sys, err = s.system(ctx); err == nil {
				vm, err = sys.VirtualMedia()
			}
		}
		return vm, s.classify(ctx, err)
	})
}

// InsertMedia implements drivers.VirtualMediaDriver, reading back that a
// slot of the kind holds the image.
func (d *Redfish) InsertMedia(ctx context.Context, m drivers.Machine, media drivers.Media) error {
	kind := media.Kind
	if kind == "" {
		kind = "cd"
	}
	k, ok := rfMediaKinds[kind]
	if !ok {
		return fmt.Errorf("unknown media kind %q", media.Kind)
	}
	s, err := d.open(ctx, m)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	return drivers.WriteAndReadBack(ctx, d.o.Policy, "insert "+kind+" media",
		func() error {
			_, err := s.c.SetVirtualMedia(ctx, k.bmclib, media.URL)
			return s.classify(ctx, err)
		},
		func() (bool, string, error) {
			slots, err := s.slots(ctx)
			if err != nil {
				return false, "", err
			}
			var seen []string
			for _, v := range slots {
				if hasType(v, k.typ) {
					if v.Inserted && v.Image == media.URL {
						return true, "", nil
					}
					seen = append(seen, fmt.Sprintf("%s inserted=%t image=%q", v.ID, v.Inserted, v.Image))
				}
			}
			return false, strings.Join(seen, "; "), nil
		})
}

func hasType(v *rf.VirtualMedia, t rf.VirtualMediaType) bool {
	for _, mt := range v.MediaTypes {
		if mt == t {
			return true
		}
	}
	return false
}

// EjectMedia implements drivers.VirtualMediaDriver: every kind that holds
// media is ejected, and read back empty.
func (d *Redfish) EjectMedia(ctx context.Context, m drivers.Machine) error {
	s, err := d.open(ctx, m)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	for _, kind := range []string{"cd", "usb"} {
		k := rfMediaKinds[kind]
		inserted := func() (bool, string, error) {
			slots, err := s.slots(ctx)
			if err != nil {
				return false, "", err
			}
			for _, v := range slots {
				if hasType(v, k.typ) && v.Inserted {
					return false, fmt.Sprintf("%s holds %q", v.ID, v.Image), nil
				}
			}
			return true, "", nil
		}
		empty, _, err := inserted()
		if err != nil {
			return err
		}
		if empty {
			continue
		}
		if err := drivers.WriteAndReadBack(ctx, d.o.Policy, "eject "+kind+" media",
			func() error {
				_, err := s.c.SetVirtualMedia(ctx, k.bmclib, "")
				return s.classify(ctx, err)
			}, inserted); err != nil {
			return err
		}
	}
	return nil
}

// Inspect implements drivers.InspectDriver from the System resource and
// its Ethernet interfaces.
func (d *Redfish) Inspect(ctx context.Context, m drivers.Machine) (drivers.HardwareSummary, error) {
	s, err := d.open(ctx, m)
	if err != nil {
		return drivers.HardwareSummary{}, err
	}
	defer s.close(ctx)
	sys, err := s.system(ctx)
	if err != nil {
		return drivers.HardwareSummary{}, err
	}
	h := drivers.HardwareSummary{Manufacturer: sys.Manufacturer, Model: sys.Model, SerialNumber: sys.SerialNumber,
		UUID: strings.ToLower(sys.UUID), CPUs: sys.ProcessorSummary.Count, MemoryMiB: int64(sys.MemorySummary.TotalSystemMemoryGiB * 1024)}
	nics, err := drivers.Retry(ctx, d.o.Policy, func() ([]*rf.EthernetInterface, error) {
		nics, err := sys.EthernetInterfaces()
		return nics, s.classify(ctx, err)
	})
	if err != nil {
		return drivers.HardwareSummary{}, fmt.Errorf("reading the Ethernet interfaces: %w", err)
	}
	for _, n := range nics {
		mac := n.MACAddress
		if mac == "" {
			mac = n.PermanentMACAddress
		}
		if mac != "" {
			h.MACs = append(h.MACs, strings.ToLower(mac))
		}
	}
	return h, nil
}

// ConsoleLog implements drivers.ConsoleDriver from the system's host
// logger log service (OpenBMC's HostLogger: the serial console, a line an
// entry). A BMC without one answers ErrUnsupported.
func (d *Redfish) ConsoleLog(ctx context.Context, m drivers.Machine, maxBytes int) ([]byte, error) {
	s, err := d.open(ctx, m)
	if err != nil {
		return nil, err
	}
	defer s.close(ctx)
	sys, err := s.system(ctx)
	if err != nil {
		return nil, err
	}
	logs, err := drivers.Retry(ctx, d.o.Policy, func() ([]*rf.LogService, error) {
		l, err := sys.LogServices()
		return l, s.classify(ctx, err)
	})
	if err != nil {
		return nil, err
	}
	for _, l := range logs {
		if l.ID != "HostLogger" {
			continue
		}
		// The collection may carry its entries whole (OpenBMC's does);
		// otherwise each member is read.
		var coll struct {
			Members []struct {
				ODataID string `json:"@odata.id"`
				Message *string
			}
		}
		if err := s.getJSON(ctx, l.ODataID+"/Entries", &coll); err != nil {
			return nil, fmt.Errorf("reading the host console log: %w", err)
		}
		var b strings.Builder
		for _, e := range coll.Members {
			if e.Message == nil {
				var entry struct{ Message string }
				if err := s.getJSON(ctx, e.ODataID, &entry); err != nil {
					return nil, fmt.Errorf("reading the host console log: %w", err)
				}
				e.Message = &entry.Message
			}
			b.WriteString(*e.Message)
		}
		out := []byte(b.String())
		if maxBytes > 0 && len(out) > maxBytes {
			out = out[len(out)-maxBytes:]
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: %s has no host console log service", drivers.ErrUnsupported, s.ep.Address)
}

// ResetBIOS implements drivers.BIOSDriver with the Bios.ResetBios action,
// over gofish rather than bmclib: bmclib neither follows the task the
// action starts nor resets a system whose path it does not know. The call
// returns once the task monitor says the task completed (the BMC applies
// the factory settings at the next boot, so there is nothing else to read
// back).
func (d *Redfish) ResetBIOS(ctx context.Context, m drivers.Machine) error {
	s, err := d.open(ctx, m)
	if err != nil {
		return err
	}
	defer s.close(ctx)
	sys, err := s.system(ctx)
	if err != nil {
		return err
	}
	gc := s.gc
	var bios struct {
		Actions map[string]struct {
			Target string `json:"target"`
		}
	}
	if err := s.getJSON(ctx, sys.ODataID+"/Bios", &bios); err != nil {
		return fmt.Errorf("reading the BIOS resource: %w", err)
	}
	target := bios.Actions["#Bios.ResetBios"].Target
	if target == "" {
		return fmt.Errorf("%w: %s offers no Bios.ResetBios action", drivers.ErrUnsupported, s.ep.Address)
	}
	resp, err := drivers.Retry(ctx, d.o.Policy, func() (*http.Response, error) {
		resp, err := gc.Post(target, struct{}{})
		return resp, s.classify(ctx, err)
	})
	if err != nil {
		return fmt.Errorf("resetting the BIOS: %w", err)
	}
	monitor := resp.Header.Get("Location")
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || monitor == "" {
		return nil // done synchronously
	}
	return s.waitTask(ctx, "BIOS reset", monitor)
}

// getJSON reads a resource into v.
func (s *rfSession) getJSON(ctx context.Context, path string, v any) error {
	gc, err := s.gofish(ctx)
	if err != nil {
		return err
	}
	_, err = drivers.Retry(ctx, s.d.o.Policy, func() (struct{}, error) {
		resp, err := gc.Get(path)
		if err != nil {
			return struct{}{}, s.classify(ctx, err)
		}
		defer resp.Body.Close()
		return struct{}{}, json.NewDecoder(resp.Body).Decode(v)
	})
	return err
}

// waitTask follows a task monitor until its task ends: the monitor
// answers 202 while the task runs, then the task itself. ReadBackFor
// bounds the wait.
func (s *rfSession) waitTask(ctx context.Context, what, monitor string) error {
	var task struct {
		TaskState string
		Messages  []struct{ Message string }
	}
	err := drivers.WriteAndReadBack(ctx, drivers.Policy{Writes: 1, ReadBackFor: s.d.o.Policy.ReadBackFor,
		ReadBackInterval: s.d.o.Policy.ReadBackInterval, RetryFor: s.d.o.Policy.RetryFor, RetryInterval: s.d.o.Policy.RetryInterval},
		what+" task", func() error { return nil },
		func() (bool, string, error) {
			task.TaskState = ""
			if err := s.getJSON(ctx, monitor, &task); err != nil {
				return false, "", err
			}
			switch task.TaskState {
			case "Completed":
				return true, task.TaskState, nil
			case "Exception", "Killed", "Cancelled":
				var msgs []string
				for _, m := range task.Messages {
					msgs = append(msgs, m.Message)
				}
				return false, "", fmt.Errorf("%s: the task ended %s: %s", what, task.TaskState, strings.Join(msgs, "; "))
			}
			return false, task.TaskState, nil
		})
	if errors.Is(err, drivers.ErrNotApplied) {
		return fmt.Errorf("%w: %s: the task still runs after %s", drivers.ErrTransient, what, s.d.o.Policy.ReadBackFor)
	}
	return err
}

// Firmware implements drivers.FirmwareDriver from the UpdateService's
// firmware inventory, else the manager's firmware version.
func (d *Redfish) Firmware(ctx context.Context, m drivers.Machine) ([]drivers.FirmwareComponent, error) {
	s, err := d.open(ctx, m)
	if err != nil {
		return nil, err
	}
	defer s.close(ctx)
	gc, err := s.gofish(ctx)
	if err != nil {
		return nil, err
	}
	inv, err := drivers.Retry(ctx, d.o.Policy, func() ([]*rf.SoftwareInventory, error) {
		us, err := gc.Service.UpdateService()
		if err != nil {
			return nil, s.classify(ctx, err)
		}
		inv, err := us.FirmwareInventories()
		return inv, s.classify(ctx, err)
	})
	var out []drivers.FirmwareComponent
	for _, c := range inv {
		name := c.Name
		if name == "" {
			name = c.ID
		}
		out = append(out, drivers.FirmwareComponent{Name: name, Version: c.Version})
	}
	if err != nil || len(out) == 0 {
		mgr, merr := s.manager(ctx)
		if merr != nil {
			return nil, errors.Join(err, merr)
		}
		out = []drivers.FirmwareComponent{{Name: "BMC", Version: mgr.FirmwareVersion}}
	}
	return out, nil
}

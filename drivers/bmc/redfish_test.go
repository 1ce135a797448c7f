package bmc_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/bmc"
	"github.com/better-compute/better-compute/drivers/ipmisim"
	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/sim"
	"github.com/better-compute/better-compute/drivers/redfish/emulator"
)

const (
	rfUser = "admin"
	rfPass = "rf-s3cret"
)

var simInfo = machines.Info{
	UUID: "6f1d3c2a-1b2c-4d5e-8f90-a1b2c3d4e5f6", SerialNumber: "SIM-0001", Manufacturer: "Better Compute",
	Model: "Simulated", MAC: "52:54:00:12:34:56", CPUs: 4, MemoryMiB: 8192,
}

// testPolicy keeps read-backs short: the emulator applies writes at once,
// so a write that does not show within a second was dropped.
var testPolicy = drivers.Policy{ReadBackFor: time.Second, RetryFor: 5 * time.Second, RetryInterval: 50 * time.Millisecond,
	ReadBackInterval: 20 * time.Millisecond}

type rfPeer struct {
	e  *emulator.Emulator
	b  *emulator.BMC
	m  *sim.Machine
	ep *drivers.Endpoint
}

func startEmulator(t *testing.T, ids ...string) []rfPeer {
	t.Helper()
	e, err := emulator.New(emulator.Config{Username: rfUser, Password: rfPass, TaskDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	var out []rfPeer
	for i, id := range ids {
		info := simInfo
		info.SerialNumber = "SIM-" + id
		info.MAC = "52:54:00:12:34:" + []string{"10", "11", "12", "13", "14", "15", "16", "17"}[i%8]
		m := sim.New(sim.Config{Info: info})
		b, err := e.AddBMC(id, m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, rfPeer{e: e, b: b, m: m,
			ep: &drivers.Endpoint{Address: b.URL(), Username: rfUser, Password: rfPass, CAPEM: string(e.CAPEM())}})
	}
	return out
}

func redfishRegistry(limits drivers.Limits, ds ...drivers.Driver) *drivers.Registry {
	if len(ds) == 0 {
		ds = []drivers.Driver{bmc.NewRedfish(bmc.RedfishOptions{Policy: testPolicy})}
	}
	return drivers.NewRegistry(limits, nil, ds...)
}

func rfMachine(ep *drivers.Endpoint) drivers.Machine {
	return drivers.Machine{NodeID: "nod_rf", SiteID: "sit_1", Redfish: ep}
}

func mediaServer(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("an ISO image, as far as a simulated machine can tell"))
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/ramdisk.iso"
}

func TestRedfishConcerns(t *testing.T) {
	p := startEmulator(t, "bmc-1")[0]
	r, m, ctx := redfishRegistry(drivers.Limits{}), rfMachine(p.ep), context.Background()

	info, served, err := r.Verify(ctx, m)
	if err != nil || served != drivers.DriverRedfish {
		t.Fatalf("Verify: %v from %q", err, served)
	}
	if info.Manufacturer != simInfo.Manufacturer || info.Model != simInfo.Model || info.Power != drivers.PowerOff || info.Firmware == "" {
		t.Fatalf("Verify = %+v", info)
	}

	for _, c := range []struct {
		a    drivers.PowerAction
		want drivers.PowerState
	}{
		{drivers.ActionOn, drivers.PowerOn}, {drivers.ActionCycle, drivers.PowerOn}, {drivers.ActionReset, drivers.PowerOn},
		{drivers.ActionOff, drivers.PowerOff}, {drivers.ActionReset, drivers.PowerOn}, {drivers.ActionOff, drivers.PowerOff},
	} {
		got, _, err := r.SetPower(ctx, m, c.a)
		if err != nil || got != c.want {
			t.Fatalf("SetPower(%s) = %q, %v; want %q", c.a, got, err, c.want)
		}
		if peer, _ := p.m.PowerState(ctx); peer != c.want {
			t.Fatalf("after %s the machine is %q, want %q", c.a, peer, c.want)
		}
	}
	// on, cycle (off, on), reset, off, reset of an off machine (on), off:
	// the machine booted four times.
	if boots := len(p.m.Boots()); boots != 4 {
		t.Fatalf("the machine booted %d times, want 4", boots)
	}

	for _, c := range []struct {
		dev        drivers.BootDevice
		persistent bool
	}{{drivers.BootPXE, false}, {drivers.BootCD, true}, {drivers.BootDisk, false}, {drivers.BootBIOS, true}} {
		if _, err := r.SetBootDevice(ctx, m, c.dev, c.persistent); err != nil {
			t.Fatalf("SetBootDevice(%s): %v", c.dev, err)
		}
		ov, _ := p.m.BootOverride(ctx)
		if ov.Target != c.dev || ov.Persistent != c.persistent {
			t.Fatalf("after SetBootDevice(%s, %t) the machine's override is %+v", c.dev, c.persistent, ov)
		}
	}

	url := mediaServer(t)
	if _, err := r.InsertMedia(ctx, m, drivers.Media{URL: url, Kind: "cd"}); err != nil {
		t.Fatalf("InsertMedia: %v", err)
	}
	if media, ok := p.m.Media(machines.MediaCD); !ok || media.URL != url {
		t.Fatalf("the machine's CD after insert: %+v, %t", media, ok)
	}
	if _, err := r.EjectMedia(ctx, m); err != nil {
		t.Fatalf("EjectMedia: %v", err)
	}
	if media, ok := p.m.Media(machines.MediaCD); ok {
		t.Fatalf("the machine's CD after eject: %+v", media)
	}

	hw, _, err := r.Inspect(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if hw.Manufacturer != simInfo.Manufacturer || hw.Model != simInfo.Model || hw.SerialNumber != "SIM-bmc-1" ||
		hw.UUID != simInfo.UUID || hw.CPUs != simInfo.CPUs || hw.MemoryMiB != simInfo.MemoryMiB ||
		len(hw.MACs) != 1 || hw.MACs[0] != "52:54:00:12:34:10" {
		t.Fatalf("Inspect = %+v", hw)
	}

	// The boots above wrote to the serial console, which the BMC's host
	// logger serves.
	log, _, err := r.ConsoleLog(ctx, m, 1<<16)
	if err != nil || !strings.Contains(string(log), "sim: boot 4 from") {
		t.Fatalf("ConsoleLog = %q, %v", log, err)
	}
	if tail, _, _ := r.ConsoleLog(ctx, m, 10); len(tail) != 10 || !strings.HasSuffix(string(log), string(tail)) {
		t.Fatalf("ConsoleLog's tail = %q of %q", tail, log)
	}

	if _, err := r.ResetBIOS(ctx, m); err != nil {
		t.Fatalf("ResetBIOS: %v", err)
	}
	fw, _, err := r.Firmware(ctx, m)
	if err != nil || len(fw) != 2 {
		t.Fatalf("Firmware = %+v, %v", fw, err)
	}
}

func TestRedfishAcknowledgedButNotAppliedIsErrNotApplied(t *testing.T) {
	p := startEmulator(t, "bmc-1")[0]
	policy := testPolicy
	policy.ReadBackFor = 300 * time.Millisecond
	r := redfishRegistry(drivers.Limits{}, bmc.NewRedfish(bmc.RedfishOptions{Policy: policy}))
	m, ctx := rfMachine(p.ep), context.Background()

	// One dropped write: the driver reads it back unchanged, writes again,
	// and the second applies.
	p.b.SetFaults(emulator.Faults{AckNotApply: 1})
	if got, _, err := r.SetPower(ctx, m, drivers.ActionOn); err != nil || got != drivers.PowerOn {
		t.Fatalf("SetPower(on) with one dropped write = %q, %v", got, err)
	}
	if n := p.b.NotApplied(); n != 1 {
		t.Fatalf("the BMC dropped %d writes, want 1", n)
	}

	// Every write dropped: each of the policy's writes is read back, then
	// ErrNotApplied.
	p.b.SetFaults(emulator.Faults{AckNotApply: emulator.Always})
	_, _, err := r.SetPower(ctx, m, drivers.ActionOff)
	if !errors.Is(err, drivers.ErrNotApplied) {
		t.Fatalf("SetPower(off) on a BMC that drops writes: %v, want ErrNotApplied", err)
	}
	if n := p.b.NotApplied(); n != 1+3 {
		t.Fatalf("the BMC dropped %d writes, want 1 + the policy's 3", n)
	}
	if peer, _ := p.m.PowerState(ctx); peer != drivers.PowerOn {
		t.Fatalf("the machine is %q", peer)
	}
	if _, err := r.SetBootDevice(ctx, m, drivers.BootPXE, false); !errors.Is(err, drivers.ErrNotApplied) {
		t.Fatalf("SetBootDevice on a BMC that drops writes: %v, want ErrNotApplied", err)
	}
	if _, err := r.InsertMedia(ctx, m, drivers.Media{URL: mediaServer(t), Kind: "cd"}); !errors.Is(err, drivers.ErrNotApplied) {
		t.Fatalf("InsertMedia on a BMC that drops writes: %v, want ErrNotApplied", err)
	}
	// ErrNotApplied is no reason to fail over, and says what was read.
	if !strings.Contains(err.Error(), `still reads "on"`) {
		t.Fatalf("the error does not say what the BMC read: %v", err)
	}
}

func TestRedfishUnavailableBurstIsRetried(t *testing.T) {
	p := startEmulator(t, "bmc-1")[0]
	r, m, ctx := redfishRegistry(drivers.Limits{}), rfMachine(p.ep), context.Background()
	p.b.SetFaults(emulator.Faults{Unavailable: 4})
	p.b.ResetRequests()
	if got, _, err := r.SetPower(ctx, m, drivers.ActionOn); err != nil || got != drivers.PowerOn {
		t.Fatalf("SetPower(on) through a 503 burst = %q, %v", got, err)
	}
	if left := p.b.Faults().Unavailable; left != 0 {
		t.Fatalf("%d 503s were not reached", left)
	}
	// A dropped connection is retried the same way.
	p.b.SetFaults(emulator.Faults{Drop: 2})
	if got, _, err := r.PowerState(ctx, m); err != nil || got != drivers.PowerOn {
		t.Fatalf("PowerState through dropped connections = %q, %v", got, err)
	}
	// A BMC that stays unavailable fails once the retries are spent.
	p.b.SetFaults(emulator.Faults{Unavailable: emulator.Always})
	short := redfishRegistry(drivers.Limits{}, bmc.NewRedfish(bmc.RedfishOptions{Policy: drivers.Policy{RetryFor: 300 * time.Millisecond, RetryInterval: 50 * time.Millisecond}}))
	if _, _, err := short.PowerState(ctx, m); !errors.Is(err, drivers.ErrTransient) {
		t.Fatalf("PowerState on a BMC that stays unavailable: %v, want ErrTransient", err)
	}
}

func TestRedfishSlowTaskIsAwaited(t *testing.T) {
	p := startEmulator(t, "bmc-1")[0]
	r, m, ctx := redfishRegistry(drivers.Limits{}), rfMachine(p.ep), context.Background()
	p.b.SetFaults(emulator.Faults{SlowTasks: 400 * time.Millisecond})
	if _, err := r.ResetBIOS(ctx, m); err != nil {
		t.Fatalf("ResetBIOS with a slow task: %v", err)
	}
	// The call returned once the task had completed, not when the BMC
	// accepted it.
	hc := p.e.HTTPClient()
	req, _ := http.NewRequest(http.MethodGet, p.b.URL()+"/redfish/v1/TaskService/Tasks/1", nil)
	req.SetBasicAuth(rfUser, rfPass)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var task struct{ TaskState string }
	if err := json.NewDecoder(resp.Body).Decode(&task); err != nil || task.TaskState != "Completed" {
		t.Fatalf("the BIOS reset task is %q (%v) once ResetBIOS returned", task.TaskState, err)
	}
	// A task slower than the wait is a transient failure, not a success.
	p.b.SetFaults(emulator.Faults{SlowTasks: time.Minute})
	if _, err := r.ResetBIOS(ctx, m); !errors.Is(err, drivers.ErrTransient) {
		t.Fatalf("ResetBIOS with a task slower than the wait: %v, want ErrTransient", err)
	}
}

func TestRedfishWrongPasswordIsErrAuth(t *testing.T) {
	p := startEmulator(t, "bmc-1")[0]
	ep := *p.ep
	ep.Password = "not-the-password"
	_, _, err := redfishRegistry(drivers.Limits{}).Verify(context.Background(), rfMachine(&ep))
	if !errors.Is(err, drivers.ErrAuth) {
		t.Fatalf("Verify with a wrong password: %v, want ErrAuth", err)
	}
	if strings.Contains(err.Error(), "not-the-password") {
		t.Fatalf("the error shows the password: %v", err)
	}
}

func TestRedfishUntrustedCertificateFailsClosed(t *testing.T) {
	p := startEmulator(t, "bmc-1")[0]
	ep := *p.ep
	ep.CAPEM = ""
	if _, _, err := redfishRegistry(drivers.Limits{}).PowerState(context.Background(), rfMachine(&ep)); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Fatalf("PowerState of a BMC whose certificate no root signs: %v, want a certificate error", err)
	}
}

func closedTCPAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func TestRedfishClosedPortIsErrUnreachable(t *testing.T) {
	ep := &drivers.Endpoint{Address: "https://" + closedTCPAddress(t), Username: rfUser, Password: rfPass}
	if _, _, err := redfishRegistry(drivers.Limits{}).PowerState(context.Background(), rfMachine(ep)); !errors.Is(err, drivers.ErrUnreachable) {
		t.Fatalf("PowerState at a closed port: %v, want ErrUnreachable", err)
	}
}

func bothRegistry() *drivers.Registry {
	return drivers.NewRegistry(drivers.Limits{}, nil, bmc.NewRedfish(bmc.RedfishOptions{Policy: testPolicy}),
		bmc.NewIPMI(bmc.IPMIOptions{ConnectTimeout: 500 * time.Millisecond, CipherSuite: "3", Policy: testPolicy}))
}

func TestFailoverRedfishToIPMI(t *testing.T) {
	ipmi := ipmisim.Start(t)
	r, ctx := bothRegistry(), context.Background()
	down := &drivers.Endpoint{Address: "https://" + closedTCPAddress(t), Username: rfUser, Password: rfPass}
	m := drivers.Machine{NodeID: "nod_both", SiteID: "sit_1", Redfish: down, IPMI: ipmi.Endpoint(),
		Bindings: map[drivers.Concern]string{drivers.ConcernPower: drivers.DriverRedfish}}

	got, served, err := r.SetPower(ctx, m, drivers.ActionOn)
	if err != nil || got != drivers.PowerOn || served != drivers.DriverIPMI {
		t.Fatalf("SetPower(on) with Redfish down = %q from %q, %v; want on from ipmi/v1", got, served, err)
	}
	if out, _ := ipmi.Ipmitool(ctx, "chassis", "power", "status"); !strings.Contains(out, "is on") {
		t.Fatalf("the IPMI peer says %q", out)
	}
	// A concern only Redfish serves has nowhere to fail over to.
	if _, _, err := r.Inspect(ctx, m); !errors.Is(err, drivers.ErrUnreachable) {
		t.Fatalf("Inspect with Redfish down: %v, want ErrUnreachable", err)
	}

	// A refused credential is not an availability problem: no failover.
	p := startEmulator(t, "bmc-1")[0]
	wrong := *p.ep
	wrong.Password = "not-the-password"
	m.Redfish = &wrong
	if _, served, err := r.SetPower(ctx, m, drivers.ActionOff); !errors.Is(err, drivers.ErrAuth) || served != "" {
		t.Fatalf("SetPower with a refused Redfish credential = %q, %v; want ErrAuth and no failover", served, err)
	}
	if out, _ := ipmi.Ipmitool(ctx, "chassis", "power", "status"); !strings.Contains(out, "is on") {
		t.Fatalf("the IPMI peer was switched: %q", out)
	}
	// Bound to IPMI, power is served by IPMI even with Redfish up.
	m.Redfish = p.ep
	m.Bindings[drivers.ConcernPower] = drivers.DriverIPMI
	if _, served, err := r.PowerState(ctx, m); err != nil || served != drivers.DriverIPMI {
		t.Fatalf("PowerState bound to IPMI served by %q: %v", served, err)
	}
}

// inFlight counts the requests in flight at the peers: per BMC, and all
// together.
type inFlight struct {
	mu       sync.Mutex
	now, max map[string]int
	total    int
	maxTotal int
	served   atomic.Int64
}

func (f *inFlight) wrap(id string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.now[id]++
		f.total++
		f.max[id] = max(f.max[id], f.now[id])
		f.maxTotal = max(f.maxTotal, f.total)
		f.mu.Unlock()
		defer func() {
			f.mu.Lock()
			f.now[id]--
			f.total--
			f.mu.Unlock()
			f.served.Add(1)
		}()
		h.ServeHTTP(w, r)
	})
}

// countedPeers serves each emulated BMC again, behind a counter.
func countedPeers(t *testing.T, n int) ([]drivers.Machine, *inFlight) {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "bmc-" + string(rune('a'+i))
	}
	f := &inFlight{now: map[string]int{}, max: map[string]int{}}
	var ms []drivers.Machine
	for i, p := range startEmulator(t, ids...) {
		srv := httptest.NewUnstartedServer(f.wrap(ids[i], p.b))
		srv.StartTLS()
		t.Cleanup(srv.Close)
		ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
		ms = append(ms, drivers.Machine{NodeID: "nod_" + ids[i], SiteID: "sit_1",
			Redfish: &drivers.Endpoint{Address: srv.URL, Username: rfUser, Password: rfPass, CAPEM: string(ca)}})
	}
	return ms, f
}

func TestSessionCapAndSiteLimitBoundConcurrency(t *testing.T) {
	const bmcs, callsPerBMC, perBMC, perSite = 4, 6, 1, 2
	ms, f := countedPeers(t, bmcs)
	r := redfishRegistry(drivers.Limits{PerBMC: perBMC, PerSite: perSite})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, bmcs*callsPerBMC)
	for _, m := range ms {
		for i := 0; i < callsPerBMC; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				action := drivers.ActionOn
				if i%2 == 1 {
					action = drivers.ActionOff
				}
				if _, _, err := r.SetPower(ctx, m, action); err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, n := range f.max {
		if n > perBMC {
			t.Errorf("%s had %d requests in flight, over the cap of %d", id, n, perBMC)
		}
	}
	if f.maxTotal > perSite {
		t.Errorf("%d requests were in flight across the site, over its limit of %d", f.maxTotal, perSite)
	}
	if len(f.max) != bmcs || f.served.Load() < bmcs*callsPerBMC*3 {
		t.Fatalf("the peers served %d requests on %d BMCs", f.served.Load(), len(f.max))
	}
}

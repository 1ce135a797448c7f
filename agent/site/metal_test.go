package site

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/workflows/metal"
)

const (
	testSiteToken = "bcst_testsitetoken"
	testPassword  = "hunter2-bmc-password"
	testBootToken = protocol.BootTokenPrefix + "boot-token-secret"
	testDiscToken = protocol.DiscoveryTokenPrefix + "discovery-token-secret"
)

// siteAPI is the API side of the site endpoints as the agent protocol
// defines them: it checks the site token and the fencing epoch, answers a
// node's credentials, and mints each boot's token once.
type siteAPI struct {
	siteID string
	epoch  atomic.Int64
	nodes  map[string]protocol.SiteBMCCredentialsResult
	boots  map[string]protocol.SiteBootTokenResult

	// temporal is what register answers (Run's tests); taken makes it
	// answer that another agent holds the lease.
	temporal protocol.SiteTemporal
	taken    atomic.Bool
	// ramdisk, when set, answers the ramdisk endpoints (a booted VM's).
	ramdisk func(w http.ResponseWriter, path string, body []byte)
	// images answers the site image endpoint (stage_test.go).
	images imageEndpoint

	mu          sync.Mutex
	credCalls   map[string]int
	minted      map[string]int
	discoveries int
}

func newSiteAPI(siteID string, epoch int64) *siteAPI {
	a := &siteAPI{siteID: siteID, nodes: map[string]protocol.SiteBMCCredentialsResult{},
		boots: map[string]protocol.SiteBootTokenResult{}, credCalls: map[string]int{}, minted: map[string]int{}}
	a.epoch.Store(epoch)
	return a
}

func (a *siteAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, protocol.SiteImagePathPrefix) {
		a.serveImage(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	if a.ramdisk != nil && (r.URL.Path == protocol.RamdiskReportPath || r.URL.Path == protocol.RamdiskResultPath) {
		a.ramdisk(w, r.URL.Path, body)
		return
	}
	if r.URL.Path == protocol.SiteRegisterPath || r.URL.Path == protocol.SiteRenewPath {
		a.lease(w, r.URL.Path, body)
		return
	}
	var auth protocol.SiteAuth
	if err := json.Unmarshal(body, &auth); err != nil {
		writeAPIError(w, core.Errorf(core.CodeInvalidInput, "bad body"))
		return
	}
	if auth.Token != testSiteToken {
		writeAPIError(w, core.Errorf(core.CodeUnauthn, "unknown site token"))
		return
	}
	if auth.Epoch != a.epoch.Load() {
		writeAPIError(w, core.Errorf(core.CodeConflict, "lease lost").WithDetails(map[string]any{"reason": "leaseLost"}))
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch r.URL.Path {
	case protocol.SiteBMCCredentialsPath:
		var req protocol.SiteBMCCredentialsRequest
		_ = json.Unmarshal(body, &req)
		a.credCalls[req.NodeID]++
		creds, ok := a.nodes[req.NodeID]
		if !ok {
			writeAPIError(w, core.Errorf(core.CodeNotFound, "no node %s in this site", req.NodeID))
			return
		}
		_ = json.NewEncoder(w).Encode(creds)
	case protocol.SiteBootTokenPath:
		var req protocol.SiteBootTokenRequest
		_ = json.Unmarshal(body, &req)
		b, ok := a.boots[req.BootID]
		if !ok {
			writeAPIError(w, core.Errorf(core.CodeNotFound, "no boot %s", req.BootID))
			return
		}
		if a.minted[req.BootID] > 0 {
			writeAPIError(w, core.Errorf(core.CodeConflict, "the boot's token was already minted").
				WithDetails(map[string]any{"reason": "tokenMinted"}))
			return
		}
		a.minted[req.BootID]++
		_ = json.NewEncoder(w).Encode(b)
	case protocol.SiteDiscoveryTokenPath:
		a.discoveries++
		_ = json.NewEncoder(w).Encode(protocol.SiteDiscoveryTokenResult{SiteID: a.siteID, Token: testDiscToken})
	default:
		http.NotFound(w, r)
	}
}

// lease answers register (the current epoch) and renew (CONFLICT once
// the epoch moved on, as when another agent took the lease).
func (a *siteAPI) lease(w http.ResponseWriter, path string, body []byte) {
	var req protocol.SiteRenewRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Token != testSiteToken {
		writeAPIError(w, core.Errorf(core.CodeUnauthn, "unknown site token"))
		return
	}
	epoch := a.epoch.Load()
	if a.taken.Load() || (path == protocol.SiteRenewPath && req.Epoch != epoch) {
		writeAPIError(w, core.Errorf(core.CodeConflict, "the site lease is held by another agent"))
		return
	}
	_ = json.NewEncoder(w).Encode(protocol.SiteResult{SiteID: a.siteID, TaskQueue: protocol.SiteTaskQueue(a.siteID),
		Temporal: a.temporal, Lease: protocol.SiteLease{Name: "site:" + a.siteID + ":boot", Epoch: epoch, TTLMs: 1500}})
}

func writeAPIError(w http.ResponseWriter, e *core.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Code.HTTPStatus())
	_ = json.NewEncoder(w).Encode(map[string]any{"error": e})
}

func (a *siteAPI) creds(node string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.credCalls[node]
}

// bmcPeer is the BMC side as the activities reach it through the drivers:
// it refuses calls whose credentials are not the node's, fetches inserted
// media from its URL as a BMC does, and keeps the machine's state.
type bmcPeer struct {
	mu       sync.Mutex
	power    drivers.PowerState
	boot     drivers.BootDevice
	media    string
	fetched  []byte
	calls    []string
	machines []drivers.Machine
	fail     map[string]error
	block    chan struct{} // when set, SetPower waits for it or the context
	entered  chan struct{} // when set, SetPower sends on it once it waits
}

func (p *bmcPeer) enter(name string, m drivers.Machine) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, name)
	p.machines = append(p.machines, m)
	if err := p.fail[name]; err != nil {
		return err
	}
	ep := m.Redfish
	if ep == nil {
		ep = m.IPMI
	}
	if ep == nil || ep.Username != "admin" || ep.Password.Reveal() != testPassword {
		return fmt.Errorf("HTTP 401: %w", drivers.ErrAuth)
	}
	return nil
}

// served is the driver the registry would pick for m.
func served(m drivers.Machine) string {
	if m.Redfish != nil {
		return drivers.DriverRedfish
	}
	return drivers.DriverIPMI
}

func (p *bmcPeer) PowerState(_ context.Context, m drivers.Machine) (drivers.PowerState, string, error) {
	if err := p.enter("PowerState", m); err != nil {
		return drivers.PowerUnknown, "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.power, served(m), nil
}

func (p *bmcPeer) SetPower(ctx context.Context, m drivers.Machine, a drivers.PowerAction) (drivers.PowerState, string, error) {
	if err := p.enter("SetPower:"+string(a), m); err != nil {
		return drivers.PowerUnknown, "", err
	}
	if p.block != nil {
		if p.entered != nil {
			p.entered <- struct{}{}
		}
		select {
		case <-p.block:
		case <-ctx.Done():
			return drivers.PowerUnknown, "", fmt.Errorf("%w: %w", drivers.ErrUnreachable, ctx.Err())
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if a == drivers.ActionOff {
		p.power = drivers.PowerOff
	} else {
		p.power = drivers.PowerOn
	}
	return p.power, served(m), nil
}

func (p *bmcPeer) Verify(_ context.Context, m drivers.Machine) (drivers.BMCInfo, string, error) {
	if err := p.enter("Verify", m); err != nil {
		return drivers.BMCInfo{}, "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return drivers.BMCInfo{Driver: served(m), Manufacturer: "Emulated", Model: "E1", Power: p.power}, served(m), nil
}

func (p *bmcPeer) SetBootDevice(_ context.Context, m drivers.Machine, d drivers.BootDevice, persistent bool) (string, error) {
	if err := p.enter(fmt.Sprintf("SetBootDevice:%s:%t", d, persistent), m); err != nil {
		return "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.boot = d
	return served(m), nil
}

func (p *bmcPeer) InsertMedia(ctx context.Context, m drivers.Machine, media drivers.Media) (string, error) {
	if err := p.enter("InsertMedia:"+media.Kind, m); err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, media.URL, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("fetch the image: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("fetch the image: HTTP %d %v", resp.StatusCode, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.media, p.fetched = media.URL, b
	return served(m), nil
}

func (p *bmcPeer) EjectMedia(_ context.Context, m drivers.Machine) (string, error) {
	if err := p.enter("EjectMedia", m); err != nil {
		return "", err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.media, p.fetched = "", nil
	return served(m), nil
}

func (p *bmcPeer) Inspect(_ context.Context, m drivers.Machine) (drivers.HardwareSummary, string, error) {
	if err := p.enter("Inspect", m); err != nil {
		return drivers.HardwareSummary{}, "", err
	}
	return drivers.HardwareSummary{Manufacturer: "Emulated", Model: "E1", SerialNumber: "SN1", UUID: "u-1",
		MACs: []string{"52:54:00:00:00:01"}}, served(m), nil
}

func (p *bmcPeer) ConsoleLog(_ context.Context, m drivers.Machine, maxBytes int) ([]byte, string, error) {
	if err := p.enter("ConsoleLog", m); err != nil {
		return nil, "", err
	}
	b := bytes.Repeat([]byte("console line\n"), 10)
	if len(b) > maxBytes {
		b = b[len(b)-maxBytes:]
	}
	return b, served(m), nil
}

func (p *bmcPeer) ResetBIOS(_ context.Context, m drivers.Machine) (string, error) {
	return served(m), p.enter("ResetBIOS", m)
}

func (p *bmcPeer) takeCalls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.calls
	p.calls = nil
	return c
}

// rig is a site agent's term with its boot server, against siteAPI and
// bmcPeer; logs go to a buffer the tests search for secrets.
type rig struct {
	api      *siteAPI
	bmc      *bmcPeer
	acts     *metalActivities
	boot     *bootServer
	bootURL  string
	endTerm  context.CancelFunc
	logs     *syncBuffer
	apiURL   string
	bootDir  string
	kernel   string
	baseInit []byte
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

const machineAPIURL = "http://10.0.2.2:8080"

func newRig(t testing.TB) *rig {
	t.Helper()
	api := newSiteAPI("site_1", 7)
	api.nodes["node_rf"] = protocol.SiteBMCCredentialsResult{NodeID: "node_rf",
		Redfish: &protocol.BMCCredentials{Address: "https://127.0.0.1:8443", Username: "admin", Password: testPassword}}
	api.nodes["node_ipmi"] = protocol.SiteBMCCredentialsResult{NodeID: "node_ipmi",
		IPMI: &protocol.BMCCredentials{Address: "127.0.0.1:623", Username: "admin", Password: testPassword}}
	api.nodes["node_none"] = protocol.SiteBMCCredentialsResult{NodeID: "node_none"}
	api.boots["boot_vm"] = protocol.SiteBootTokenResult{BootID: "boot_vm", NodeID: "node_rf", Purpose: "inspect", Token: testBootToken}
	api.boots["boot_old"] = protocol.SiteBootTokenResult{BootID: "boot_old", NodeID: "node_rf", Purpose: "inspect",
		Token: testBootToken + "3", ExpiresAt: time.Now().Add(-time.Second).UnixMilli()}
	api.boots["boot_pxe"] = protocol.SiteBootTokenResult{BootID: "boot_pxe", NodeID: "node_ipmi", Purpose: "clean", Token: testBootToken + "2"}
	apiSrv := httptest.NewServer(api)
	t.Cleanup(apiSrv.Close)

	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	if err := os.WriteFile(kernel, bytes.Repeat([]byte("K"), 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	// A real base archive (any cpio serves: the boot's appendix follows it).
	baseInit, err := image.Appendix(protocol.RamdiskBootConfig{Purpose: "base"})
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "initrd-base.img")
	if err := os.WriteFile(base, baseInit, 0o644); err != nil {
		t.Fatal(err)
	}
	images, err := NewRamdiskImages(kernel, base, "")
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{o: Options{APIURL: apiSrv.URL, Token: testSiteToken, Holder: "test", HTTPClient: apiSrv.Client(), Logger: log},
		log: log}
	bootDir := filepath.Join(dir, "boots")
	bs := newBootServer(BootOptions{Images: images}, "", machineAPIURL, bootDir, log)
	bootSrv := httptest.NewServer(bs.handler())
	t.Cleanup(bootSrv.Close)
	bs.url = bootSrv.URL
	a.boot = bs
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	tm := &term{siteID: "site_1", epoch: 7, ctx: ctx, a: a}
	bs.startTerm(tm)
	bmc := &bmcPeer{power: drivers.PowerOff, fail: map[string]error{}}
	return &rig{api: api, bmc: bmc, acts: &metalActivities{t: tm, bmc: bmc, boot: bs}, boot: bs, bootURL: bootSrv.URL,
		endTerm: cancel, logs: logs, apiURL: apiSrv.URL, bootDir: bootDir, kernel: kernel, baseInit: baseInit}
}

func rfRef() metal.MachineRef {
	return metal.MachineRef{NodeID: "node_rf", SiteID: "site_1", RedfishAddress: "https://127.0.0.1:8443"}
}

func ipmiRef() metal.MachineRef {
	return metal.MachineRef{NodeID: "node_ipmi", SiteID: "site_1", IPMIAddress: "127.0.0.1:623", BootMAC: "52:54:00:AB:CD:EF"}
}

func appErr(t *testing.T, err error, wantType string, wantNonRetryable bool) {
	t.Helper()
	var ae *temporal.ApplicationError
	if !errors.As(err, &ae) {
		t.Fatalf("error = %v, want an application error of type %s", err, wantType)
	}
	if ae.Type() != wantType || ae.NonRetryable() != wantNonRetryable {
		t.Fatalf("error = %v (type %s, non-retryable %t), want type %s, non-retryable %t", err, ae.Type(),
			ae.NonRetryable(), wantType, wantNonRetryable)
	}
}

func get(t *testing.T, url string, header ...string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

// isoFile extracts one file of an ISO with xorriso.
func isoFile(t *testing.T, iso []byte, path string) []byte {
	t.Helper()
	b, err := extractISO(t.TempDir(), iso, path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func extractISO(dir string, iso []byte, path string) ([]byte, error) {
	in, out := filepath.Join(dir, "x.iso"), filepath.Join(dir, "out")
	if err := os.WriteFile(in, iso, 0o600); err != nil {
		return nil, err
	}
	if b, err := exec.Command("xorriso", "-osirrox", "on", "-indev", in, "-extract", path, out).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("xorriso extract %s: %w: %s", path, err, b)
	}
	return os.ReadFile(out)
}

func requireISOTools(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("xorriso"); err != nil {
		t.Skip("xorriso is not installed (Debian package xorriso)")
	}
	for _, p := range []string{image.DefaultIsolinuxBin, image.DefaultLdlinux} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s is missing (Debian packages isolinux, syslinux-common)", p)
		}
	}
}

// A ramdisk boot over virtual media: the boot's token is minted once, its
// ISO (kernel, base initramfs + the boot's boot.json) is built and served
// with ranges, the BMC fetches it, the boot device is cd once and the
// machine powers on (reset when on); EndBoot ejects, powers off and stops
// serving. Credentials are fetched for every call and never logged.
func TestBootRamdiskVirtualMedia(t *testing.T) {
	requireISOTools(t)
	r := newRig(t)
	ctx := context.Background()

	started := time.Now()
	res, err := r.acts.BootRamdisk(ctx, metal.BootRequest{Machine: rfRef(), BootID: "boot_vm", Purpose: "inspect"})
	took := time.Since(started)
	if err != nil {
		t.Fatalf("BootRamdisk: %v", err)
	}
	t.Logf("BootRamdisk over virtual media (ISO build included): %v", took)
	if res.Via != ViaVirtualMedia || res.Power != string(drivers.PowerOn) {
		t.Fatalf("BootRamdisk = %+v, want virtual-media, on", res)
	}
	isoURL := r.bootURL + "/boot/boot_vm/ramdisk.iso"
	want := []string{"InsertMedia:cd", "SetBootDevice:cd:false", "PowerState", "SetPower:on"}
	if got := r.bmc.takeCalls(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("BMC calls = %v, want %v", got, want)
	}
	if r.bmc.media != isoURL {
		t.Fatalf("inserted media = %q, want %q", r.bmc.media, isoURL)
	}

	// The served ISO is what the BMC fetched; it boots the kernel with the
	// base initramfs followed by this boot's configuration.
	code, iso, _ := get(t, isoURL)
	if code != http.StatusOK || !bytes.Equal(iso, r.bmc.fetched) {
		t.Fatalf("GET the ISO = %d (%d bytes), want 200 and the bytes the BMC fetched", code, len(iso))
	}
	if k := isoFile(t, iso, image.ISOKernelPath); !bytes.Equal(k, mustRead(t, r.kernel)) {
		t.Fatal("the ISO's kernel is not the site's kernel")
	}
	initrd := isoFile(t, iso, image.ISOInitrdPath)
	cfg := protocol.RamdiskBootConfig{APIURL: machineAPIURL, Token: testBootToken, BootID: "boot_vm", Purpose: "inspect"}
	app, err := image.Appendix(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(initrd, r.baseInit) || !bytes.HasSuffix(initrd, app) || len(initrd) != len(r.baseInit)+len(app) {
		t.Fatal("the ISO's initrd is not the base initramfs followed by the boot's appendix")
	}

	// Ranges, as BMCs fetch images in chunks.
	code, part, h := get(t, isoURL, "Range", "bytes=100-1123")
	if code != http.StatusPartialContent || !bytes.Equal(part, iso[100:1124]) ||
		h.Get("Content-Range") != fmt.Sprintf("bytes 100-1123/%d", len(iso)) {
		t.Fatalf("GET a range = %d %q (%d bytes), want 206 with bytes 100-1123", code, h.Get("Content-Range"), len(part))
	}
	code, body, _ := get(t, r.bootURL+"/boot/boot_vm/boot.json")
	var gotCfg protocol.RamdiskBootConfig
	if code != http.StatusOK || json.Unmarshal(body, &gotCfg) != nil || gotCfg != cfg {
		t.Fatalf("GET boot.json = %d %s, want %+v", code, body, cfg)
	}

	// A retry of the activity (the machine is on now) reuses the boot, and
	// resets the machine.
	res, err = r.acts.BootRamdisk(ctx, metal.BootRequest{Machine: rfRef(), BootID: "boot_vm", Purpose: "inspect"})
	if err != nil || res.Power != string(drivers.PowerOn) {
		t.Fatalf("BootRamdisk again = %+v, %v", res, err)
	}
	want = []string{"InsertMedia:cd", "SetBootDevice:cd:false", "PowerState", "SetPower:reset"}
	if got := r.bmc.takeCalls(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("BMC calls = %v, want %v", got, want)
	}
	// A retry another way (PXE) serves the same boot by MAC, minting
	// nothing.
	pxeRef := rfRef()
	pxeRef.BootMAC = "52:54:00:00:00:77"
	res, err = r.acts.BootRamdisk(ctx, metal.BootRequest{Machine: pxeRef, BootID: "boot_vm", Purpose: "inspect", Via: ViaPXE})
	if err != nil || res.Via != ViaPXE {
		t.Fatalf("BootRamdisk over PXE = %+v, %v", res, err)
	}
	want = []string{"SetBootDevice:pxe:false", "PowerState", "SetPower:reset"}
	if got := r.bmc.takeCalls(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("BMC calls = %v, want %v", got, want)
	}
	code, body, _ = get(t, r.bootURL+"/boot/mac/52:54:00:00:00:77/boot.json")
	if code != http.StatusOK || json.Unmarshal(body, &gotCfg) != nil || gotCfg != cfg {
		t.Fatalf("GET boot.json by MAC after the PXE retry = %d %s, want %+v", code, body, cfg)
	}
	if r.api.minted["boot_vm"] != 1 {
		t.Fatalf("the boot's token was minted %d times, want once", r.api.minted["boot_vm"])
	}
	// Another agent (which never registered the boot) cannot mint it again:
	// a final conflict, not a lost lease.
	other := &metalActivities{t: r.acts.t, bmc: r.bmc, boot: newBootServer(BootOptions{Images: r.boot.images}, "",
		machineAPIURL, t.TempDir(), r.acts.t.a.log)}
	_, err = other.BootRamdisk(ctx, metal.BootRequest{Machine: rfRef(), BootID: "boot_vm", Purpose: "inspect"})
	appErr(t, err, string(core.CodeConflict), true)

	if err := r.acts.EndBoot(ctx, metal.EndBootRequest{Machine: rfRef(), BootID: "boot_vm", PowerOff: true}); err != nil {
		t.Fatalf("EndBoot: %v", err)
	}
	want = []string{"EjectMedia", "SetPower:off"}
	if got := r.bmc.takeCalls(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("BMC calls = %v, want %v", got, want)
	}
	if r.bmc.media != "" || r.bmc.power != drivers.PowerOff {
		t.Fatalf("after EndBoot media = %q, power %s", r.bmc.media, r.bmc.power)
	}
	for _, p := range []string{"/boot/boot_vm/ramdisk.iso", "/boot/boot_vm/boot.json", "/boot/boot_vm/initrd.img"} {
		if code, _, _ := get(t, r.bootURL+p); code != http.StatusNotFound {
			t.Fatalf("GET %s after EndBoot = %d, want 404", p, code)
		}
	}
	if _, err := os.Stat(filepath.Join(r.bootDir, "boot_vm")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the boot's pieces remain after EndBoot: %v", err)
	}

	// Five activities, each fetched the credentials just before use.
	if n := r.api.creds("node_rf"); n != 5 {
		t.Fatalf("credentials fetched %d times, want 5 (once per call)", n)
	}
	logs := r.logs.String()
	if !strings.Contains(logs, "boot_vm") {
		t.Fatalf("the logs say nothing of the boot: %s", logs)
	}
	for _, secret := range []string{testPassword, testBootToken, testSiteToken} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a secret is in the logs: %s", logs)
		}
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A PXE boot: the boot device is pxe once, and the boot server answers the
// machine by its MAC (any spelling) with the boot's configuration, an iPXE
// script chaining the kernel and the boot's initrd, and those pieces.
func TestBootRamdiskPXE(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	res, err := r.acts.BootRamdisk(ctx, metal.BootRequest{Machine: ipmiRef(), BootID: "boot_pxe", Purpose: "clean"})
	if err != nil {
		t.Fatalf("BootRamdisk: %v", err)
	}
	if res.Via != ViaPXE {
		t.Fatalf("BootRamdisk = %+v, want pxe for an IPMI-only machine", res)
	}
	want := []string{"SetBootDevice:pxe:false", "PowerState", "SetPower:on"}
	if got := r.bmc.takeCalls(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("BMC calls = %v, want %v", got, want)
	}
	cfg := protocol.RamdiskBootConfig{APIURL: machineAPIURL, Token: testBootToken + "2", BootID: "boot_pxe", Purpose: "clean"}
	for _, mac := range []string{"52:54:00:ab:cd:ef", "52-54-00-AB-CD-EF"} {
		code, body, _ := get(t, r.bootURL+"/boot/mac/"+mac+"/boot.json")
		var got protocol.RamdiskBootConfig
		if code != http.StatusOK || json.Unmarshal(body, &got) != nil || got != cfg {
			t.Fatalf("GET boot.json by MAC %s = %d %s, want %+v", mac, code, body, cfg)
		}
	}
	base := r.bootURL + "/boot/mac/52:54:00:ab:cd:ef"
	code, script, _ := get(t, base+"/ipxe")
	wantScript := "#!ipxe\nkernel " + base + "/vmlinuz " + image.DefaultCmdline + "\ninitrd " + base + "/initrd.img\nboot\n"
	if code != http.StatusOK || string(script) != wantScript {
		t.Fatalf("GET ipxe = %d %q, want %q", code, script, wantScript)
	}
	if code, k, _ := get(t, base+"/vmlinuz"); code != http.StatusOK || !bytes.Equal(k, mustRead(t, r.kernel)) {
		t.Fatalf("GET vmlinuz by MAC = %d", code)
	}
	app, err := image.Appendix(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if code, b, _ := get(t, base+"/initrd.img"); code != http.StatusOK || !bytes.Equal(b, append(append([]byte(nil), r.baseInit...), app...)) {
		t.Fatalf("GET initrd.img by MAC = %d, want the base initramfs and the boot's appendix", code)
	}
	if code, _, _ := get(t, r.bootURL+"/boot/boot_pxe/ramdisk.iso"); code != http.StatusNotFound {
		t.Fatalf("a PXE boot serves an ISO: %d", code)
	}
	if err := r.acts.EndBoot(ctx, metal.EndBootRequest{Machine: ipmiRef(), BootID: "boot_pxe"}); err != nil {
		t.Fatalf("EndBoot: %v", err)
	}
	if got := r.bmc.takeCalls(); len(got) != 0 {
		t.Fatalf("EndBoot of an IPMI PXE boot without power off called the BMC: %v", got)
	}
	// The MAC has no boot now: it gets the discovery configuration.
	code, body, _ := get(t, base+"/boot.json")
	var got protocol.RamdiskBootConfig
	if code != http.StatusOK || json.Unmarshal(body, &got) != nil || got.Token != testDiscToken || got.Purpose != PurposeDiscover {
		t.Fatalf("GET boot.json after EndBoot = %d %s, want the discovery configuration", code, body)
	}

	// PXE needs a MAC to answer by.
	ref := ipmiRef()
	ref.BootMAC = ""
	_, err = r.acts.BootRamdisk(ctx, metal.BootRequest{Machine: ref, BootID: "boot_pxe", Purpose: "clean"})
	appErr(t, err, metal.ErrTypeUnsupported, true)
}

// The boot server 404s unknown boots, gives a MAC without a boot the
// site's discovery configuration (the token fetched once per term), and
// serves nothing between lease terms.
func TestBootServerUnknownAndDiscovery(t *testing.T) {
	r := newRig(t)
	for _, p := range []string{"/boot/nope/ramdisk.iso", "/boot/nope/boot.json", "/boot/nope/initrd.img",
		"/boot/nope/vmlinuz", "/boot/../etc/passwd", "/boot/mac/not-a-mac/boot.json", "/boot/mac/52:54:00:00:00:09/nope"} {
		if code, _, _ := get(t, r.bootURL+p); code != http.StatusNotFound {
			t.Fatalf("GET %s = %d, want 404", p, code)
		}
	}
	want := protocol.RamdiskBootConfig{APIURL: machineAPIURL, Token: testDiscToken, Purpose: PurposeDiscover}
	base := r.bootURL + "/boot/mac/52:54:00:00:00:09"
	for range 2 {
		code, body, _ := get(t, base+"/boot.json")
		var got protocol.RamdiskBootConfig
		if code != http.StatusOK || json.Unmarshal(body, &got) != nil || got != want {
			t.Fatalf("GET boot.json of an unknown MAC = %d %s, want %+v", code, body, want)
		}
	}
	app, err := image.Appendix(want)
	if err != nil {
		t.Fatal(err)
	}
	if code, b, _ := get(t, base+"/initrd.img"); code != http.StatusOK || !bytes.HasSuffix(b, app) {
		t.Fatalf("GET the discovery initrd = %d", code)
	}
	if code, s, _ := get(t, base+"/ipxe"); code != http.StatusOK || !strings.Contains(string(s), base+"/initrd.img") {
		t.Fatalf("GET the discovery ipxe = %d %s", code, s)
	}
	r.api.mu.Lock()
	n := r.api.discoveries
	r.api.mu.Unlock()
	if n != 1 {
		t.Fatalf("the discovery token was fetched %d times, want once", n)
	}
	if strings.Contains(r.logs.String(), testDiscToken) {
		t.Fatal("the discovery token is in the logs")
	}

	if code, s, _ := get(t, r.bootURL+"/boot/ipxe"); code != http.StatusOK ||
		string(s) != "#!ipxe\nchain "+r.bootURL+"/boot/mac/${net0/mac}/ipxe\n" {
		t.Fatalf("GET /boot/ipxe = %d %q", code, s)
	}

	// A boot whose token expired is not served (its EndBoot may have gone
	// to another agent), and its pieces go at the next registration.
	if _, err := r.acts.BootRamdisk(context.Background(), metal.BootRequest{Machine: rfRef(), BootID: "boot_old", Purpose: "inspect",
		Via: ViaPXE}); err == nil {
		t.Fatal("a PXE boot without a MAC started")
	}
	oldRef := rfRef()
	oldRef.BootMAC = "52:54:00:00:00:42"
	if _, err := r.acts.BootRamdisk(context.Background(), metal.BootRequest{Machine: oldRef, BootID: "boot_old", Purpose: "inspect",
		Via: ViaPXE}); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := get(t, r.bootURL+"/boot/boot_old/boot.json"); code != http.StatusNotFound {
		t.Fatalf("GET an expired boot = %d, want 404", code)
	}
	if code, body, _ := get(t, r.bootURL+"/boot/mac/52:54:00:00:00:42/boot.json"); code != http.StatusOK || !strings.Contains(string(body), testDiscToken) {
		t.Fatalf("GET an expired boot by MAC = %d %s, want the discovery configuration", code, body)
	}
	if _, err := r.acts.BootRamdisk(context.Background(), metal.BootRequest{Machine: ipmiRef(), BootID: "boot_pxe", Purpose: "clean"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.bootDir, "boot_old")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an expired boot's pieces remain: %v", err)
	}

	r.boot.endTerm()
	if code, _, _ := get(t, base+"/boot.json"); code != http.StatusServiceUnavailable {
		t.Fatalf("GET boot.json between terms = %d, want 503", code)
	}
}

// Driver errors become application errors of stable types (auth,
// unsupported and not-applied final, unreachable retried), with the
// driver's reason and no credential; unsupported inspect and BIOS reset
// answer Supported false; the API's refusals map to lease lost and not
// found.
func TestMetalErrors(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()

	st, err := r.acts.VerifyBMC(ctx, rfRef())
	if err != nil || st.Driver != drivers.DriverRedfish || st.Power != "off" || st.Manufacturer != "Emulated" {
		t.Fatalf("VerifyBMC = %+v, %v", st, err)
	}
	pr, err := r.acts.Power(ctx, metal.PowerRequest{Machine: ipmiRef(), Action: "status"})
	if err != nil || pr.Power != "off" || pr.Driver != drivers.DriverIPMI {
		t.Fatalf("Power status = %+v, %v", pr, err)
	}
	pr, err = r.acts.Power(ctx, metal.PowerRequest{Machine: rfRef(), Action: "cycle"})
	if err != nil || pr.Power != "on" || pr.Driver != drivers.DriverRedfish {
		t.Fatalf("Power cycle = %+v, %v", pr, err)
	}
	_, err = r.acts.Power(ctx, metal.PowerRequest{Machine: rfRef(), Action: "explode"})
	appErr(t, err, string(core.CodeInvalidInput), true)
	hw, err := r.acts.InspectOOB(ctx, rfRef())
	if err != nil || !hw.Supported || hw.SerialNumber != "SN1" || len(hw.MACs) != 1 {
		t.Fatalf("InspectOOB = %+v, %v", hw, err)
	}
	bios, err := r.acts.ResetBIOS(ctx, rfRef())
	if err != nil || !bios.Supported {
		t.Fatalf("ResetBIOS = %+v, %v", bios, err)
	}
	log, err := r.acts.ConsoleLog(ctx, metal.ConsoleLogRequest{Machine: rfRef(), MaxBytes: 20})
	if err != nil || len(log) != 20 {
		t.Fatalf("ConsoleLog = %q, %v", log, err)
	}

	r.bmc.fail["Inspect"] = fmt.Errorf("no System resource: %w", drivers.ErrUnsupported)
	r.bmc.fail["ResetBIOS"] = fmt.Errorf("ipmi has no BIOS reset: %w", drivers.ErrUnsupported)
	if hw, err := r.acts.InspectOOB(ctx, ipmiRef()); err != nil || hw.Supported {
		t.Fatalf("InspectOOB unsupported = %+v, %v; want Supported false", hw, err)
	}
	if b, err := r.acts.ResetBIOS(ctx, ipmiRef()); err != nil || b.Supported {
		t.Fatalf("ResetBIOS unsupported = %+v, %v; want Supported false", b, err)
	}

	cases := []struct {
		err          error
		typ          string
		nonRetryable bool
	}{
		{fmt.Errorf("Chassis Power refused: %w", drivers.ErrNotApplied), metal.ErrTypeNotApplied, true},
		{fmt.Errorf("dial tcp 127.0.0.1:8443: connection refused: %w", drivers.ErrUnreachable), metal.ErrTypeBMCUnreachable, false},
		{fmt.Errorf("virtual media: %w", drivers.ErrUnsupported), metal.ErrTypeUnsupported, true},
	}
	for _, c := range cases {
		r.bmc.fail["SetPower:on"] = c.err
		_, err := r.acts.Power(ctx, metal.PowerRequest{Machine: rfRef(), Action: "on"})
		appErr(t, err, c.typ, c.nonRetryable)
		if !strings.Contains(err.Error(), c.err.Error()) {
			t.Fatalf("error %q does not carry the driver's reason %q", err, c.err)
		}
	}
	delete(r.bmc.fail, "SetPower:on")

	// Wrong credentials: the BMC's refusal, final, without the password.
	r.api.nodes["node_bad"] = protocol.SiteBMCCredentialsResult{NodeID: "node_bad",
		Redfish: &protocol.BMCCredentials{Address: "https://127.0.0.1:8443", Username: "admin", Password: "wrong-" + testPassword}}
	_, err = r.acts.VerifyBMC(ctx, metal.MachineRef{NodeID: "node_bad", SiteID: "site_1"})
	appErr(t, err, metal.ErrTypeBMCAuth, true)
	if strings.Contains(err.Error(), testPassword) {
		t.Fatalf("the error carries the password: %v", err)
	}

	// The API knows no such node, or it has no endpoint.
	_, err = r.acts.VerifyBMC(ctx, metal.MachineRef{NodeID: "node_gone", SiteID: "site_1"})
	appErr(t, err, metal.ErrTypeNotFound, true)
	_, err = r.acts.VerifyBMC(ctx, metal.MachineRef{NodeID: "node_none", SiteID: "site_1"})
	appErr(t, err, metal.ErrTypeNotFound, true)
	_, err = r.acts.VerifyBMC(ctx, metal.MachineRef{NodeID: "node_rf", SiteID: "site_2"})
	appErr(t, err, "WrongSite", true)

	for _, secret := range []string{testPassword, testSiteToken} {
		if strings.Contains(r.logs.String(), secret) {
			t.Fatal("a secret is in the logs")
		}
	}
	// Every call used the credentials the API answered, as a Secret.
	for _, m := range r.bmc.machines {
		for _, ep := range []*drivers.Endpoint{m.Redfish, m.IPMI} {
			if ep != nil && fmt.Sprint(ep.Password) != "[redacted]" {
				t.Fatal("the password reached the driver as a plain string")
			}
		}
	}
}

// An agent whose lease was taken refuses: the API's answer to a stale
// epoch is lease lost; after the term ended no call reaches the API or the
// BMC; a term ending mid-call cancels the BMC call and fails it as lease
// lost.
func TestMetalLeaseLost(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()

	// Another agent took the lease (the epoch moved on).
	r.api.epoch.Store(8)
	_, err := r.acts.Power(ctx, metal.PowerRequest{Machine: rfRef(), Action: "on"})
	appErr(t, err, metal.ErrTypeLeaseLost, false)
	_, err = r.acts.BootRamdisk(ctx, metal.BootRequest{Machine: rfRef(), BootID: "boot_vm", Purpose: "inspect"})
	appErr(t, err, metal.ErrTypeLeaseLost, false)
	if got := r.bmc.takeCalls(); len(got) != 0 {
		t.Fatalf("the BMC was called with a stale epoch: %v", got)
	}
	r.api.epoch.Store(7)

	// The term ends during a BMC call.
	r.bmc.block, r.bmc.entered = make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := r.acts.Power(ctx, metal.PowerRequest{Machine: rfRef(), Action: "on"})
		done <- err
	}()
	<-r.bmc.entered
	r.endTerm()
	appErr(t, <-done, metal.ErrTypeLeaseLost, false)
	r.bmc.takeCalls()

	before := r.api.creds("node_rf")
	_, err = r.acts.VerifyBMC(ctx, rfRef())
	appErr(t, err, metal.ErrTypeLeaseLost, false)
	if r.api.creds("node_rf") != before || len(r.bmc.takeCalls()) != 0 {
		t.Fatal("an agent out of its term fetched credentials or called the BMC")
	}
}

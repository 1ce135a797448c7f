package site

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/images"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/sim"
	"github.com/better-compute/better-compute/drivers/redfish/emulator"
	"github.com/better-compute/better-compute/workflows/metal"
)

// testImage is an image the API side serves: its bytes, the nodes with a
// workflow in flight that may fetch it, and, when dropAfter is set, a
// first fetch whose connection drops after that many bytes.
type testImage struct {
	data      []byte
	nodes     map[string]bool
	dropAfter int
	dropped   bool
	// ignoreRange answers every fetch whole, as a server without ranges.
	ignoreRange bool
}

// imageEndpoint is the API's site image endpoint as the agent protocol
// defines it: GET SiteImagePathPrefix+id?node=, the site token as a bearer
// and the lease's epoch in SiteEpochHeader, ranges honoured. It records
// the Range header of every fetch it served.
type imageEndpoint struct {
	mu     sync.Mutex
	images map[string]*testImage
	ranges []string
}

func (e *imageEndpoint) add(id string, data []byte, nodes ...string) *testImage {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.images == nil {
		e.images = map[string]*testImage{}
	}
	img := &testImage{data: data, nodes: map[string]bool{}}
	for _, n := range nodes {
		img.nodes[n] = true
	}
	e.images[id] = img
	return img
}

func (e *imageEndpoint) fetches() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.ranges...)
}

func (a *siteAPI) serveImage(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		http.Error(w, "GET only", http.StatusMethodNotAllowed)
		return
	}
	if r.Header.Get(protocol.SiteTokenHeader) != "Bearer "+testSiteToken {
		writeAPIError(w, core.Errorf(core.CodeUnauthn, "unknown site token"))
		return
	}
	if r.Header.Get(protocol.SiteEpochHeader) != strconv.FormatInt(a.epoch.Load(), 10) {
		writeAPIError(w, core.Errorf(core.CodeConflict, "lease lost").WithDetails(map[string]any{"reason": "leaseLost"}))
		return
	}
	id := strings.TrimPrefix(r.URL.Path, protocol.SiteImagePathPrefix)
	e := &a.images
	e.mu.Lock()
	img := e.images[id]
	if img == nil || !img.nodes[r.URL.Query().Get("node")] {
		e.mu.Unlock()
		writeAPIError(w, core.Errorf(core.CodeNotFound, "no image %s in flight on that node", id))
		return
	}
	e.ranges = append(e.ranges, r.Header.Get("Range"))
	drop := img.dropAfter > 0 && !img.dropped && r.Header.Get("Range") == ""
	if drop {
		img.dropped = true
	}
	data, whole := img.data, img.ignoreRange
	e.mu.Unlock()
	if whole {
		r.Header.Del("Range")
	}
	if drop {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(data[:img.dropAfter])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection drops mid-body
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
}

func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	_, _ = rng.Read(b)
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func stageReq(ref metal.MachineRef, id, format string, data []byte) metal.StageImageRequest {
	return metal.StageImageRequest{Machine: ref, ImageID: id, Format: format, SHA256: sum(data), SizeBytes: int64(len(data))}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Staging fetches the image with the site token and the epoch (the
// endpoint refuses anything else), resumes a dropped connection with a
// Range request, checks the digest and renames the part file into the
// cache; a second staging is a cache hit that fetches nothing. The boot
// server serves the staged bytes (ranges too) only to the bearer of the
// node's open boot, and only the digests that node staged: a wrong token,
// another node's token or digest, no token, an ended boot and a time
// between terms are all the same 404. An agent restarted over the same
// boot dir goes on serving.
func TestStageImageResumesAndServes(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	if _, err := r.acts.BootRamdisk(ctx, metal.BootRequest{Machine: ipmiRef(), BootID: "boot_pxe", Purpose: "deploy"}); err != nil {
		t.Fatal(err)
	}
	bootToken := testBootToken + "2"

	data := randomBytes(3<<20+123, 1)
	img := r.api.images.add("img_a", data, "node_ipmi")
	img.dropAfter = 1 << 20
	req := stageReq(ipmiRef(), "img_a", images.FormatRaw, data)
	res, err := r.acts.StageImage(ctx, req)
	if err != nil {
		t.Fatalf("StageImage: %v", err)
	}
	wantURL := r.bootURL + "/images/node_ipmi/" + req.SHA256
	if res.URL != wantURL || res.SHA256 != req.SHA256 || res.SizeBytes != req.SizeBytes || res.Cached {
		t.Fatalf("StageImage = %+v, want %s, not cached", res, wantURL)
	}
	fetches := r.api.images.fetches()
	if len(fetches) != 2 || fetches[0] != "" || !strings.HasPrefix(fetches[1], "bytes=") {
		t.Fatalf("the fetches' ranges = %q, want a whole fetch then a resumed one", fetches)
	}
	from, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(fetches[1], "bytes="), "-"))
	if err != nil || from <= 0 || from > img.dropAfter {
		t.Fatalf("the resume asked for %q, want a start within the %d bytes sent before the drop", fetches[1], img.dropAfter)
	}
	cache := filepath.Join(r.bootDir, imagesDir)
	if b, err := os.ReadFile(filepath.Join(cache, blobsDir, req.SHA256)); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("the cache does not hold the image: %v", err)
	}
	if exists(filepath.Join(cache, partsDir, req.SHA256)) {
		t.Fatal("the part file remains after staging")
	}

	// The cache hit fetches nothing.
	res, err = r.acts.StageImage(ctx, req)
	if err != nil || !res.Cached || res.URL != wantURL || res.SHA256 != req.SHA256 {
		t.Fatalf("StageImage again = %+v, %v; want cached", res, err)
	}
	if n := len(r.api.images.fetches()); n != 2 {
		t.Fatalf("a cache hit fetched from the API (%d fetches)", n)
	}

	// The ramdisk fetches it with its boot token, whole or by ranges.
	bearer := "Bearer " + bootToken
	if code, b, _ := get(t, wantURL, "Authorization", bearer); code != http.StatusOK || !bytes.Equal(b, data) {
		t.Fatalf("GET the staged image = %d (%d bytes), want 200 and the image", code, len(b))
	}
	code, part, h := get(t, wantURL, "Authorization", bearer, "Range", "bytes=2097152-")
	if code != http.StatusPartialContent || !bytes.Equal(part, data[2<<20:]) ||
		h.Get("Content-Range") != fmt.Sprintf("bytes 2097152-%d/%d", len(data)-1, len(data)) {
		t.Fatalf("GET a range = %d %q (%d bytes)", code, h.Get("Content-Range"), len(part))
	}

	// Another node's image, staged for node_rf.
	other := randomBytes(64<<10, 2)
	r.api.images.add("img_b", other, "node_rf")
	otherReq := stageReq(rfRef(), "img_b", images.FormatISO, other)
	if _, err := r.acts.StageImage(ctx, otherReq); err != nil {
		t.Fatalf("StageImage for node_rf: %v", err)
	}
	notFound := func(what, url string, header ...string) {
		t.Helper()
		code, body, _ := get(t, url, header...)
		if code != http.StatusNotFound || string(body) != "404 page not found\n" {
			t.Fatalf("GET %s = %d (%d bytes), want the plain 404", what, code, len(body))
		}
	}
	notFound("with a wrong token", wantURL, "Authorization", "Bearer "+testBootToken+"9")
	notFound("without a token", wantURL)
	notFound("with the token not as a bearer", wantURL, "Authorization", bootToken)
	notFound("with the site token", wantURL, "Authorization", "Bearer "+testSiteToken)
	notFound("another node's digest", r.bootURL+"/images/node_ipmi/"+otherReq.SHA256, "Authorization", bearer)
	notFound("as another node", r.bootURL+"/images/node_rf/"+otherReq.SHA256, "Authorization", bearer)
	notFound("an unknown digest", r.bootURL+"/images/node_ipmi/"+sum([]byte("x")), "Authorization", bearer)
	notFound("a bad digest", r.bootURL+"/images/node_ipmi/../"+req.SHA256, "Authorization", bearer)

	// The site token and the epoch are the endpoint's: a stale epoch is a
	// lost lease, an image not in flight on the node is not found.
	r.api.epoch.Store(8)
	_, err = r.acts.StageImage(ctx, stageReq(rfRef(), "img_b", images.FormatRaw, append([]byte("y"), other...)))
	appErr(t, err, metal.ErrTypeLeaseLost, false)
	r.api.epoch.Store(7)
	_, err = r.acts.StageImage(ctx, stageReq(ipmiRef(), "img_b", images.FormatRaw, append([]byte("y"), other...)))
	appErr(t, err, metal.ErrTypeNotFound, true)

	// A restarted agent over the same boot dir keeps serving the staged
	// image to the open boot.
	restarted := newBootServer(BootOptions{}, "", machineAPIURL, r.bootDir, r.acts.t.a.log)
	srv := httptest.NewServer(restarted.handler())
	t.Cleanup(srv.Close)
	restartedURL := srv.URL + "/images/node_ipmi/" + req.SHA256
	notFound("between terms", restartedURL, "Authorization", bearer)
	restarted.startTerm(r.acts.t)
	if code, b, _ := get(t, restartedURL, "Authorization", bearer); code != http.StatusOK || !bytes.Equal(b, data) {
		t.Fatalf("GET the staged image from a restarted agent = %d (%d bytes)", code, len(b))
	}
	if b, err := os.ReadFile(filepath.Join(r.bootDir, "boot_pxe", tokenFile)); err != nil || bytes.Contains(b, []byte(bootToken)) {
		t.Fatalf("the boot's token record is missing or holds the token: %s, %v", b, err)
	}

	// The boot ended: its token opens nothing.
	if err := r.acts.EndBoot(ctx, metal.EndBootRequest{Machine: ipmiRef(), BootID: "boot_pxe"}); err != nil {
		t.Fatal(err)
	}
	notFound("after the boot ended", wantURL, "Authorization", bearer)
	notFound("after the boot ended, restarted", restartedURL, "Authorization", bearer)

	for _, secret := range []string{testSiteToken, bootToken} {
		if strings.Contains(r.logs.String(), secret) {
			t.Fatalf("a secret is in the logs:\n%s", r.logs.String())
		}
	}
}

// A part file an earlier attempt left is resumed from its end; a server
// that ignores the range is fetched whole again; a part file whose bytes
// are not the image's fails the attempt as a mismatch and is removed, so
// the next attempt fetches afresh and succeeds.
func TestStageImagePartFile(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	data := randomBytes(1<<20+7, 7)
	r.api.images.add("img_p", data, "node_ipmi")
	req := stageReq(ipmiRef(), "img_p", images.FormatRaw, data)
	part := filepath.Join(r.bootDir, imagesDir, partsDir, req.SHA256)
	if err := os.MkdirAll(filepath.Dir(part), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(part, data[:300000], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.acts.StageImage(ctx, req); err != nil {
		t.Fatalf("StageImage over a part file: %v", err)
	}
	if got := r.api.images.fetches(); len(got) != 1 || got[0] != "bytes=300000-" {
		t.Fatalf("the fetches' ranges = %q, want one from the part file's end", got)
	}

	whole := r.api.images.add("img_w", data[:1<<20], "node_ipmi")
	whole.ignoreRange = true
	wreq := stageReq(ipmiRef(), "img_w", images.FormatRaw, data[:1<<20])
	if err := os.WriteFile(filepath.Join(r.bootDir, imagesDir, partsDir, wreq.SHA256), data[:4096], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.acts.StageImage(ctx, wreq); err != nil {
		t.Fatalf("StageImage from a server without ranges: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(r.bootDir, imagesDir, blobsDir, wreq.SHA256)); err != nil || !bytes.Equal(b, data[:1<<20]) {
		t.Fatalf("the cache does not hold the image fetched whole again: %v", err)
	}

	r.api.images.add("img_c", data[4096:], "node_ipmi")
	creq := stageReq(ipmiRef(), "img_c", images.FormatRaw, data[4096:])
	cpart := filepath.Join(r.bootDir, imagesDir, partsDir, creq.SHA256)
	if err := os.WriteFile(cpart, bytes.Repeat([]byte{0}, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := r.acts.StageImage(ctx, creq)
	appErr(t, err, metal.ErrTypeDigestMismatch, true)
	if exists(cpart) {
		t.Fatal("a part file that did not match remains")
	}
	if res, err := r.acts.StageImage(ctx, creq); err != nil || res.Cached || res.SHA256 != creq.SHA256 {
		t.Fatalf("StageImage after the mismatch = %+v, %v", res, err)
	}
}

// An image whose bytes are not its digest's (tampered, or longer than its
// size) fails as DigestMismatch, not retried, saying both digests; nothing
// is cached, no part file is left, and the node may fetch nothing.
func TestStageImageTampered(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	data := randomBytes(1<<20, 3)
	tampered := bytes.Clone(data)
	tampered[len(tampered)/2] ^= 0xff
	for _, c := range []struct {
		name   string
		served []byte
	}{{"tampered", tampered}, {"longer", append(bytes.Clone(data), 'x')}, {"shorter", data[:len(data)-1]}} {
		id := "img_" + c.name
		r.api.images.add(id, c.served, "node_ipmi")
		req := stageReq(ipmiRef(), id, images.FormatRaw, data)
		_, err := r.acts.StageImage(ctx, req)
		appErr(t, err, metal.ErrTypeDigestMismatch, true)
		if c.name == "tampered" && (!strings.Contains(err.Error(), req.SHA256) || !strings.Contains(err.Error(), sum(tampered))) {
			t.Fatalf("the mismatch does not say both digests: %v", err)
		}
		cache := filepath.Join(r.bootDir, imagesDir)
		for _, p := range []string{filepath.Join(cache, blobsDir, req.SHA256), filepath.Join(cache, partsDir, req.SHA256),
			filepath.Join(cache, nodesDir, "node_ipmi", req.SHA256)} {
			if exists(p) {
				t.Fatalf("%s: %s remains after a mismatch", c.name, p)
			}
		}
	}
	// A request the site cannot stage.
	bad := stageReq(ipmiRef(), "img_x", "vmdk", data)
	_, err := r.acts.StageImage(ctx, bad)
	appErr(t, err, metal.ErrTypeUnsupported, true)
	bad = stageReq(ipmiRef(), "../img", images.FormatRaw, data)
	_, err = r.acts.StageImage(ctx, bad)
	appErr(t, err, string(core.CodeInvalidInput), true)
}

// A qcow2 image without qemu-img is Unsupported before anything is
// fetched.
func TestStageImageWithoutQemuImg(t *testing.T) {
	r := newRig(t)
	r.boot.cache.qemuImg = filepath.Join(t.TempDir(), "no-qemu-img")
	data := randomBytes(4096, 4)
	r.api.images.add("img_q", data, "node_ipmi")
	_, err := r.acts.StageImage(context.Background(), stageReq(ipmiRef(), "img_q", images.FormatQCOW2, data))
	appErr(t, err, metal.ErrTypeUnsupported, true)
	if !strings.Contains(err.Error(), "qemu-utils") || len(r.api.images.fetches()) != 0 {
		t.Fatalf("error %v after %d fetches, want Unsupported naming qemu-utils and no fetch", err, len(r.api.images.fetches()))
	}
}

func requireQemuImg(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img is not installed (Debian package qemu-utils)")
	}
	return p
}

// A qcow2 image is converted to raw into the cache: the answer is the raw
// bytes' digest and size, the boot server serves the raw bytes, and a
// second staging is a cache hit. A qcow2 with a backing file (bytes
// outside the signed image) is refused.
func TestStageImageQCOW2(t *testing.T) {
	qemuImg := requireQemuImg(t)
	r := newRig(t)
	ctx := context.Background()
	if _, err := r.acts.BootRamdisk(ctx, metal.BootRequest{Machine: ipmiRef(), BootID: "boot_pxe", Purpose: "deploy"}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	raw := append(randomBytes(1<<20, 5), make([]byte, 1<<20)...)
	rawPath, qcowPath := filepath.Join(dir, "disk.raw"), filepath.Join(dir, "disk.qcow2")
	if err := os.WriteFile(rawPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(qemuImg, "convert", "-f", "raw", "-O", "qcow2", rawPath, qcowPath).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v: %s", err, out)
	}
	qcow := mustRead(t, qcowPath)
	r.api.images.add("img_qcow", qcow, "node_ipmi")
	req := stageReq(ipmiRef(), "img_qcow", images.FormatQCOW2, qcow)
	started := time.Now()
	res, err := r.acts.StageImage(ctx, req)
	if err != nil {
		t.Fatalf("StageImage of a qcow2: %v", err)
	}
	t.Logf("staged a %d-byte qcow2 as %d raw bytes in %v", len(qcow), len(raw), time.Since(started))
	if res.SHA256 != sum(raw) || res.SizeBytes != int64(len(raw)) || res.Cached ||
		res.URL != r.bootURL+"/images/node_ipmi/"+sum(raw) {
		t.Fatalf("StageImage = %+v, want the raw conversion's digest %s and size %d", res, sum(raw), len(raw))
	}
	code, b, _ := get(t, res.URL, "Authorization", "Bearer "+testBootToken+"2")
	if code != http.StatusOK || !bytes.Equal(b, raw) {
		t.Fatalf("GET the converted image = %d (%d bytes), want the raw bytes", code, len(b))
	}
	if exists(filepath.Join(r.bootDir, imagesDir, blobsDir, req.SHA256)) {
		t.Fatal("the qcow2 remains in the cache beside its conversion")
	}
	again, err := r.acts.StageImage(ctx, req)
	if err != nil || !again.Cached || again.SHA256 != res.SHA256 || again.SizeBytes != res.SizeBytes {
		t.Fatalf("StageImage again = %+v, %v; want the cached conversion", again, err)
	}
	if n := len(r.api.images.fetches()); n != 1 {
		t.Fatalf("%d fetches, want 1", n)
	}

	// A qcow2 over a backing file on the site's host.
	backed := filepath.Join(dir, "backed.qcow2")
	if out, err := exec.Command(qemuImg, "create", "-f", "qcow2", "-b", rawPath, "-F", "raw", backed).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	bq := mustRead(t, backed)
	r.api.images.add("img_backed", bq, "node_ipmi")
	breq := stageReq(ipmiRef(), "img_backed", images.FormatQCOW2, bq)
	_, err = r.acts.StageImage(ctx, breq)
	appErr(t, err, string(core.CodeInvalidInput), true)
	if !strings.Contains(err.Error(), "backing file") {
		t.Fatalf("the refusal does not say why: %v", err)
	}
	if exists(filepath.Join(r.bootDir, imagesDir, blobsDir, breq.SHA256)) ||
		exists(filepath.Join(r.bootDir, imagesDir, conversionsDir, breq.SHA256)) {
		t.Fatal("a refused qcow2 was kept")
	}
}

// Every registered boot's configuration carries the agent endpoint as the
// machines reach it (bcd site --machine-agent-endpoint).
func TestBootConfigAgentEndpoint(t *testing.T) {
	r := newRig(t)
	bs := newBootServer(BootOptions{Images: r.boot.images, MachineAgentEndpoint: "10.0.2.2:7443"}, "", machineAPIURL,
		t.TempDir(), r.acts.t.a.log)
	srv := httptest.NewServer(bs.handler())
	t.Cleanup(srv.Close)
	bs.startTerm(r.acts.t)
	acts := &metalActivities{t: r.acts.t, bmc: r.bmc, boot: bs}
	if _, err := acts.BootRamdisk(context.Background(), metal.BootRequest{Machine: ipmiRef(), BootID: "boot_pxe", Purpose: "deploy"}); err != nil {
		t.Fatal(err)
	}
	code, body, _ := get(t, srv.URL+"/boot/boot_pxe/boot.json")
	if code != http.StatusOK || !strings.Contains(string(body), `"agentEndpoint":"10.0.2.2:7443"`) {
		t.Fatalf("GET boot.json = %d %s, want the agent endpoint", code, body)
	}
}

// The boot device is set through the Redfish driver on the emulator and
// read back there (BootSourceOverrideTarget and whether it persists);
// the simulated machine's override is what was asked.
func TestSetBootDeviceOnEmulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := newRig(t)
	r.withDrivers()
	e, err := emulator.New(emulator.Config{Username: "admin", Password: testPassword, TaskDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	m := sim.New(sim.Config{Info: machines.Info{UUID: "8d2c1f7e-0c1b-4a2d-9e3f-665544332211", SerialNumber: "SIM-SITE-2",
		Manufacturer: "Better Compute", Model: "Simulated", MAC: "52:54:00:12:34:98", CPUs: 2, MemoryMiB: 4096}})
	b, err := e.AddBMC("bmc-2", m)
	if err != nil {
		t.Fatal(err)
	}
	r.api.nodes["node_rf"] = protocol.SiteBMCCredentialsResult{NodeID: "node_rf", Redfish: &protocol.BMCCredentials{
		Address: b.URL(), Username: "admin", Password: testPassword, CAPEM: string(e.CAPEM())}}
	ref := metal.MachineRef{NodeID: "node_rf", SiteID: "site_1", RedfishAddress: b.URL()}

	for _, c := range []struct {
		device     string
		persistent bool
		want       drivers.BootDevice
	}{{"disk", true, drivers.BootDisk}, {"pxe", false, drivers.BootPXE}, {"cd", false, drivers.BootCD}, {"disk", true, drivers.BootDisk}} {
		res, err := r.acts.SetBootDevice(ctx, metal.BootDeviceRequest{Machine: ref, Device: c.device, Persistent: c.persistent})
		if err != nil || res.Device != c.device || res.Persistent != c.persistent || res.Driver != drivers.DriverRedfish {
			t.Fatalf("SetBootDevice %s persistent=%t = %+v, %v", c.device, c.persistent, res, err)
		}
		if ov, _ := m.BootOverride(ctx); ov.Target != c.want || ov.Persistent != c.persistent {
			t.Fatalf("the machine's override after SetBootDevice %s = %+v", c.device, ov)
		}
	}
	// An acknowledged write the BMC never applies is seen on read-back.
	b.SetFaults(emulator.Faults{AckNotApply: emulator.Always})
	_, err = r.acts.SetBootDevice(ctx, metal.BootDeviceRequest{Machine: ref, Device: "pxe", Persistent: true})
	appErr(t, err, metal.ErrTypeNotApplied, true)
	b.SetFaults(emulator.Faults{})

	_, err = r.acts.SetBootDevice(ctx, metal.BootDeviceRequest{Machine: ref, Device: "floppy"})
	appErr(t, err, string(core.CodeInvalidInput), true)
	if strings.Contains(r.logs.String(), testPassword) {
		t.Fatal("the BMC password is in the logs")
	}
}

// BenchmarkStageImage measures staging throughput: a 64 MiB raw image
// fetched over loopback HTTP from the API's endpoint, hashed and written
// to the cache (each iteration into an empty cache).
func BenchmarkStageImage(b *testing.B) {
	r := newRig(b)
	data := randomBytes(64<<20, 6)
	r.api.images.add("img_bench", data, "node_ipmi")
	req := stageReq(ipmiRef(), "img_bench", images.FormatRaw, data)
	cache := filepath.Join(r.bootDir, imagesDir)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if err := os.RemoveAll(cache); err != nil && !errors.Is(err, os.ErrNotExist) {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := r.acts.StageImage(context.Background(), req)
		if err != nil || res.Cached {
			b.Fatalf("StageImage = %+v, %v", res, err)
		}
	}
}

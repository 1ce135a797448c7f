package firstboot_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk"
	"github.com/better-compute/better-compute/agent/ramdisk/image/imagetest"
	coreinv "github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/qemu"
	"github.com/better-compute/better-compute/internal/testutil"
)

// recorder is the host's side of a VM's first boot: it keeps what reached
// each path and refuses it, so the guest's agent stops there.
type recorder struct {
	// deploy, when set, answers a request first (true when it did).
	deploy func(w http.ResponseWriter, req *http.Request) bool

	mu    sync.Mutex
	calls map[string][][]byte
	first map[string]time.Time
}

func newRecorder() *recorder {
	return &recorder{calls: map[string][][]byte{}, first: map[string]time.Time{}}
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	deploy := r.deploy
	r.mu.Unlock()
	if deploy != nil && deploy(w, req) {
		return
	}
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(req.Body)
	r.mu.Lock()
	if _, ok := r.first[req.URL.Path]; !ok {
		r.first[req.URL.Path] = time.Now()
	}
	r.calls[req.URL.Path] = append(r.calls[req.URL.Path], buf.Bytes())
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_, _ = w.Write([]byte(`{"error":{"code":"ACCESS_DENIED","message":"recorded"}}`))
}

func (r *recorder) got(path string) ([]byte, time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.calls[path]) == 0 {
		return nil, time.Time{}, false
	}
	return r.calls[path][0], r.first[path], true
}

// consoleMarks records when each line first shows on a machine's console.
type consoleMarks struct {
	console *machines.Ring
	seen    map[string]time.Time
}

func (c *consoleMarks) check(lines ...string) {
	log := c.console.Bytes()
	for _, l := range lines {
		if _, ok := c.seen[l]; !ok && bytes.Contains(log, []byte(l)) {
			c.seen[l] = time.Now()
		}
	}
}

// TestDiskBootsFindsItsSeedAndJoins boots the test disk in a QEMU TCG
// machine from its virtual disk, where the ramdisk's deploy steps wrote it
// and a seed partition whose SeedJoin names a server on the host (10.0.2.2
// from the guest):
// the disk's /init finds the seed and bcd posts the join with the boot's
// token and an inventory of the machine's hardware. Then the machine,
// asked to boot its CD, boots the ramdisk there and not its disk. It also
// logs the disk boot's timings.
func TestDiskBootsFindsItsSeedAndJoins(t *testing.T) {
	dir := t.TempDir()
	disk := imagetest.Disk(t, dir)
	rec := newRecorder()
	srv := httptest.NewServer(rec)
	defer srv.Close()
	port := srv.URL[strings.LastIndex(srv.URL, ":")+1:]
	apiURL := "http://10.0.2.2:" + port

	info := machines.Info{UUID: "5b1e3c0a-7d2f-4e8b-9a61-0c4d2e7f8a19", SerialNumber: "DISK-SERIAL-1",
		Manufacturer: "Better Compute", Model: "TestDisk VM", MAC: "52:54:00:d1:5c:01", CPUs: 1, MemoryMiB: 512}
	m, err := qemu.New(qemu.Config{Info: info, Dir: dir + "/vm", DiskMiB: 128, CDMode: qemu.ModeDirect})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// The deploy, in process: the real ramdisk's write-image and
	// write-seed steps write the VM's disk file (as a simulated machine's
	// ramdisk does), naming the API as the guest reaches it.
	token := protocol.BootTokenPrefix + "disk-boot-token"
	deploy(t, rec, m.DiskPath(), disk.Image, protocol.RamdiskBootConfig{APIURL: apiURL, Token: token, BootID: "mbt_disk1", Purpose: "deploy"})
	join := protocol.SeedJoin{APIURL: apiURL, Token: token, NodeID: "node_disk1"}

	ctx := context.Background()
	if err := m.SetBootOverride(ctx, drivers.BootDisk, false); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := m.PowerOn(ctx); err != nil {
		t.Fatal(err)
	}
	const (
		biosDisk  = "Booting from Hard Disk"
		syslinux  = "SYSLINUX 6"
		firstLine = "bcd-init: loading modules"
		bcdStart  = "starting bcd node firstboot"
	)
	marks := &consoleMarks{console: m.Console(), seen: map[string]time.Time{}}
	var body []byte
	var joinedAt time.Time
	testutil.EventuallyNil(t, 60*time.Second, func() error {
		marks.check(biosDisk, syslinux, firstLine, bcdStart)
		b, at, ok := rec.got(protocol.JoinPath)
		if !ok {
			return &waiting{what: "the join request", console: m.SerialLog()}
		}
		body, joinedAt = b, at
		return nil
	})
	marks.check(biosDisk, syslinux, firstLine, bcdStart)
	t.Logf("disk boot under TCG: power on → SeaBIOS boots the disk %s, → syslinux %s, → init's first line %s, → bcd started %s, → join request %s",
		since(start, marks.seen[biosDisk]), since(start, marks.seen[syslinux]), since(start, marks.seen[firstLine]),
		since(start, marks.seen[bcdStart]), joinedAt.Sub(start).Round(10*time.Millisecond))

	var req protocol.JoinRequest
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatalf("join body %q: %v", body, err)
	}
	if req.Token != join.Token {
		t.Errorf("join token %q, want the seed's", req.Token)
	}
	if req.Name != "disk-one" {
		t.Errorf("join name %q, want meta-data's local-hostname", req.Name)
	}
	if !strings.Contains(req.CSR, "CERTIFICATE REQUEST") {
		t.Errorf("join CSR %q", req.CSR)
	}
	var inv coreinv.NodeInventory
	if err := json.Unmarshal(req.Inventory, &inv); err != nil {
		t.Fatal(err)
	}
	if err := inv.Validate(); err != nil {
		t.Errorf("inventory: %v", err)
	}
	if inv.System.ProductUUID != info.UUID || inv.System.SerialNumber != info.SerialNumber {
		t.Errorf("inventory's DMI identity %q/%q, want the machine's %q/%q", inv.System.ProductUUID, inv.System.SerialNumber, info.UUID, info.SerialNumber)
	}
	var macs []string
	for _, n := range inv.NICs {
		macs = append(macs, n.MAC)
	}
	if !strings.Contains(strings.Join(macs, " "), info.MAC) {
		t.Errorf("inventory's NICs %v lack the machine's %s", macs, info.MAC)
	}
	var disks []string
	for _, d := range inv.Disks {
		disks = append(disks, d.Name)
		if d.Name == "vda" && d.SizeBytes != 128<<20 {
			t.Errorf("disk vda is %d bytes, want 128 MiB", d.SizeBytes)
		}
	}
	if !strings.Contains(strings.Join(disks, " "), "vda") {
		t.Errorf("inventory's disks %v lack vda", disks)
	}

	// After the deploy, a ramdisk boot (a re-inspection, a re-deploy)
	// still boots the CD when asked, not the disk.
	iso := imagetest.ISO(t, imagetest.Base(t, dir), protocol.RamdiskBootConfig{APIURL: apiURL, Token: protocol.BootTokenPrefix + "ramdisk-boot", Purpose: "inspect"}, dir)
	if err := m.InsertMedia(ctx, machines.Media{Kind: machines.MediaCD, Path: iso}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetBootOverride(ctx, drivers.BootCD, false); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := m.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyNil(t, 60*time.Second, func() error {
		if _, _, ok := rec.got(protocol.RamdiskReportPath); !ok {
			return &waiting{what: "the ramdisk's report", console: m.SerialLog()}
		}
		return nil
	})
	b, at, _ := rec.got(protocol.RamdiskReportPath)
	var report protocol.RamdiskReport
	if err := json.Unmarshal(b, &report); err != nil || report.Token != protocol.BootTokenPrefix+"ramdisk-boot" {
		t.Errorf("report %s: %v", b, err)
	}
	t.Logf("CD boot after the disk: reset → ramdisk report %s", at.Sub(start).Round(10*time.Millisecond))
}

func since(start, at time.Time) string {
	if at.IsZero() {
		return "(not seen)"
	}
	return at.Sub(start).Round(10 * time.Millisecond).String()
}

type waiting struct {
	what    string
	console []byte
}

func (w *waiting) Error() string {
	c := string(w.console)
	if len(c) > 3000 {
		c = c[len(c)-3000:]
	}
	return "still waiting for " + w.what + "; console:\n" + c
}

// deploy writes the test disk's image and its seed into diskFile with the
// ramdisk's own deploy steps, run in process against rec (which serves the
// image and the seed until the ramdisk powers off). Its HTTP client
// reaches cfg.APIURL, the guest's view of the host, on the host's loopback.
func deploy(t *testing.T, rec *recorder, diskFile, img string, cfg protocol.RamdiskBootConfig) {
	t.Helper()
	imgBytes, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(imgBytes)
	st, err := os.Stat(diskFile)
	if err != nil {
		t.Fatal(err)
	}
	steps := []protocol.RamdiskStep{
		{Name: protocol.StepWriteImage, Args: map[string]string{"url": cfg.APIURL + "/image.raw", "sha256": hex.EncodeToString(sum[:]), "sizeBytes": fmt.Sprint(len(imgBytes))}},
		{Name: protocol.StepWriteSeed},
		{Name: protocol.StepPowerOff},
	}
	serve := func(w http.ResponseWriter, req *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		switch req.URL.Path {
		case "/image.raw":
			http.ServeContent(w, req, "image.raw", time.Time{}, bytes.NewReader(imgBytes))
		case protocol.RamdiskReportPath:
			_ = json.NewEncoder(w).Encode(protocol.RamdiskInstructions{NodeID: "node_disk1", Steps: steps})
		case protocol.RamdiskResultPath:
			var res protocol.RamdiskResult
			_ = json.NewDecoder(req.Body).Decode(&res)
			for _, r := range res.Results {
				if !r.OK {
					t.Errorf("deploy step %s failed: %s", r.Name, r.Message)
				}
			}
			_ = json.NewEncoder(w).Encode(protocol.RamdiskInstructions{NodeID: "node_disk1", Steps: []protocol.RamdiskStep{}})
		case protocol.RamdiskSeedPath:
			_ = json.NewEncoder(w).Encode(protocol.RamdiskSeed{NodeID: "node_disk1", WorkflowID: "wf_disk1", MetaData: "instance-id: wf_disk1\nlocal-hostname: disk-one\n"})
		default:
			return false
		}
		return true
	}
	rec.mu.Lock()
	rec.deploy = serve
	rec.mu.Unlock()
	defer func() {
		rec.mu.Lock()
		rec.deploy = nil
		rec.mu.Unlock()
	}()
	u, err := url.Parse(cfg.APIURL)
	if err != nil {
		t.Fatal(err)
	}
	hostLoopback := "127.0.0.1:" + u.Port()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, hostLoopback)
		}}}
	inv := &coreinv.NodeInventory{Kind: coreinv.Kind, Version: coreinv.Version, AgentVersion: "bcd/test",
		System: coreinv.System{Architecture: "x86_64", ProductUUID: "5b1e3c0a-7d2f-4e8b-9a61-0c4d2e7f8a19"},
		CPU:    coreinv.CPU{Sockets: 1, CoresPerSocket: 1, ThreadsPerCore: 1, LogicalCPUs: 1, NUMANodes: 1},
		Memory: coreinv.Memory{TotalBytes: 512 << 20},
		Disks:  []coreinv.Disk{{Name: "vda", SizeBytes: st.Size(), Transport: "virtio"}},
		GPUs:   coreinv.GPUs{Devices: []coreinv.GPU{}}}
	agent := &ramdisk.Agent{Config: cfg, Client: client, RetryMin: time.Millisecond,
		Machine: &ramdisk.Simulated{Document: inv, DiskFiles: map[string]string{"vda": diskFile}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := agent.Run(ctx); err != nil {
		t.Fatalf("deploy: %v", err)
	}
}

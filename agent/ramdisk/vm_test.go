package ramdisk_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image/imagetest"
	coreinv "github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/qemu"
	"github.com/better-compute/better-compute/internal/testutil"
)

const (
	vmMAC      = "52:54:00:b0:07:01"
	vmDiskSize = 64 << 20
	mib        = 1 << 20
)

// The disk's layout: an MBR with one partition from 1 MiB to 63 MiB, and
// markers where the wipe must reach (both ends of the disk and of the
// partition) and where it must not (the middle).
var diskMarks = []struct {
	off   int64
	wiped bool
}{
	{off: 1*mib + 1024, wiped: true},     // a filesystem superblock at the partition's start
	{off: 63*mib - 4096, wiped: true},    // the partition's last MiB
	{off: vmDiskSize - 512, wiped: true}, // a backup GPT header
	{off: 32 * mib, wiped: false},        // data the wipe leaves alone
}

const marker = "BETTER-COMPUTE-MARK"

func writeVMDisk(t *testing.T, p string) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(vmDiskSize); err != nil {
		t.Fatal(err)
	}
	mbr := make([]byte, 512)
	entry := mbr[446:462]
	entry[4] = 0x83 // Linux
	binary.LittleEndian.PutUint32(entry[8:], 1*mib/512)
	binary.LittleEndian.PutUint32(entry[12:], 62*mib/512)
	mbr[510], mbr[511] = 0x55, 0xaa
	if _, err := f.WriteAt(mbr, 0); err != nil {
		t.Fatal(err)
	}
	for _, m := range diskMarks {
		if _, err := f.WriteAt([]byte(marker), m.off); err != nil {
			t.Fatal(err)
		}
	}
}

// vmPieces builds what a site serves a machine: the base pieces and the
// ISO of one boot.
func vmPieces(t *testing.T, cfg protocol.RamdiskBootConfig) (iso string) {
	t.Helper()
	dir := t.TempDir()
	return imagetest.ISO(t, imagetest.Base(t, dir), cfg, dir)
}

// vmAPI is the control plane as a booted ramdisk sees it: it checks the
// report against the VM's hardware and answers wipe-disks then power-off,
// or, with an image, wipe-disks, then (once the test read the wiped disk)
// write-image, write-seed and power-off, serving the image and the seed.
type vmAPI struct {
	t     *testing.T
	token string
	start time.Time

	mu        sync.Mutex
	reportAt  time.Duration
	inventory *coreinv.NodeInventory
	results   []protocol.RamdiskStepResult
	// image, imageURL (the guest's view of /image) and seed make the
	// boot a deploy; disk is the VM's disk file, and wiped what it held
	// when the wipe's result came.
	image    []byte
	imageURL string
	seed     protocol.RamdiskSeed
	disk     string
	wiped    []byte
	wipedAt  time.Duration
	deployAt time.Duration
}

func (a *vmAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch r.URL.Path {
	case protocol.RamdiskReportPath:
		var rep protocol.RamdiskReport
		if err := json.NewDecoder(r.Body).Decode(&rep); err != nil || rep.Token != a.token {
			http.Error(w, `{"error":"bad token"}`, http.StatusUnauthorized)
			return
		}
		var inv coreinv.NodeInventory
		if err := json.Unmarshal(rep.Inventory, &inv); err != nil {
			a.t.Errorf("inventory: %v", err)
		}
		if a.inventory == nil {
			a.reportAt = time.Since(a.start)
		}
		a.inventory = &inv
		steps := []protocol.RamdiskStep{{Name: protocol.StepWipeDisks}, {Name: protocol.StepPowerOff}}
		if a.image != nil {
			steps = steps[:1]
		}
		_ = json.NewEncoder(w).Encode(protocol.RamdiskInstructions{NodeID: "node-vm", Steps: steps})
	case protocol.RamdiskResultPath:
		var res protocol.RamdiskResult
		if err := json.NewDecoder(r.Body).Decode(&res); err != nil || res.Token != a.token {
			http.Error(w, `{"error":"bad token"}`, http.StatusUnauthorized)
			return
		}
		a.results = append(a.results, res.Results...)
		next := []protocol.RamdiskStep{}
		if a.image != nil && len(res.Results) == 1 && res.Results[0].Name == protocol.StepWipeDisks {
			// The guest synced the wipe: the disk file shows it now.
			b, err := os.ReadFile(a.disk)
			if err != nil {
				a.t.Errorf("read the wiped disk: %v", err)
			}
			a.wiped, a.wipedAt = b, time.Since(a.start)
			next = []protocol.RamdiskStep{writeImageStep(a.imageURL, a.image), {Name: protocol.StepWriteSeed}, {Name: protocol.StepPowerOff}}
		}
		if len(res.Results) == 1 && res.Results[0].Name == protocol.StepWriteImage {
			a.deployAt = time.Since(a.start)
		}
		_ = json.NewEncoder(w).Encode(protocol.RamdiskInstructions{NodeID: "node-vm", Steps: next})
	case protocol.RamdiskSeedPath:
		var req protocol.RamdiskSeedRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Token != a.token || a.image == nil {
			http.Error(w, `{"error":"bad token"}`, http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(a.seed)
	case "/image":
		if r.Header.Get("Authorization") != "Bearer "+a.token || a.image == nil {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		http.ServeContent(w, r, "image.raw", time.Time{}, bytes.NewReader(a.image))
	default:
		http.NotFound(w, r)
	}
}

// serveOnLoopback serves h on the host's loopback, which QEMU's user-mode
// network shows the guest as 10.0.2.2.
func serveOnLoopback(t *testing.T, h http.Handler) (port int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return l.Addr().(*net.TCPAddr).Port
}

// vmInfo is the emulated machine's identity, which its SMBIOS tables
// carry into the guest's DMI.
var vmInfo = machines.Info{
	UUID: "6b1e2f0a-5c3d-4e7f-9a0b-1c2d3e4f5a6b", SerialNumber: "BC-RAMDISK-VM-1",
	Manufacturer: "Better Compute", Model: "Emulated TCG", MAC: vmMAC, CPUs: 1, MemoryMiB: 512,
}

// bootMachine boots the ISO from the CD of a QEMU machine (the one behind
// the Redfish emulator) in the given mode and waits for the guest to power
// itself off. prepareDisk writes the disk first.
func bootMachine(t *testing.T, iso string, mode qemu.BootMode, prepareDisk func(path string)) (m *qemu.Machine, took time.Duration) {
	t.Helper()
	m, err := qemu.New(qemu.Config{Info: vmInfo, DiskMiB: vmDiskSize / mib, CDMode: mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	prepareDisk(m.DiskPath())
	ctx := context.Background()
	if err := m.InsertMedia(ctx, machines.Media{Kind: machines.MediaCD, Path: iso}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetBootOverride(ctx, drivers.BootCD, false); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := m.PowerOn(ctx); err != nil {
		t.Fatal(err)
	}
	off := false
	ok := testutil.Until(ctxTimeout(t, 3*time.Minute), func() bool {
		s, err := m.PowerState(ctx)
		off = err == nil && s == drivers.PowerOff
		return off
	})
	took = time.Since(start)
	if !ok {
		t.Fatalf("the guest did not power off; console:\n%s", m.SerialLog())
	}
	return m, took
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestRamdiskInAVMReportsItsHardwareWipesItsDiskAndPowersOff boots the ISO's
// kernel and initramfs in a QEMU machine's direct mode (from its virtual CD),
// and checks that the ramdisk inside reaches the API on the host, reports the
// VM's disk and NIC, wipes the disk, then deploys: writes an image to the
// virtual disk (a Linux block device, BLKRRPART and all) from the host over
// HTTP and its NoCloud seed after it, and powers the VM off.
func TestRamdiskInAVMReportsItsHardwareWipesItsDiskAndPowersOff(t *testing.T) {
	api := &vmAPI{t: t, token: protocol.BootTokenPrefix + "vm-test-token"}
	port := serveOnLoopback(t, api)
	cfg := protocol.RamdiskBootConfig{APIURL: fmt.Sprintf("http://10.0.2.2:%d", port), Token: api.token, BootID: "boot-vm", Purpose: "provide"}
	iso := vmPieces(t, cfg)
	// A 16 MiB image: an MBR and a partition from 1 MiB to 12 MiB.
	image := partitionedImage(t, "mbr", 16*mib, 12*mib)
	seed := protocol.RamdiskSeed{NodeID: "node-vm", WorkflowID: "wf_vm", MetaData: "instance-id: node-vm\n", UserData: "#cloud-config\n"}

	api.mu.Lock()
	api.start = time.Now()
	api.image, api.imageURL, api.seed = image, cfg.APIURL+"/image", seed
	api.mu.Unlock()
	m, took := bootMachine(t, iso, qemu.ModeDirect, func(p string) {
		writeVMDisk(t, p)
		api.mu.Lock()
		api.disk = p
		api.mu.Unlock()
	})
	console := string(m.SerialLog())
	disk := m.DiskPath()

	api.mu.Lock()
	defer api.mu.Unlock()
	if api.inventory == nil {
		t.Fatalf("no report; console:\n%s", console)
	}
	t.Logf("boot → report %s, → wiped %s, → image written (%d MiB) %s, → power off (QEMU exit) %s", api.reportAt.Round(time.Millisecond),
		api.wipedAt.Round(time.Millisecond), len(image)/mib, api.deployAt.Round(time.Millisecond), took.Round(time.Millisecond))
	inv := api.inventory
	var vda *coreinv.Disk
	for i := range inv.Disks {
		if inv.Disks[i].Name == "vda" {
			vda = &inv.Disks[i]
		}
	}
	if vda == nil || vda.SizeBytes != vmDiskSize || len(inv.Disks) != 1 {
		t.Errorf("disks = %+v, want one vda of %d bytes", inv.Disks, vmDiskSize)
	}
	if len(inv.NICs) != 1 || inv.NICs[0].MAC != vmMAC || inv.NICs[0].Driver != "virtio_net" {
		t.Errorf("nics = %+v, want one virtio_net with %s", inv.NICs, vmMAC)
	}
	if inv.System.ProductUUID != vmInfo.UUID || inv.System.SerialNumber != vmInfo.SerialNumber || inv.System.Vendor != vmInfo.Manufacturer {
		t.Errorf("system = %+v, want the machine's SMBIOS identity %+v", inv.System, vmInfo)
	}
	if inv.CPU.LogicalCPUs != 1 || inv.Memory.TotalBytes < 400*mib || inv.Memory.TotalBytes > 512*mib {
		t.Errorf("cpu %+v, memory %d", inv.CPU, inv.Memory.TotalBytes)
	}
	if len(api.results) != 4 || api.results[0].Name != protocol.StepWipeDisks || !api.results[0].OK ||
		!strings.Contains(api.results[0].Message, "vda") || !strings.Contains(api.results[0].Message, "1 partitions") ||
		!api.results[1].OK || !api.results[2].OK || api.results[3].Name != protocol.StepPowerOff {
		t.Fatalf("results = %+v; console:\n%s", api.results, console)
	}
	if strings.Contains(console, api.token) {
		t.Error("the boot token is on the console")
	}
	for _, want := range []string{"bcd-init: eth0 up (" + vmMAC + ")", "reported", "percent=100", "powering off"} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q:\n%s", want, console)
		}
	}

	b := api.wiped
	if len(b) != vmDiskSize {
		t.Fatalf("the disk read after the wipe is %d bytes", len(b))
	}
	if !bytes.Equal(b[:mib], make([]byte, mib)) {
		t.Error("the disk's first MiB (the partition table) is not zero")
	}
	for _, m := range diskMarks {
		kept := string(b[m.off:m.off+int64(len(marker))]) == marker
		if kept == m.wiped {
			t.Errorf("marker at %d: kept %v, want wiped %v", m.off, kept, m.wiped)
		}
	}

	// The image, as the guest wrote it: all of it but the MBR's second
	// entry, which write-seed filled.
	after := readPrefix(t, disk, len(image))
	entry2 := 446 + 16
	if sha(after[:entry2]) != sha(image[:entry2]) || sha(after[entry2+16:]) != sha(image[entry2+16:]) {
		t.Error("the disk does not hold the image")
	}
	checkSeed(t, disk, "mbr", seed, protocol.SeedJoin{APIURL: cfg.APIURL, Token: api.token, NodeID: "node-vm"})
}

// TestRamdiskISOBootsThroughSeaBIOS boots the ISO itself (SeaBIOS, El
// Torito, isolinux) to measure that path; it is slower than a direct boot
// and runs only when BETTER_COMPUTE_ISO_BOOT=1.
func TestRamdiskISOBootsThroughSeaBIOS(t *testing.T) {
	if os.Getenv("BETTER_COMPUTE_ISO_BOOT") != "1" {
		t.Skip("set BETTER_COMPUTE_ISO_BOOT=1 to boot the ISO through SeaBIOS")
	}
	api := &vmAPI{t: t, token: protocol.BootTokenPrefix + "iso-test-token"}
	port := serveOnLoopback(t, api)
	cfg := protocol.RamdiskBootConfig{APIURL: fmt.Sprintf("http://10.0.2.2:%d", port), Token: api.token, Purpose: "inspect"}
	iso := vmPieces(t, cfg)
	api.mu.Lock()
	api.start = time.Now()
	api.mu.Unlock()
	m, took := bootMachine(t, iso, qemu.ModeISO, func(p string) { writeVMDisk(t, p) })
	console := string(m.SerialLog())
	api.mu.Lock()
	defer api.mu.Unlock()
	if api.inventory == nil || len(api.results) != 2 {
		t.Fatalf("report %v, results %+v; console:\n%s", api.inventory != nil, api.results, console)
	}
	t.Logf("ISO boot → report %s, → power off %s", api.reportAt.Round(time.Millisecond), took.Round(time.Millisecond))
}

package simboot_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/partition/mbr"

	"github.com/better-compute/better-compute/agent/firstboot/firstboottest"
	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image"
	"github.com/better-compute/better-compute/agent/ramdisk/simboot"
	coreinv "github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines/sim"
	"github.com/better-compute/better-compute/internal/testutil"
)

// installed lays out what a deploy leaves on a disk file: an image's MBR
// with one partition, then the seed after it.
func installed(t *testing.T, disk string, seed *protocol.SeedJoin) {
	t.Helper()
	d, err := diskfs.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	table := &mbr.Table{LogicalSectorSize: 512, PhysicalSectorSize: 512,
		Partitions: []*mbr.Partition{{Index: 1, Bootable: true, Type: mbr.Linux, Start: 2048, Size: 62 << 20 / 512}}}
	if err := d.Partition(table); err != nil {
		t.Fatal(err)
	}
	d.Close()
	if seed == nil {
		return
	}
	raw, err := json.Marshal(seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := image.AddSeedPartition(disk, image.MinDiskMiB, map[string][]byte{
		protocol.SeedJoinFile: raw, "meta-data": []byte("instance-id: wf_sim\nlocal-hostname: sim-one\n"),
	}); err != nil {
		t.Fatal(err)
	}
}

type sessions struct {
	mu  sync.Mutex
	ids []join.Identity
}

func (s *sessions) run(ctx context.Context, _ sim.Boot, id join.Identity) error {
	s.mu.Lock()
	s.ids = append(s.ids, id)
	s.mu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

func (s *sessions) get() []join.Identity {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]join.Identity(nil), s.ids...)
}

func TestDiskBootWithASeedJoinsWithTheRamdisksInventoryThenRunsTheSession(t *testing.T) {
	api := firstboottest.New(t, "node-sim", "https://joined.example:8444")
	srv := httptest.NewServer(api)
	defer srv.Close()
	disk := filepath.Join(t.TempDir(), "disk.raw")
	var ss sessions
	e := &ends{}
	m := sim.New(sim.Config{Info: info, DiskPath: disk, DiskBytes: 256 << 20,
		Hook: simboot.Hook(simboot.Options{APIURL: srv.URL, AgentEndpoint: "https://127.0.0.1:1", RetryMin: time.Millisecond, Session: ss.run, Done: e.done})})
	defer m.Close()
	p, err := m.Disk()
	if err != nil {
		t.Fatal(err)
	}
	// The seed names the API as a VM sees it; the hook's APIURL wins.
	installed(t, p, &protocol.SeedJoin{APIURL: "http://10.0.2.2:1", Token: protocol.BootTokenPrefix + "deploy", NodeID: "node-sim"})

	ctx := context.Background()
	if err := m.SetBootOverride(ctx, drivers.BootDisk, true); err != nil {
		t.Fatal(err)
	}
	if err := m.PowerOn(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the installed system's session", func() bool { return len(ss.get()) == 1 })
	reqs := api.Requests()
	if len(reqs) != 1 || reqs[0].Token != protocol.BootTokenPrefix+"deploy" || reqs[0].Name != "sim-one" {
		t.Fatalf("joins %+v, want one with the seed's token and meta-data's hostname", reqs)
	}
	var inv coreinv.NodeInventory
	if err := json.Unmarshal(reqs[0].Inventory, &inv); err != nil {
		t.Fatal(err)
	}
	want := simboot.InventoryFor(info)
	if coreinv.ComputeHardwareKey(&inv).Key != coreinv.ComputeHardwareKey(want).Key || inv.System.SerialNumber != info.SerialNumber {
		t.Errorf("the first boot's inventory %+v has another hardware key than the ramdisk's", inv.System)
	}
	if len(inv.Disks) != 1 || inv.Disks[0].SizeBytes != 256<<20 {
		t.Errorf("disks %+v, want the machine's 256 MiB disk", inv.Disks)
	}
	if id := ss.get()[0]; id.NodeID != "node-sim" || id.AgentEndpoint != "https://127.0.0.1:1" {
		t.Errorf("session as %s against %s", id.NodeID, id.AgentEndpoint)
	}

	// A reboot of the installed system keeps its identity: no second join.
	if err := m.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the session after the reboot", func() bool { return len(ss.get()) == 2 })
	if n := len(api.Requests()); n != 1 {
		t.Errorf("%d joins after a reboot, want the first one only", n)
	}
	for _, err := range e.get() {
		if err != nil {
			t.Errorf("a boot ended with %v", err)
		}
	}
}

func TestDiskBootWithoutASeedDoesNothing(t *testing.T) {
	api := firstboottest.New(t, "node-sim", "")
	srv := httptest.NewServer(api)
	defer srv.Close()
	for name, seed := range map[string]bool{"an empty disk": false, "an image without a seed": true} {
		t.Run(name, func(t *testing.T) {
			e := &ends{}
			m := sim.New(sim.Config{Info: info, DiskBytes: 128 << 20, Hook: simboot.Hook(simboot.Options{APIURL: srv.URL, Done: e.done})})
			defer m.Close()
			if seed {
				p, err := m.Disk()
				if err != nil {
					t.Fatal(err)
				}
				installed(t, p, nil)
			}
			if err := m.PowerOn(context.Background()); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 10*time.Second, "the boot hook to return", func() bool { return len(e.get()) == 1 })
			if err := e.get()[0]; err != nil {
				t.Errorf("boot ended with %v", err)
			}
		})
	}
	if n := len(api.Requests()); n != 0 {
		t.Errorf("%d joins from disks without a seed", n)
	}
}

// deployAPI is the control plane of a simulated deploy: the ramdisk's
// report is answered write-image, write-seed and reboot; the seed endpoint
// answers the workflow's seed; the join is firstboottest's.
type deployAPI struct {
	join   *firstboottest.JoinAPI
	token  string
	steps  []protocol.RamdiskStep
	mu     sync.Mutex
	report *coreinv.NodeInventory
	res    []protocol.RamdiskStepResult
}

func (a *deployAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == protocol.JoinPath {
		a.join.ServeHTTP(w, r)
		return
	}
	var body struct {
		Token     string                       `json:"token"`
		Inventory json.RawMessage              `json:"inventory"`
		Results   []protocol.RamdiskStepResult `json:"results"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	if body.Token != a.token {
		http.Error(w, `{"error":{"code":"UNAUTHENTICATED","message":"token"}}`, http.StatusUnauthorized)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case protocol.RamdiskReportPath:
		var inv coreinv.NodeInventory
		_ = json.Unmarshal(body.Inventory, &inv)
		a.report = &inv
		_ = json.NewEncoder(w).Encode(protocol.RamdiskInstructions{NodeID: "node-sim", Steps: a.steps})
	case protocol.RamdiskResultPath:
		a.res = append(a.res, body.Results...)
		_ = json.NewEncoder(w).Encode(protocol.RamdiskInstructions{NodeID: "node-sim", Steps: []protocol.RamdiskStep{}})
	case protocol.RamdiskSeedPath:
		_ = json.NewEncoder(w).Encode(protocol.RamdiskSeed{NodeID: "node-sim", WorkflowID: "wf_sim", MetaData: "instance-id: wf_sim\nlocal-hostname: sim-deployed\n"})
	default:
		http.NotFound(w, r)
	}
}

func (a *deployAPI) results() []protocol.RamdiskStepResult {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]protocol.RamdiskStepResult(nil), a.res...)
}

// TestSimulatedDeployWritesTheDiskRebootsAndTheInstalledSystemJoins runs a
// deploy on a simulated machine: the ramdisk of its CD boot writes an
// image and the seed into the machine's disk file and reboots; the machine
// boots its disk (its boot order), and the installed system's first boot
// joins with the deploy boot's token and the ramdisk's hardware.
func TestSimulatedDeployWritesTheDiskRebootsAndTheInstalledSystemJoins(t *testing.T) {
	// The image: an MBR with one partition, and a marker in it.
	img := filepath.Join(t.TempDir(), "image.raw")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	installed(t, img, nil)
	const marker = "INSTALLED-SYSTEM"
	f, err = os.OpenFile(img, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(marker), 2<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	imgBytes, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(imgBytes)
	images := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "image.raw", time.Time{}, bytes.NewReader(imgBytes))
	}))
	defer images.Close()

	token := protocol.BootTokenPrefix + "sim-deploy"
	api := &deployAPI{join: firstboottest.New(t, "node-sim", "https://joined.example:8444"), token: token, steps: []protocol.RamdiskStep{
		{Name: protocol.StepWriteImage, Args: map[string]string{"url": images.URL + "/image.raw", "sha256": hex.EncodeToString(sum[:]), "sizeBytes": fmt.Sprint(len(imgBytes))}},
		{Name: protocol.StepWriteSeed},
		{Name: protocol.StepReboot},
	}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	iso := bootISO(t, protocol.RamdiskBootConfig{APIURL: "http://10.0.2.2:1", Token: token, BootID: "mbt_1", Purpose: "deploy"})
	var ss sessions
	e := &ends{}
	m := sim.New(sim.Config{Info: info, DiskBytes: 1 << 30,
		Hook: simboot.Hook(simboot.Options{APIURL: srv.URL, RetryMin: time.Millisecond, Session: ss.run, Done: e.done})})
	defer m.Close()
	bootFromCD(t, m, iso)

	testutil.Eventually(t, 20*time.Second, "the installed system's session", func() bool { return len(ss.get()) == 1 })
	res := api.results()
	if len(res) != 3 || !res[0].OK || !res[1].OK || !res[2].OK {
		t.Fatalf("results %+v, want write-image, write-seed and reboot done", res)
	}
	boots := m.Boots()
	if len(boots) != 2 || boots[0].Device != drivers.BootCD || boots[1].Device != drivers.BootDisk {
		t.Fatalf("boots %+v, want the CD then the disk", boots)
	}
	disk, err := m.Disk()
	if err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(marker))
	_, err = d.ReadAt(got, 2<<20)
	d.Close()
	if err != nil || string(got) != marker {
		t.Errorf("the disk holds %q at 2 MiB, want the image's marker (%v)", got, err)
	}
	joins := api.join.Requests()
	if len(joins) != 1 || joins[0].Token != token || joins[0].Name != "sim-deployed" {
		t.Fatalf("joins %+v, want one with the deploy boot's token and the seed's hostname", joins)
	}
	var inv coreinv.NodeInventory
	if err := json.Unmarshal(joins[0].Inventory, &inv); err != nil {
		t.Fatal(err)
	}
	api.mu.Lock()
	report := api.report
	api.mu.Unlock()
	if report == nil || coreinv.ComputeHardwareKey(&inv).Key != coreinv.ComputeHardwareKey(report).Key || inv.Disks[0].SizeBytes != 1<<30 {
		t.Errorf("the installed system's inventory %+v is not the ramdisk's %+v", inv.Disks, report)
	}
	if id := ss.get()[0]; id.NodeID != "node-sim" || id.AgentEndpoint != "https://joined.example:8444" {
		t.Errorf("session as %s against %s", id.NodeID, id.AgentEndpoint)
	}
	for _, err := range e.get() {
		if err != nil {
			t.Errorf("a boot ended with %v", err)
		}
	}
}

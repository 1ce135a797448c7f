package simboot_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
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

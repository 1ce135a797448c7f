package sim_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/drivers"
	"github.com/better-compute/better-compute/drivers/machines"
	"github.com/better-compute/better-compute/drivers/machines/sim"
	"github.com/better-compute/better-compute/internal/testutil"
)

func TestBootFollowsOverrideThenOrder(t *testing.T) {
	ctx := context.Background()
	m := sim.New(sim.Config{Info: machines.Info{MAC: "52:54:00:00:00:01"}, BootOrder: []drivers.BootDevice{drivers.BootCD, drivers.BootPXE}})
	defer m.Close()
	// No media: the CD is skipped, PXE is next.
	if err := m.PowerOn(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.InsertMedia(ctx, machines.Media{Kind: machines.MediaCD, URL: "http://x/r.iso", Path: "/tmp/r.iso"}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetBootOverride(ctx, drivers.BootDisk, false); err != nil {
		t.Fatal(err)
	}
	if err := m.Reset(ctx); err != nil { // the override, once
		t.Fatal(err)
	}
	if err := m.Reset(ctx); err != nil { // the order: the CD, now inserted
		t.Fatal(err)
	}
	boots := m.Boots()
	want := []drivers.BootDevice{drivers.BootPXE, drivers.BootDisk, drivers.BootCD}
	if len(boots) != len(want) {
		t.Fatalf("boots = %+v", boots)
	}
	for i, b := range boots {
		if b.Device != want[i] || b.Seq != i+1 || b.MAC != "52:54:00:00:00:01" {
			t.Fatalf("boot %d = %+v, want from %s", i, b, want[i])
		}
	}
	if boots[2].MediaURL != "http://x/r.iso" || boots[2].MediaPath != "/tmp/r.iso" {
		t.Fatalf("CD boot = %+v", boots[2])
	}
	if ov, _ := m.BootOverride(ctx); ov.Target != "" {
		t.Fatalf("a once override survived its boot: %+v", ov)
	}
	if err := m.SetBootOverride(ctx, "tape", false); !errors.Is(err, machines.ErrUnsupported) {
		t.Fatalf("unknown device: %v", err)
	}
}

func TestHookRunsPerBootAndGuestPowersOff(t *testing.T) {
	ctx := context.Background()
	var ended atomic.Int32
	first := make(chan sim.Boot, 1)
	m := sim.New(sim.Config{Hook: func(ctx context.Context, b sim.Boot) {
		if b.Seq == 1 {
			first <- b
		}
		<-ctx.Done()
		ended.Add(1)
	}})
	defer m.Close()
	if err := m.Reset(ctx); !errors.Is(err, machines.ErrPoweredOff) {
		t.Fatalf("reset while off: %v", err)
	}
	if err := m.PowerOn(ctx); err != nil {
		t.Fatal(err)
	}
	b1 := <-first
	if err := m.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "the first boot's hook to end at the reset", func() bool { return ended.Load() == 1 })
	// The first boot is over: its guest cannot power off the second.
	b1.PowerOff()
	if s, _ := m.PowerState(ctx); s != drivers.PowerOn {
		t.Fatal("a stale boot powered the machine off")
	}
	m.Boots()[1].PowerOff()
	if s, _ := m.PowerState(ctx); s != drivers.PowerOff {
		t.Fatal("the guest's power off did not take")
	}
	testutil.Eventually(t, 5*time.Second, "the second boot's hook to end", func() bool { return ended.Load() == 2 })
}

func TestShutdownCanBeIgnored(t *testing.T) {
	ctx := context.Background()
	m := sim.New(sim.Config{IgnoreShutdown: true})
	defer m.Close()
	_ = m.PowerOn(ctx)
	_ = m.Shutdown(ctx)
	if s, _ := m.PowerState(ctx); s != drivers.PowerOn {
		t.Fatal("a guest that ignores ACPI shut down")
	}
	_ = m.PowerOff(ctx)
	if s, _ := m.PowerState(ctx); s != drivers.PowerOff {
		t.Fatal("a hard power off did not take")
	}
}

func TestDiskIsASparseFileOfItsSizeThatCloseRemoves(t *testing.T) {
	m := sim.New(sim.Config{DiskBytes: 8 << 30})
	p, err := m.Disk()
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != 8<<30 {
		t.Fatalf("disk is %d bytes, want 8 GiB", st.Size())
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Blocks*512 > 1<<20 {
		t.Errorf("the disk takes %d bytes: not sparse", sys.Blocks*512)
	}
	if again, _ := m.Disk(); again != p {
		t.Errorf("a second Disk is %s, want %s", again, p)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the machine's own disk outlived Close: %v", err)
	}

	// A disk file of the caller's is kept, and its contents too.
	own := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(own, []byte("written before"), 0o600); err != nil {
		t.Fatal(err)
	}
	m = sim.New(sim.Config{DiskPath: own})
	if p, err := m.Disk(); err != nil || p != own {
		t.Fatalf("disk %s, %v", p, err)
	}
	m.Close()
	if b, err := os.ReadFile(own); err != nil || string(b) != "written before" {
		t.Errorf("the caller's disk: %q, %v", b, err)
	}
}

func TestGuestRebootBootsAgainFromTheOverride(t *testing.T) {
	ctx := context.Background()
	boots := make(chan sim.Boot, 4)
	m := sim.New(sim.Config{Hook: func(ctx context.Context, b sim.Boot) {
		boots <- b
		<-ctx.Done()
	}})
	defer m.Close()
	if err := m.InsertMedia(ctx, machines.Media{Kind: machines.MediaCD, Path: "/tmp/r.iso"}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetBootOverride(ctx, drivers.BootCD, false); err != nil {
		t.Fatal(err)
	}
	if err := m.PowerOn(ctx); err != nil {
		t.Fatal(err)
	}
	b1 := <-boots
	// The deploy set the boot device to disk, then the guest reboots.
	if err := m.SetBootOverride(ctx, drivers.BootDisk, true); err != nil {
		t.Fatal(err)
	}
	b1.Reboot()
	b2 := <-boots
	if b1.Device != drivers.BootCD || b2.Device != drivers.BootDisk || b2.Seq != 2 {
		t.Fatalf("boots %+v then %+v, want the CD then the disk", b1, b2)
	}
	// A stale boot's reboot does nothing.
	b1.Reboot()
	if n := len(m.Boots()); n != 2 {
		t.Fatalf("%d boots after a stale reboot", n)
	}
}

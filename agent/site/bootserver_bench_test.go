package site

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/agent/ramdisk/image/imagetest"
)

// BenchmarkBootPieces measures what BootRamdisk builds per boot with the
// real ramdisk (Debian's kernel, the base initramfs with a static bcd):
// the boot's initrd (base + appendix) and its ISO. It needs `make kernel`.
func BenchmarkBootPieces(b *testing.B) {
	dir := b.TempDir()
	base := imagetest.Base(b, dir)
	images, err := NewRamdiskImages(base.Kernel, base.Initrd, "")
	if err != nil {
		b.Fatal(err)
	}
	cfg := protocol.RamdiskBootConfig{APIURL: "http://10.0.2.2:8080", Token: protocol.BootTokenPrefix + "bench",
		BootID: "boot_bench", Purpose: "inspect"}
	initrd, iso := filepath.Join(dir, "initrd.img"), filepath.Join(dir, "ramdisk.iso")
	b.ResetTimer()
	for b.Loop() {
		if err := images.Initrd(cfg, initrd); err != nil {
			b.Fatal(err)
		}
		if err := images.ISO(context.Background(), initrd, iso); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if st, err := os.Stat(iso); err == nil {
		b.ReportMetric(float64(st.Size())/(1<<20), "ISO-MiB")
	}
}

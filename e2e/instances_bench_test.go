package e2e

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api/instances"
)

// BenchmarkInstanceCreateToRunning measures instances.create → the
// instance read back as running (polled every 20 ms) on the dev stack, for
// each kind: a runc container, a QEMU VM (running: QEMU is up, not the
// guest booted) and a droplet at the fake DigitalOcean (its boot delay is
// the dev stack's 3 s). Each iteration deletes its instance afterwards,
// untimed. Run with
//
//	go test -run '^$' -bench InstanceCreateToRunning -benchtime 20x ./e2e/
//
// and read p50-ms and p99-ms (nearest rank: of 20 runs the 99th
// percentile is the slowest).
func BenchmarkInstanceCreateToRunning(b *testing.B) {
	v := startVPSStack(b)
	vps := v.s.VPS()
	vm := v.registerTestDisk(b)
	for _, kind := range []struct {
		name string
		in   instances.CreateInput
	}{
		{"container", instances.CreateInput{PoolID: vps.HostPoolID, FlavorID: v.flavors["c1-m1"], ImageID: vps.ImageID}},
		{"vm", instances.CreateInput{PoolID: vps.HostPoolID, FlavorID: v.flavors["vm-c1-m512"], ImageID: vm}},
		{"droplet", instances.CreateInput{PoolID: vps.ProviderPoolID, FlavorID: v.flavors["s-1vcpu-1gb"], ProviderImage: providerImage}},
	} {
		b.Run(kind.name, func(b *testing.B) {
			var took []time.Duration
			for i := 0; b.Loop(); i++ {
				in := kind.in
				in.IdempotencyKey = fmt.Sprintf("bench-%s-%d", kind.name, i)
				in.Name = fmt.Sprintf("bench-%d", i)
				begin := time.Now()
				out := v.create(b, in)
				v.await(b, out.ID, "running")
				took = append(took, time.Since(begin))
				b.StopTimer()
				v.change(b, instances.Delete, out.ID)
				v.await(b, out.ID, "deleted")
				b.StartTimer()
			}
			slices.Sort(took)
			at := func(q float64) float64 {
				rank := int(math.Ceil(q*float64(len(took)))) - 1
				return float64(took[max(0, rank)].Microseconds()) / 1000
			}
			b.ReportMetric(at(0.50), "p50-ms")
			b.ReportMetric(at(0.99), "p99-ms")
		})
	}
}

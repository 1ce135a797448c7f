package e2e

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api/sandboxes"
)

// BenchmarkSandboxCreateToFirstExec measures sandboxes.create → the first
// exec's exit frame (`true` through sandboxes.exec and its tunnel) on the
// dev stack, from a template's warm pool and cold (the workload booted by
// the create; its state polled every 5 ms until running). Each iteration
// deletes its sandbox afterwards and, warm, waits for the pool to refill,
// untimed. Run with
//
//	go test -run '^$' -bench SandboxCreateToFirstExec -benchtime 100x ./e2e/
//
// and read p50-ms and p99-ms (nearest rank).
func BenchmarkSandboxCreateToFirstExec(b *testing.B) {
	v := startVPSStack(b)
	warm := v.warmTemplate(b, "bench-warm", 2)
	for _, kind := range []struct {
		name, template string
	}{{"warm", warm.ID}, {"cold", v.s.VPS().SandboxTemplateID}} {
		b.Run(kind.name, func(b *testing.B) {
			ctx := context.Background()
			var took []time.Duration
			for i := 0; b.Loop(); i++ {
				begin := time.Now()
				s, err := sandboxes.Create.Call(ctx, v.demo, sandboxes.CreateInput{TenantID: demoTenant,
					IdempotencyKey: fmt.Sprintf("bench-%s-%d", kind.name, i), TemplateID: kind.template})
				if err != nil {
					b.Fatal(err)
				}
				for s.State != "running" {
					if s.State == "failed" {
						b.Fatalf("sandbox failed: %s", s.Failure)
					}
					time.Sleep(5 * time.Millisecond)
					if s, err = sandboxes.Get.Call(ctx, v.demo, sandboxes.SandboxInput{TenantID: demoTenant, SandboxID: s.ID}); err != nil {
						b.Fatal(err)
					}
				}
				if _, _, st := v.exec(b, s.ID, "", "true"); st.ExitCode != 0 {
					b.Fatalf("exec: %+v", st)
				}
				took = append(took, time.Since(begin))
				b.StopTimer()
				if _, err := sandboxes.Delete.Call(ctx, v.demo, sandboxes.SandboxInput{TenantID: demoTenant, SandboxID: s.ID}); err != nil {
					b.Fatal(err)
				}
				if kind.name == "warm" {
					v.awaitWarm(b, warm.ID, 2)
				}
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

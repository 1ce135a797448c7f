package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api/sandboxes"
	"github.com/better-compute/better-compute/api/tunnels"
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
			// took is the whole; phases its parts: the create's answer, the
			// wait for running, sandboxes.exec's answer, the tunnel's run.
			var took []time.Duration
			phases := make([][]time.Duration, 4)
			for i := 0; b.Loop(); i++ {
				begin := time.Now()
				s, err := sandboxes.Create.Call(ctx, v.demo, sandboxes.CreateInput{TenantID: demoTenant,
					IdempotencyKey: fmt.Sprintf("bench-%s-%d", kind.name, i), TemplateID: kind.template})
				if err != nil {
					b.Fatal(err)
				}
				mark := begin
				phase := func(i int) {
					now := time.Now()
					phases[i] = append(phases[i], now.Sub(mark))
					mark = now
				}
				phase(0)
				for s.State != "running" {
					if s.State == "failed" {
						b.Fatalf("sandbox failed: %s", s.Failure)
					}
					time.Sleep(5 * time.Millisecond)
					if s, err = sandboxes.Get.Call(ctx, v.demo, sandboxes.SandboxInput{TenantID: demoTenant, SandboxID: s.ID}); err != nil {
						b.Fatal(err)
					}
				}
				phase(1)
				opened, err := sandboxes.Exec.Call(ctx, v.demo, sandboxes.ExecInput{TenantID: demoTenant, SandboxID: s.ID,
					Command: []string{"sh", "-c", "true"}})
				if err != nil {
					b.Fatal(err)
				}
				phase(2)
				if st, err := tunnels.Exec(ctx, nil, v.s.APIURL()+opened.URL, opened.Token, strings.NewReader(""), io.Discard, io.Discard); err != nil || st.ExitCode != 0 {
					b.Fatalf("exec: %+v, %v", st, err)
				}
				phase(3)
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
			b.ReportMetric(quantileMs(took, 0.50), "p50-ms")
			b.ReportMetric(quantileMs(took, 0.99), "p99-ms")
			for i, name := range []string{"create", "running", "exec-open", "exec-run"} {
				b.ReportMetric(quantileMs(phases[i], 0.50), name+"-p50-ms")
			}
		})
	}
}

// quantileMs is the q-quantile of d (nearest rank) in milliseconds.
func quantileMs(d []time.Duration, q float64) float64 {
	d = slices.Sorted(slices.Values(d))
	rank := int(math.Ceil(q*float64(len(d)))) - 1
	return float64(d[max(0, rank)].Microseconds()) / 1000
}

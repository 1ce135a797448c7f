package temporal

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// BenchmarkWorkflowStarts measures workflow starts per second through the SDK
// client, with PostgreSQL and with SQLite file persistence. "start" only
// starts workflows (nothing runs them); "start+complete" also waits for a
// worker in this process to finish each one. Callers run concurrently
// (b.SetParallelism(benchParallelism) × GOMAXPROCS). Run with e.g.
//
//	go test ./deploy/temporal/ -run '^$' -bench WorkflowStarts -benchtime 10s
func BenchmarkWorkflowStarts(b *testing.B) {
	backends := []struct {
		name    string
		options func(b *testing.B) Options
	}{
		{"postgres", func(b *testing.B) Options {
			pg := startTestPostgres(b)
			return Options{Postgres: &pg}
		}},
		{"sqlite-file", func(b *testing.B) Options {
			return Options{SQLiteFile: filepath.Join(b.TempDir(), "temporal.db")}
		}},
	}
	for _, backend := range backends {
		b.Run(backend.name, func(b *testing.B) {
			ctx := testContext(b)
			o := backend.options(b)
			o.Namespaces = []string{"bench"}
			o.Logger = testLogger()
			s := startServer(ctx, b, o)
			c := dial(ctx, b, s.FrontendAddr(), "bench")

			b.Run("start", func(b *testing.B) {
				benchmarkStarts(b, c, "bench-no-worker", false)
			})

			w := worker.New(c, "bench-worker", worker.Options{})
			w.RegisterWorkflow(noopWorkflow)
			if err := w.Start(); err != nil {
				b.Fatalf("start worker: %v", err)
			}
			b.Cleanup(w.Stop)
			b.Run("start+complete", func(b *testing.B) {
				benchmarkStarts(b, c, "bench-worker", true)
			})
		})
	}
}

const benchParallelism = 8

func noopWorkflow(workflow.Context) error { return nil }

func benchmarkStarts(b *testing.B, c client.Client, taskQueue string, complete bool) {
	ctx := context.Background()
	prefix := uuid.NewString()
	var seq atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := fmt.Sprintf("bench-%s-%d", prefix, seq.Add(1))
			run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: taskQueue}, noopWorkflow)
			if err != nil {
				b.Errorf("start workflow: %v", err)
				return
			}
			if complete {
				if err := run.Get(ctx, nil); err != nil {
					b.Errorf("workflow %s: %v", id, err)
					return
				}
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "workflows/s")
}

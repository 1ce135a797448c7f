package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/workers"
)

// Environment of a worker process: the test binary started again by a test
// (workerProcess) runs the control-plane worker instead of the tests, so a
// test can kill a real worker process with SIGKILL.
const (
	envWorkerDatabase = "BC_E2E_WORKER_DATABASE_URL"
	envWorkerTemporal = "BC_E2E_WORKER_TEMPORAL"
)

func TestMain(m *testing.M) {
	if db := os.Getenv(envWorkerDatabase); db != "" {
		if err := runWorker(db, os.Getenv(envWorkerTemporal)); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.Main(m) // the scale-out test's PostgreSQL is the harness's
}

func runWorker(databaseURL, temporalAddr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	st, err := store.Open(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer st.Close()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := workers.Dial(ctx, workers.TemporalConfig{Address: temporalAddr, Namespace: devstack.Namespace}, logger)
	if err != nil {
		return err
	}
	defer c.Close()
	w := workers.NewControlPlane(c, workers.Deps{Store: st})
	if err := w.Start(); err != nil {
		return err
	}
	fmt.Println("worker running")
	<-ctx.Done()
	w.Stop()
	return nil
}

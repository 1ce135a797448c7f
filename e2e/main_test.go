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
	"time"

	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/secrets"
	"github.com/better-compute/better-compute/workers"
)

// Environment of a worker process: the test binary started again by a test
// (workerProcess) runs the control-plane worker instead of the tests, so a
// test can kill a real worker process with SIGKILL.
const (
	envWorkerDatabase = "BC_E2E_WORKER_DATABASE_URL"
	envWorkerTemporal = "BC_E2E_WORKER_TEMPORAL"
	envWorkerKEK      = "BC_E2E_WORKER_KEK_FILE"
)

func TestMain(m *testing.M) {
	if db := os.Getenv(envWorkerDatabase); db != "" {
		if err := runWorker(db, os.Getenv(envWorkerTemporal), os.Getenv(envWorkerKEK)); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.Main(m) // the scale-out test's PostgreSQL is the harness's
}

func runWorker(databaseURL, temporalAddr, kekFile string) error {
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
	keys, err := secrets.LoadKeyring(kekFile, func(string) string { return "" })
	if err != nil {
		return err
	}
	// As the dev stack's own worker: loopback receivers, a short idle poll.
	w := workers.NewControlPlane(c, workers.Deps{Store: st, Secrets: secrets.NewVault(keys, "root"),
		Webhooks: workers.WebhooksTuning{AllowLoopback: true, IdlePoll: 200 * time.Millisecond}})
	if err := w.Start(); err != nil {
		return err
	}
	fmt.Println("worker running")
	<-ctx.Done()
	w.Stop()
	return nil
}

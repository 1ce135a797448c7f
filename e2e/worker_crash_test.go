package e2e

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/testutil"
)

// workerProcess starts the control-plane worker as a separate process (this
// test binary, see TestMain) and waits until it runs.
func workerProcess(t *testing.T, s *devstack.Stack) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envWorkerDatabase+"="+s.DatabaseURL(), envWorkerTemporal+"="+s.TemporalAddr(),
		envWorkerKEK+"="+s.SecretsKEKPath())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.Contains(line, "worker running") {
		t.Fatalf("worker process: %q, %v", line, err)
	}
	return cmd
}

// A worker killed with SIGKILL in the middle of the activity that releases
// a lapsed lease loses nothing and releases nothing twice: the activity's
// transaction dies with the worker's connection, Temporal retries the
// activity on the next worker once its start-to-close timeout passes, and
// the retry releases the reservation exactly once. (reservations.release
// walks the row in the API's own transaction, so the workflow's release
// activity is now reached through a lease.)
func TestWorkerKilledMidActivity(t *testing.T) {
	dir := stackDir(t)
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	bcd, err := bcdBinary()
	if err != nil {
		t.Fatal(err)
	}
	s, err := devstack.Start(context.Background(), devstack.Options{Dir: dir, APIAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0",
		BCD: bcd, PostgresPort: pgPort, TemporalAddr: "127.0.0.1:0", UIAddr: "-", NoWorker: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("devstack: %v", err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	first := workerProcess(t, s)

	token, err := s.DemoToken()
	if err != nil {
		t.Fatal(err)
	}
	acme := api.NewClient(s.APIURL(), token)
	lease := int64(10) // lapses 10 s after the activation: time to hold the table first
	r, err := reservations.Create.Call(ctx, acme, reservations.CreateInput{TenantID: "acme", PoolID: s.Demo().PoolID,
		Devices: placement.Request{Class: "gpu", Count: 2}, Duration: 3600, LeaseSeconds: &lease, IdempotencyKey: "crash-1"})
	if err != nil {
		t.Fatal(err)
	}
	waitState(ctx, t, acme, r.ID, "active")

	db, err := pgx.Connect(ctx, s.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	// Hold the usage table so the lapsed lease's release activity blocks
	// inside its transaction (after moving the row to releasing, at closing
	// the usage interval), then kill the worker there.
	lock, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `LOCK TABLE usage_intervals IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	watch, err := pgx.Connect(ctx, s.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(context.Background())
	blocked := func() bool {
		var n int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%UPDATE usage_intervals%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	if !testutil.Until(ctx, blocked) {
		t.Fatal("the release activity never reached the locked table")
	}
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if st := stateOf(ctx, t, watch, r.ID); st != "active" {
		t.Fatalf("state after the kill = %s: the killed activity's transaction committed", st)
	}

	workerProcess(t, s)
	waitState(ctx, t, acme, r.ID, "released")
	var reason string
	if err := watch.QueryRow(ctx, `SELECT end_reason FROM reservations WHERE id = $1`, r.ID).Scan(&reason); err != nil || reason != "lease" {
		t.Fatalf("end reason = %q, %v; want lease", reason, err)
	}
	var releasing, releasedEvents, intervals, open, live int
	if err := watch.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE type = 'reservation.releasing'), count(*) FILTER (WHERE type = 'reservation.released')
		FROM events WHERE resource_id = $1`, r.ID).Scan(&releasing, &releasedEvents); err != nil {
		t.Fatal(err)
	}
	if err := watch.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE ended_at IS NULL)
		FROM usage_intervals WHERE reservation_id = $1`, r.ID).Scan(&intervals, &open); err != nil {
		t.Fatal(err)
	}
	if err := watch.QueryRow(ctx, `SELECT count(*) FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
		WHERE a.reservation_id = $1 AND (upper_inf(b.during) OR upper(b.during) > now())`, r.ID).Scan(&live); err != nil {
		t.Fatal(err)
	}
	if releasing != 1 || releasedEvents != 1 || intervals != 1 || open != 0 || live != 0 {
		t.Fatalf("after the retry: %d releasing and %d released events, %d usage intervals (%d open), %d live bookings; want 1, 1, 1, 0, 0",
			releasing, releasedEvents, intervals, open, live)
	}
}

func stateOf(ctx context.Context, t *testing.T, db *pgx.Conn, id string) string {
	t.Helper()
	var st string
	if err := db.QueryRow(ctx, `SELECT state FROM reservations WHERE id = $1`, id).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

func waitState(ctx context.Context, t *testing.T, c *api.Client, id, want string) {
	t.Helper()
	var state string
	reached := testutil.Until(ctx, func() bool {
		r, err := reservations.Get.Call(ctx, c, reservations.ReservationInput{TenantID: "acme", ReservationID: id})
		if err != nil {
			t.Fatal(err)
		}
		state = r.State
		return state == want
	})
	if !reached {
		t.Fatalf("reservation %s is %s, want %s", id, state, want)
	}
}

package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"

	reservationsact "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/internal/controlplane"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/workers"
)

// crashedReplica is a second API process on the stack's database and
// Temporal whose reservation starter never runs: it commits bookings and
// answers them, then "dies" before it starts any workflow. What it admitted
// must still be driven by workflows, started by another process's starter.
type crashedReplica struct {
	client *api.Client
	store  *store.Store
}

func newCrashedReplica(t *testing.T, l *lifecycle) *crashedReplica {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, l.stack.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	never := reservationsact.NewStarter(st, l.stack.Client(), workers.ControlPlaneQueue, quiet, reservationsact.StarterOptions{})
	cp, err := controlplane.New(ctx, controlplane.Config{Store: st, Temporal: l.stack.Client(), TaskQueue: workers.ControlPlaneQueue,
		Logger: quiet, ReservationStarter: never})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	srv := httptest.NewServer(cp.API)
	t.Cleanup(srv.Close)
	token, err := l.stack.DemoToken()
	if err != nil {
		t.Fatal(err)
	}
	return &crashedReplica{client: api.NewClient(srv.URL, token), store: st}
}

func (c *crashedReplica) reserve(t *testing.T, l *lifecycle, key string) reservations.Reservation {
	t.Helper()
	r, err := reservations.Create.Call(context.Background(), c.client, reservations.CreateInput{TenantID: "acme", PoolID: l.pool,
		Devices: placement.Request{Class: placement.ClassGPU, Count: 1}, Duration: 3600, IdempotencyKey: key})
	if err != nil || r.State != "placed" {
		t.Fatalf("reservations.create %s on the crashed replica = %+v, %v", key, r, err)
	}
	return r
}

// oneRun checks that the reservation's workflow runs, was started once (its
// latest run is its first) and activated the reservation once.
func oneRun(t *testing.T, l *lifecycle, id string) {
	t.Helper()
	desc, err := l.stack.Client().DescribeWorkflowExecution(context.Background(), id, "")
	if err != nil {
		t.Fatalf("describe %s: %v", id, err)
	}
	info := desc.GetWorkflowExecutionInfo()
	if info.GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING || info.GetExecution().GetRunId() != info.GetFirstRunId() {
		t.Fatalf("%s's workflow: status %v, run %s, first run %s; want one running run", id, info.GetStatus(),
			info.GetExecution().GetRunId(), info.GetFirstRunId())
	}
	if n := l.count(t, `SELECT count(*) FROM events WHERE resource_id = $1 AND type = 'reservation.active'`, id); n != 1 {
		t.Fatalf("%s became active %d times", id, n)
	}
	if n := l.count(t, `SELECT count(*) FROM reservations WHERE id = $1 AND workflow_started_at IS NOT NULL`, id); n != 1 {
		t.Fatalf("%s's workflow start is not recorded", id)
	}
}

// release frees the reservation's GPU for the subtests after.
func (l *lifecycle) release(t *testing.T, id string) {
	t.Helper()
	if r, err := reservations.Release.Call(context.Background(), l.acme, reservations.ReservationInput{TenantID: "acme", ReservationID: id}); err != nil || r.State != "released" {
		t.Fatalf("reservations.release %s = %+v, %v", id, r, err)
	}
}

// A crash between the booking commit and the workflow start: the replica
// answered the create (placed) and died before its starter started
// anything. The row owes the start, and the stack's API process's starter
// finds it by its scan and starts it; the reservation is driven to active by
// its workflow.
func testCrashBeforeWorkflowStart(t *testing.T, l *lifecycle) {
	crashed := newCrashedReplica(t, l)
	r := crashed.reserve(t, l, "crash-before-start")
	l.waitState(t, r.ID, "active")
	oneRun(t, l, r.ID)
	l.release(t, r.ID)
}

// Several replicas' starters scanning the same owed starts at once (the
// stack's, and two more started here with no grace) start each workflow
// once: a start that finds the workflow running keeps it, so every
// reservation has one run, becomes active once and has its start recorded.
func testReplicaStartersDoNotDoubleStart(t *testing.T, l *lifecycle) {
	crashed := newCrashedReplica(t, l)
	var ids []string
	for i := range 4 {
		ids = append(ids, crashed.reserve(t, l, fmt.Sprintf("owed-%d", i)).ID)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for range 2 {
		s := reservationsact.NewStarter(crashed.store, l.stack.Client(), workers.ControlPlaneQueue, quiet,
			reservationsact.StarterOptions{ScanGrace: time.Nanosecond})
		wg.Go(func() { _ = s.Run(ctx) })
	}
	// And one start twice by hand, as two replicas handing over the same
	// reservation would.
	for range 2 {
		if err := reservationsact.StartReservation(ctx, l.stack.Client(), workers.ControlPlaneQueue,
			reservationsact.ReservationParams{TenantID: "acme", ReservationID: ids[0], PoolID: l.pool,
				Start: time.Now().UnixMilli(), End: time.Now().Add(time.Hour).UnixMilli()}); err != nil {
			t.Fatalf("start %s: %v", ids[0], err)
		}
	}
	for _, id := range ids {
		l.waitState(t, id, "active")
	}
	for _, id := range ids {
		oneRun(t, l, id)
		l.release(t, id)
	}
}

// BenchmarkCreateToActive measures, on the dev stack (its two simulated
// nodes), how long a start=now reservation takes from the create call to
// active (the activation's event), and the create call alone: p50 and the
// worst of b.N sequential reservations, each released after.
func BenchmarkCreateToActive(b *testing.B) {
	if testing.Short() {
		b.Skip("starts PostgreSQL and Temporal")
	}
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		b.Fatal(err)
	}
	s := startStack(b, b.TempDir(), pgPort)
	token, err := s.DemoToken()
	if err != nil {
		b.Fatal(err)
	}
	acme := api.NewClient(s.APIURL(), token)
	ctx := context.Background()
	st, err := store.Open(ctx, s.DatabaseURL())
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	var calls, actives []time.Duration
	b.ResetTimer()
	for i := range b.N {
		began := time.Now()
		r, err := reservations.Create.Call(ctx, acme, reservations.CreateInput{TenantID: "acme", PoolID: s.Demo().PoolID,
			Devices: placement.Request{Class: placement.ClassGPU, Count: 1}, Duration: 600,
			IdempotencyKey: fmt.Sprintf("to-active-%d-%d", b.N, i)})
		if err != nil {
			b.Fatal(err)
		}
		calls = append(calls, time.Since(began))
		var activeAt time.Time
		testutil.EventuallyNil(b, time.Minute, func() error {
			return st.Pool.QueryRow(ctx, `SELECT created_at FROM events WHERE resource_id = $1 AND type = 'reservation.active'`, r.ID).Scan(&activeAt)
		})
		actives = append(actives, activeAt.Sub(began))
		if _, err := reservations.Release.Call(ctx, acme, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	report := func(ds []time.Duration, name string) {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(ds[len(ds)-1].Microseconds())/1000, name+"-max-ms")
	}
	report(calls, "create")
	report(actives, "to-active")
}

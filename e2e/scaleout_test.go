package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/api/sites"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
)

// scaleWait bounds each wait of the scale-out test. The slowest is a
// reservation whose workflow task or activity the killed worker held: it
// moves on once Temporal gives up on that worker (the sticky queue's 5 s,
// or the activity's 10 s start-to-close timeout).
const scaleWait = time.Minute

// A scaled-out control plane on real processes: PostgreSQL, Temporal in a
// process of its own (better-compute temporal), two API replicas (serve)
// and two workers, with two bcd node agents reaching the replicas' agent
// listeners through one load-balancer address. Reservations go through the
// replicas in turn; one replica and one worker die by SIGKILL in the middle
// of the run. Every acknowledged reservation still ends where it should
// (active, released at its window's end, or released by a call), a call the
// dead replica refused succeeds on the other with the same idempotency key
// and makes no second reservation, no device is booked twice, and the
// agents' sessions move to the surviving replica.
func TestScaleOutSurvivesAKilledReplicaAndWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, Temporal and the control plane as processes")
	}
	began := time.Now()
	step := func(what string) { t.Logf("%5.1fs %s", time.Since(began).Seconds(), what) }
	// The two builds link in parallel: linking is mostly one core's work.
	bcdBuilt := make(chan error, 1)
	go func() { _, err := bcdBinary(); bcdBuilt <- err }()
	bc, err := betterComputeBinary()
	if err != nil {
		t.Skipf("cannot build better-compute: %v", err)
	}
	if err := <-bcdBuilt; err != nil {
		t.Skipf("cannot build bcd: %v", err)
	}
	bcd, err := bcdBinary()
	if err != nil {
		t.Skipf("cannot build bcd: %v", err)
	}
	step("binaries built")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	databaseURL := testenv.DatabaseURL(t)
	cluster := testenv.Cluster(t)

	// Temporal, alone in its process, persisting to the test's cluster.
	temporalProc := startProcess(t, "temporal", bc, nil, "temporal", "--address", "127.0.0.1:0",
		"--namespace", devstack.Namespace, "--postgres-url", cluster.URL(fmt.Sprintf("temporal_scaleout_%d", time.Now().UnixNano())))
	temporalProc.waitFor(t, "namespaces ")
	temporalAddr := temporalProc.line("frontend ")
	step("temporal ready at " + temporalAddr)

	// The root admin and the demo tenant's user, as `better-compute iam
	// bootstrap` makes them.
	st, err := store.Open(ctx, databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	catalog, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	iamAdmin, err := iam.NewAdmin(iam.AdminConfig{Store: st, Catalog: catalog, RootTenantID: "root"})
	if err != nil {
		t.Fatal(err)
	}
	boot, err := iam.Bootstrap(ctx, iamAdmin, iam.BootstrapOptions{})
	if err != nil {
		t.Fatal(err)
	}

	ca := filepath.Join(dir, "node-ca")
	if _, err := nodeca.LoadOrGenerate(ca); err != nil {
		t.Fatal(err)
	}
	ports, err := freeport.PickN("127.0.0.1", 4)
	if err != nil {
		t.Fatal(err)
	}
	apiAddrs := []string{hostPort(ports[0]), hostPort(ports[1])}
	agentAddrs := []string{hostPort(ports[2]), hostPort(ports[3])}
	// The agents' one address; it prefers the first replica, so every
	// session starts there and has to move when that replica dies.
	lb := startFailoverProxy(t, agentAddrs...)
	backend := []string{"--database-url", databaseURL, "--temporal-address", temporalAddr, "--log-level", "info"}
	replica := func(i int) *process {
		p := startProcess(t, "serve-"+strconv.Itoa(i), bc, nil, append([]string{"serve", "--listen", apiAddrs[i],
			"--node-ca-cert", filepath.Join(ca, nodeca.CertFile), "--node-ca-key", filepath.Join(ca, nodeca.KeyFile),
			"--agent-listen", agentAddrs[i], "--agent-endpoint", "https://" + lb.addr()}, backend...)...)
		p.waitFor(t, `"api listening"`)
		return p
	}
	worker := func(i int) *process {
		p := startProcess(t, "worker-"+strconv.Itoa(i), bc, nil, append([]string{"worker"}, backend...)...)
		p.waitFor(t, `"worker running"`)
		return p
	}
	replicas := []*process{replica(0)}
	adminOn := func(i int) *api.Client { return api.NewClient("http://"+apiAddrs[i], boot.AdminToken) }
	userOn := func(i int) *api.Client { return api.NewClient("http://"+apiAddrs[i], boot.UserToken) }

	// The fleet: a site, a pool offered to the demo tenant, the user's
	// relation on it. The second replica starts after, so it loads them.
	poolID := seedScaleFleet(ctx, t, adminOn(0), iamAdmin, catalog, boot)
	replicas = append(replicas, replica(1))
	workers := []*process{worker(0), worker(1)}
	step("two replicas and two workers running")

	// Two agents join through the first replica and hold their sessions
	// through the load balancer.
	tok, err := nodes.CreateJoinToken.Call(ctx, adminOn(0), nodes.CreateJoinTokenInput{TenantID: boot.RootTenantID, PoolID: poolID,
		Name: "scale-out agents", MaxUses: ptr(int64(2))})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		name := fmt.Sprintf("scale-agent-%d", i)
		state := filepath.Join(dir, name)
		join := startProcess(t, name+"-join", bcd, []string{"BCD_JOIN_TOKEN=" + tok.Token}, "node", "join", "--api", "http://"+apiAddrs[0],
			"--state-dir", state, "--name", name, "--simulate-gpus", "8xH100-SXM5-80GB", "--seed", name)
		<-join.done
		if !join.cmd.ProcessState.Success() {
			t.Fatalf("bcd node join: %v\n%s", join.cmd.ProcessState, join.out)
		}
		startProcess(t, name, bcd, nil, "node", "run", "--state-dir", state, "--simulate-gpus", "8xH100-SXM5-80GB",
			"--seed", name, "--cdi-dir", filepath.Join(state, "cdi"), "--agent-endpoint", "https://"+lb.addr())
	}
	var nodeIDs []string
	testutil.Eventually(t, scaleWait, "two schedulable nodes", func() bool {
		l, err := nodes.List.Call(ctx, adminOn(1), nodes.ListInput{TenantID: boot.RootTenantID, PoolID: poolID})
		if err != nil {
			t.Fatal(err)
		}
		nodeIDs = nodeIDs[:0]
		for _, n := range l.Items {
			if n.Schedulable {
				nodeIDs = append(nodeIDs, n.ID)
			}
		}
		return len(nodeIDs) == 2
	})
	if n := lb.forwarded(agentAddrs[0]); n < 2 {
		t.Fatalf("%d agent sessions went to the first replica, want 2", n)
	}

	step("two agents' nodes schedulable")
	db, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	epochs := map[string]int64{}
	for _, id := range nodeIDs {
		epochs[id] = sessionEpoch(ctx, t, db, id)
	}

	tc, err := client.Dial(client.Options{HostPort: temporalAddr, Namespace: devstack.Namespace, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	explain := func(id string) { explainReservation(ctx, t, db, tc, id) }

	// Twelve reservations, in turn through each replica; the first replica
	// and the first worker die right after the sixth is acknowledged, while
	// its binding (and maybe others') is in flight: a node command's result
	// that dies with its replica is sent again by the agent on its next
	// session, so no binding waits out the bind timeout.
	plan := scalePlan(12)
	failedOver := 0
	for i := range plan {
		if i == len(plan)/2 {
			step("six reservations acknowledged; killing replica 0 and worker 0")
			replicas[0].kill9(t)
			workers[0].kill9(t)
		}
		r := &plan[i]
		via := i % 2
		in := reservations.CreateInput{TenantID: boot.TenantID, PoolID: poolID, IdempotencyKey: r.key,
			Devices: placement.Request{Class: placement.ClassGPU, Count: r.gpus}, Duration: r.duration}
		got, err := reservations.Create.Call(ctx, userOn(via), in)
		if err != nil && via == 0 && i >= len(plan)/2 && !isAPIError(err) {
			// The dead replica did not answer: the client tries the
			// other with the same key, as a load balancer would.
			failedOver++
			got, err = reservations.Create.Call(ctx, userOn(1), in)
		}
		if err != nil {
			t.Fatalf("reservations.create %s via replica %d: %v", r.key, via, err)
		}
		r.id = got.ID
	}
	if failedOver != len(plan)/4 {
		t.Fatalf("%d creates failed over to the surviving replica, want %d", failedOver, len(plan)/4)
	}

	step(fmt.Sprintf("%d reservations acknowledged, %d after a failover", len(plan), failedOver))

	// The agents' sessions move to the surviving replica.
	for _, id := range nodeIDs {
		testutil.Eventually(t, scaleWait, "node "+id+" connected again, through the surviving replica", func() bool {
			n, err := nodes.Get.Call(ctx, adminOn(1), nodes.NodeInput{TenantID: boot.RootTenantID, NodeID: id})
			if err != nil {
				t.Fatal(err)
			}
			return string(n.Connectivity) == "connected" && sessionEpoch(ctx, t, db, id) > epochs[id]
		})
	}
	if n := lb.forwarded(agentAddrs[1]); n < 2 {
		t.Fatalf("%d agent sessions went to the surviving replica, want at least 2", n)
	}

	step("agents reconnected to the surviving replica")

	// Every acknowledged reservation gets where it should, seen through
	// the surviving replica; those to release are released by a call.
	survivor := userOn(1)
	for _, r := range plan {
		want := "active"
		if r.kind == windowEnds {
			want = "released"
		}
		awaitScaleState(ctx, t, survivor, boot.TenantID, r.id, want, explain)
	}
	for _, r := range plan {
		if r.kind != releasedByCall {
			continue
		}
		got, err := reservations.Release.Call(ctx, survivor, reservations.ReservationInput{TenantID: boot.TenantID, ReservationID: r.id})
		if err != nil || got.State != "released" || got.EndReason != "release" {
			t.Fatalf("reservations.release %s = %+v, %v", r.id, got, err)
		}
	}
	for _, r := range plan {
		got, err := reservations.Get.Call(ctx, survivor, reservations.ReservationInput{TenantID: boot.TenantID, ReservationID: r.id})
		if err != nil {
			t.Fatal(err)
		}
		if got.State != r.kind.state() || got.EndReason != r.kind.endReason() {
			t.Errorf("%s (%s) is %s, endReason %q; want %s, %q", r.id, r.key, got.State, got.EndReason, r.kind.state(), r.kind.endReason())
		}
	}

	step("every reservation where it should be")

	// No device is booked twice, each reservation was placed once, and only
	// the active ones still hold devices.
	var overlapping int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM device_bookings x JOIN device_bookings y
		ON x.device_node_id = y.device_node_id AND x.device_id = y.device_id AND x.ctid < y.ctid AND x.during && y.during`).Scan(&overlapping); err != nil {
		t.Fatal(err)
	}
	if overlapping != 0 {
		t.Errorf("%d pairs of bookings overlap on one device", overlapping)
	}
	var made int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE tenant_id = $1`, boot.TenantID).Scan(&made); err != nil {
		t.Fatal(err)
	}
	if made != len(plan) {
		t.Errorf("%d reservations for %d idempotency keys", made, len(plan))
	}
	for _, r := range plan {
		var bookings, live int
		if err := db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE upper_inf(b.during) OR upper(b.during) > now())
			FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id WHERE a.reservation_id = $1`, r.id).Scan(&bookings, &live); err != nil {
			t.Fatal(err)
		}
		wantLive := 0
		if r.kind == staysActive {
			wantLive = r.gpus
		}
		if bookings != r.gpus || live != wantLive {
			t.Errorf("%s (%s): %d bookings, %d live; want %d, %d", r.id, r.key, bookings, live, r.gpus, wantLive)
		}
	}
}

// scaleKind is what the scale-out test expects of a reservation.
type scaleKind int

const (
	staysActive    scaleKind = iota // an hour long: active at the end
	windowEnds                      // seconds long: released when its window ends
	releasedByCall                  // an hour long, then reservations.release
)

func (k scaleKind) state() string {
	if k == staysActive {
		return "active"
	}
	return "released"
}

func (k scaleKind) endReason() string {
	switch k {
	case windowEnds:
		return "end"
	case releasedByCall:
		return "release"
	}
	return ""
}

type scaleReservation struct {
	key      string
	kind     scaleKind
	gpus     int
	duration int64 // seconds
	id       string
}

// scalePlan is n reservations of the three kinds in turn, one or two GPUs
// each: at most 16 GPUs in all, the two nodes' and the tenant's quota.
func scalePlan(n int) []scaleReservation {
	plan := make([]scaleReservation, n)
	for i := range plan {
		r := scaleReservation{key: fmt.Sprintf("scale-%d", i), kind: scaleKind(i % 3), gpus: 1, duration: 3600}
		if i%4 == 0 {
			r.gpus = 2
		}
		if r.kind == windowEnds {
			// One of the first half must still be active when the test
			// has seen the whole first half active; one of the second half
			// ends while the test waits anyway.
			r.duration = 5
			if i < n/2 {
				r.duration = 20
			}
		}
		plan[i] = r
	}
	return plan
}

// seedScaleFleet makes what the dev stack's demo fleet is: a site, an H100
// pool of the root tenant offered to the demo tenant with a 16-GPU quota,
// and the demo user's "user" relation on it. It answers the pool's id.
func seedScaleFleet(ctx context.Context, t *testing.T, admin *api.Client, iamAdmin *iam.Admin, catalog *core.Catalog, boot iam.BootstrapResult) string {
	t.Helper()
	site, err := sites.Create.Call(ctx, admin, sites.CreateInput{TenantID: boot.RootTenantID, Name: "scale", Region: "local",
		IAMRegion: "dev-local-1", Kind: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pools.Create.Call(ctx, admin, pools.CreateInput{TenantID: boot.RootTenantID, SiteID: site.ID, Name: "h100",
		Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Offer.Call(ctx, admin, pools.OfferInput{TenantID: boot.RootTenantID, PoolID: pool.ID,
		ToTenantID: boot.TenantID, Quota: map[string]int64{"gpu": 16}}); err != nil {
		t.Fatal(err)
	}
	if _, err := iamAdmin.AddRelation(ctx, iam.Relation{TenantID: boot.TenantID, SubjectID: boot.UserIdentityID,
		Relation: "user", ResourceType: catalog.FullName("pool"), ResourceID: pool.ID}); err != nil {
		t.Fatal(err)
	}
	return pool.ID
}

// awaitScaleState waits for the reservation to reach want, failing at once
// if it ends anywhere else; on failure, explain tells where it got.
func awaitScaleState(ctx context.Context, t *testing.T, c *api.Client, tenant, id, want string, explain func(id string)) {
	t.Helper()
	wait, cancel := context.WithTimeout(ctx, scaleWait)
	defer cancel()
	var last reservations.Reservation
	reached := testutil.Until(wait, func() bool {
		r, err := reservations.Get.Call(ctx, c, reservations.ReservationInput{TenantID: tenant, ReservationID: id})
		if err != nil {
			t.Fatal(err)
		}
		last = r
		switch r.State {
		case want:
			return true
		case "released", "failed", "cancelled", "expired", "denied":
			return true
		}
		return false
	})
	if !reached || last.State != want {
		explain(id)
		t.Fatalf("reservation %s is %s (endReason %q, failure %s) after up to %v, want %s", id, last.State, last.EndReason, last.Failure, scaleWait, want)
	}
}

// explainReservation logs a reservation's events and its workflow's
// pending activities and last history events.
func explainReservation(ctx context.Context, t *testing.T, db *pgxpool.Pool, tc client.Client, id string) {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT type, created_at, data::text FROM events WHERE resource_id = $1 ORDER BY seq`, id)
	if err == nil {
		for rows.Next() {
			var typ, data string
			var at time.Time
			if rows.Scan(&typ, &at, &data) == nil {
				t.Logf("%s event %s at %s: %s", id, typ, at.Format(time.StampMilli), data)
			}
		}
		rows.Close()
	}
	cmds, err := db.Query(ctx, `SELECT c.node_id, c.seq, c.kind, c.state, c.idempotency_key FROM node_commands c
		WHERE c.idempotency_key LIKE '%:' || $1 || ':%' ORDER BY c.seq`, id)
	if err == nil {
		for cmds.Next() {
			var node, kind, state, key string
			var seq int64
			if cmds.Scan(&node, &seq, &kind, &state, &key) == nil {
				t.Logf("%s node command %s #%d %s: %s (%s)", id, node, seq, kind, state, key)
			}
		}
		cmds.Close()
	}
	desc, err := tc.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		t.Logf("%s workflow: %v", id, err)
		return
	}
	t.Logf("%s workflow %v, pending workflow task %v", id, desc.GetWorkflowExecutionInfo().GetStatus(), desc.GetPendingWorkflowTask())
	for _, a := range desc.GetPendingActivities() {
		t.Logf("%s pending activity %s: state %v, attempt %d, last failure %v, worker %s", id, a.GetActivityType().GetName(),
			a.GetState(), a.GetAttempt(), a.GetLastFailure(), a.GetLastWorkerIdentity())
	}
	it := tc.GetWorkflowHistory(ctx, id, "", false, 0)
	var events []string
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			break
		}
		events = append(events, fmt.Sprintf("%d %s %s", e.GetEventId(), e.GetEventTime().AsTime().Format(time.StampMilli), e.GetEventType()))
	}
	if len(events) > 30 {
		events = events[len(events)-30:]
	}
	for _, e := range events {
		t.Logf("%s history: %s", id, e)
	}
}

func sessionEpoch(ctx context.Context, t *testing.T, db *pgxpool.Pool, nodeID string) int64 {
	t.Helper()
	var epoch int64
	if err := db.QueryRow(ctx, `SELECT session_epoch FROM nodes WHERE id = $1`, nodeID).Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	return epoch
}

// isAPIError reports whether err is an answer of the API (a replica that
// ran), rather than a call that reached no replica.
func isAPIError(err error) bool {
	var e *core.Error
	return errors.As(err, &e)
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

func ptr[T any](v T) *T { return &v }

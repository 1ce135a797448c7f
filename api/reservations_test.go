package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/iam/policies"
	"github.com/better-compute/better-compute/internal/testutil"
)

// reservationsT0 starts windows a month ahead (within the one year a start
// may lie ahead), free of every booking and of the reservations' workflows.
var reservationsT0 = time.Now().UTC().Truncate(time.Hour).Add(30 * 24 * time.Hour)

// h100Pool makes acme's H100 pool with one schedulable 8-GPU node.
func h100Pool(t testing.TB, e *env) (pools.Pool, nodes.Node) {
	t.Helper()
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{}`)
	n := e.node(schedulableNode(p.ID, "gpu-a01"), fixture(t, "h100-8x-sxm.json"))
	if !n.Schedulable {
		t.Fatalf("node not schedulable: %+v", n)
	}
	return p, n
}

func reserveInput(tenant, poolID, key string, count int, start time.Time, seconds int64) reservations.CreateInput {
	ms := start.UnixMilli()
	return reservations.CreateInput{TenantID: tenant, PoolID: poolID, Devices: placement.Request{Class: "gpu", Count: count},
		Start: &ms, Duration: seconds, IdempotencyKey: key}
}

func (e *env) identityOf(token string) string {
	e.t.Helper()
	c, err := e.outer.Authenticate(context.Background(), iam.Credential{Authorization: "Bearer " + token})
	if err != nil {
		e.t.Fatal(err)
	}
	return c.IdentityID
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.store.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// eventuallyState waits for a reservation's state (a refusal's failed mark
// is its own transaction, after the answer).
func (e *env) eventuallyState(id, want string) {
	e.t.Helper()
	testutil.EventuallyNil(e.t, 5*time.Second, func() error {
		var got string
		_ = e.store.Pool.QueryRow(context.Background(), `SELECT state FROM reservations WHERE id = $1`, id).Scan(&got)
		if got != want {
			return fmt.Errorf("reservation %s is %q, want %q", id, got, want)
		}
		return nil
	})
}

func TestReservationsCreateAndGet(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	p, n := h100Pool(t, e)

	in := reserveInput("acme", p.ID, "r1", 2, reservationsT0, 3600)
	r, err := reservations.Create.Call(ctx, a, in)
	if err != nil {
		t.Fatal(err)
	}
	if want := core.DerivedID("rsv", "acme", e.identityOf(e.boot.UserToken), "r1"); r.ID != want {
		t.Fatalf("id %s, want the derived %s", r.ID, want)
	}
	if r.State != "placed" || r.Binding != "hold" || r.PoolID != p.ID || r.Start != reservationsT0.UnixMilli() ||
		r.End != r.Start+3600_000 || len(r.Allocations) != 1 || r.Allocations[0].NodeID != n.ID ||
		len(r.Allocations[0].Atoms) != 2 || !strings.HasPrefix(r.Allocations[0].ID, "alloc_") {
		t.Fatalf("reservation = %+v", r)
	}
	if got := e.count(`SELECT count(*) FROM device_bookings WHERE allocation_id = $1 AND tenant_id = 'acme'
		AND during = tstzrange($2::timestamptz, $3::timestamptz)`, r.Allocations[0].ID, reservationsT0, reservationsT0.Add(time.Hour)); got != 2 {
		t.Fatalf("bookings = %d, want 2", got)
	}

	// The replay answers the stored reservation; the same key with another
	// body is CONFLICT.
	again, err := reservations.Create.Call(ctx, a, in)
	if err != nil || again.ID != r.ID || again.Allocations[0].ID != r.Allocations[0].ID {
		t.Fatalf("replay = %+v, %v", again, err)
	}
	other := in
	other.Devices.Count = 3
	if _, err := reservations.Create.Call(ctx, a, other); codeOf(err) != core.CodeConflict {
		t.Fatalf("same key, other body = %v", err)
	}
	if got := e.count(`SELECT count(*) FROM device_bookings`); got != 2 {
		t.Fatalf("bookings after the replay = %d, want 2", got)
	}

	got, err := reservations.Get.Call(ctx, a, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID})
	if err != nil || got.ID != r.ID || got.State != "placed" || len(got.Allocations) != 1 {
		t.Fatalf("get = %+v, %v", got, err)
	}
	// Another tenant's reservation is not found.
	if _, err := reservations.Get.Call(ctx, e.client(e.globex), reservations.ReservationInput{TenantID: "globex", ReservationID: r.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex get = %v, want NOT_FOUND", err)
	}
	// A pool the tenant cannot see is NOT_FOUND.
	if _, err := reservations.Create.Call(ctx, e.client(e.globex), reserveInput("globex", p.ID, "g1", 1, reservationsT0, 60)); codeOf(err) != core.CodeNotFound {
		t.Fatalf("unoffered pool = %v, want NOT_FOUND", err)
	}

	// Nothing fits: INVALID_STATE with the placement reasons, marked failed.
	_, err = reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, "r2", 7, reservationsT0.Add(30*time.Minute), 3600))
	ce := core.AsError(err)
	if ce.Code != core.CodeInvalidState || ce.Details["reason"] != "noCapacity" || ce.Details["reasons"] == nil {
		t.Fatalf("no capacity = %v %+v", err, ce.Details)
	}
	e.eventuallyState(fmt.Sprint(ce.Details["reservationId"]), "failed")

	// Windows that touch but do not overlap both take all eight.
	for i, at := range []time.Time{reservationsT0.Add(2 * time.Hour), reservationsT0.Add(3 * time.Hour)} {
		if r, err := reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, fmt.Sprint("adj", i), 8, at, 3600)); err != nil || r.State != "placed" {
			t.Fatalf("adjacent window %d = %+v, %v", i, r, err)
		}
	}
	// Bad input.
	bad := reserveInput("acme", p.ID, "r3", 1, reservationsT0, 0)
	if _, err := reservations.Create.Call(ctx, a, bad); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("zero duration = %v", err)
	}
}

func TestReservationsShippedH100Policy(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, _ := h100Pool(t, e)
	cedar, ok := policies.Get("pool-users-reserve-h100")
	if !ok {
		t.Fatal("the H100 policy is not shipped")
	}
	if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "acme", Name: "reserve-h100", Cedar: cedar}); err != nil {
		t.Fatal(err)
	}
	sam := e.client(e.stranger)
	// Without the user relation on the pool: denied.
	if _, err := reservations.Create.Call(ctx, sam, reserveInput("acme", p.ID, "s0", 1, reservationsT0, 3600)); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("without the relation = %v", err)
	}
	if _, err := e.admin.AddRelation(ctx, iam.Relation{TenantID: "acme", SubjectID: e.identityOf(e.stranger), Relation: "user",
		ResourceType: e.catalog.FullName("pool"), ResourceID: p.ID}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key     string
		count   int
		seconds int64
		allowed bool
	}{
		{"s1", 9, 3600, false},
		{"s2", 8, 73 * 3600, false},
		{"s3", 8, 72*3600 - 1, true},
	} {
		r, err := reservations.Create.Call(ctx, sam, reserveInput("acme", p.ID, tc.key, tc.count, reservationsT0, tc.seconds))
		id := core.DerivedID("rsv", "acme", e.identityOf(e.stranger), tc.key)
		if tc.allowed {
			if err != nil || r.State != "placed" || len(r.Allocations[0].Atoms) != 8 {
				t.Fatalf("%d GPUs for %ds = %+v, %v", tc.count, tc.seconds, r, err)
			}
			continue
		}
		if codeOf(err) != core.CodeAccessDenied {
			t.Fatalf("%d GPUs for %ds = %v, want ACCESS_DENIED", tc.count, tc.seconds, err)
		}
		e.eventuallyState(id, "denied")
	}
	if got := e.count(`SELECT count(*) FROM device_bookings`); got != 8 {
		t.Fatalf("bookings = %d, want 8", got)
	}
}

func TestReservationsQuotaOnAnOfferedPool(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, _ := h100Pool(t, e)
	if _, err := pools.Offer.Call(ctx, e.client(e.boot.UserToken), pools.OfferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex",
		Quota: map[string]int64{"gpu": 3}}); err != nil {
		t.Fatal(err)
	}
	g := e.client(e.globex)
	if r, err := reservations.Create.Call(ctx, g, reserveInput("globex", p.ID, "g1", 2, reservationsT0, 3600)); err != nil || r.State != "placed" || r.TenantID != "globex" {
		t.Fatalf("within quota = %+v, %v", r, err)
	}
	_, err := reservations.Create.Call(ctx, g, reserveInput("globex", p.ID, "g2", 2, reservationsT0.Add(30*time.Minute), 3600))
	ce := core.AsError(err)
	if ce.Code != core.CodeQuotaExceeded || fmt.Sprint(ce.Details["limit"]) != "3" {
		t.Fatalf("over quota = %v %+v", err, ce.Details)
	}
	e.eventuallyState(fmt.Sprint(ce.Details["reservationId"]), "failed")
	if got := e.count(`SELECT count(*) FROM device_bookings WHERE tenant_id = 'globex'`); got != 2 {
		t.Fatalf("globex bookings = %d, want 2", got)
	}
	// After the first window, the quota is free again.
	if _, err := reservations.Create.Call(ctx, g, reserveInput("globex", p.ID, "g3", 3, reservationsT0.Add(time.Hour), 3600)); err != nil {
		t.Fatalf("the next window = %v", err)
	}
}

// Many concurrent creates for eight free atoms: exactly eight placed, every
// other one refused cleanly, and no two bookings of an atom overlap.
func TestReservationsRace(t *testing.T) {
	e := newEnv(t)
	p, _ := h100Pool(t, e)
	const n = 200
	statuses := make([]int, n)
	bodies := make([]string, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 50}, Timeout: 60 * time.Second}
	start := reservationsT0.UnixMilli()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			body := fmt.Sprintf(`{"tenantId":"acme","poolId":%q,"devices":{"class":"gpu","count":1},"start":%d,"duration":3600,"idempotencyKey":"race-%d"}`,
				p.ID, start, i)
			req, _ := http.NewRequest(http.MethodPost, e.url+"/api/compute/reservations/create", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+e.boot.UserToken)
			resp, err := client.Do(req)
			if err != nil {
				bodies[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			var out json.RawMessage
			_ = json.NewDecoder(resp.Body).Decode(&out)
			statuses[i], bodies[i] = resp.StatusCode, string(out)
		}()
	}
	wg.Wait()
	placed, refused := 0, 0
	for i, s := range statuses {
		switch {
		case s == 200 && strings.Contains(bodies[i], `"placed"`):
			placed++
		case s == 409 && strings.Contains(bodies[i], "INVALID_STATE"), s == 503 && strings.Contains(bodies[i], "UNAVAILABLE"):
			refused++
		default:
			t.Fatalf("call %d = %d %s", i, s, bodies[i])
		}
	}
	t.Logf("placed %d, refused %d", placed, refused)
	if placed != 8 || refused != n-8 {
		t.Fatalf("placed %d, refused %d; want 8 and %d", placed, refused, n-8)
	}
	if got := e.count(`SELECT count(*) FROM device_bookings a JOIN device_bookings b ON a.device_node_id = b.device_node_id
		AND a.device_id = b.device_id AND a.ctid < b.ctid AND a.during && b.during`); got != 0 {
		t.Fatalf("%d overlapping booking pairs", got)
	}
	if got := e.count(`SELECT count(DISTINCT device_id) FROM device_bookings`); got != 8 {
		t.Fatalf("%d atoms booked, want 8", got)
	}
}

// A window's start lies between now minus the clock tolerance and the
// server's bound ahead (one year by default), on the database's clock; the
// refusal is INVALID_INPUT naming start, and nothing is drafted.
func TestReservationsWindowBounds(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, _ := h100Pool(t, e)
	a := e.client(e.boot.UserToken)
	now := time.Now()
	for _, tc := range []struct {
		name   string
		start  time.Time
		reason string
	}{
		{"epoch", time.UnixMilli(0), "past"},
		{"an-hour-ago", now.Add(-time.Hour), "past"},
		{"past-the-tolerance", now.Add(-2 * time.Minute), "past"},
		{"past-the-year-ahead", now.Add(366 * 24 * time.Hour), "tooFarAhead"},
		{"293-years-ahead", now.AddDate(293, 0, 0), "tooFarAhead"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, "w-"+tc.name, 1, tc.start, 60))
			if ce := core.AsError(err); ce.Code != core.CodeInvalidInput || ce.Details["field"] != "start" || ce.Details["reason"] != tc.reason {
				t.Fatalf("create starting %v = %v %+v, want INVALID_INPUT start %s", tc.start, err, ce.Details, tc.reason)
			}
		})
	}
	if n := e.count(`SELECT count(*) FROM reservations`); n != 0 {
		t.Fatalf("%d reservations written for refused windows", n)
	}
	// Within the tolerance, and just inside the year, are placed.
	for key, start := range map[string]time.Time{"skewed": now.Add(-30 * time.Second), "a-year": now.Add(364 * 24 * time.Hour)} {
		if r, err := reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, key, 1, start, 60)); err != nil || r.State != "placed" {
			t.Fatalf("create %s = %+v, %v", key, r, err)
		}
	}
}

// Node binding is not served yet (UNSUPPORTED, planned), and binding
// instance is for vps-host pools only: neither is drafted.
func TestReservationsUnservedBindings(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, _ := h100Pool(t, e)
	a := e.client(e.boot.UserToken)
	for binding, want := range map[string]map[string]any{
		"instance": {"code": core.CodeInvalidInput, "field": "binding", "reason": "poolClass"},
		"node":     {"code": core.CodeUnsupported, "field": "binding", "reason": "planned", "phase": "v0.5"},
	} {
		in := reserveInput("acme", p.ID, "b-"+binding, 1, reservationsT0, 3600)
		in.Binding = binding
		_, err := reservations.Create.Call(ctx, a, in)
		ce := core.AsError(err)
		if ce.Code != want["code"] || ce.Details["field"] != want["field"] || ce.Details["reason"] != want["reason"] ||
			(want["phase"] != nil && ce.Details["phase"] != want["phase"]) {
			t.Fatalf("binding %s on a %s pool = %v %+v, want %v", binding, p.Class, err, ce.Details, want)
		}
	}
	if n := e.count(`SELECT count(*) FROM reservations`); n != 0 {
		t.Fatalf("%d reservations written for unserved bindings", n)
	}
}

// A get with its decision cached is one database round trip: BEGIN READ
// ONLY, the reservation's one statement and COMMIT go as one pipeline.
func TestReservationGetIsOneRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a := e.client(e.boot.UserToken)
	p, _ := h100Pool(t, e)
	r, err := reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, "one-trip", 1, reservationsT0, 3600))
	if err != nil {
		t.Fatal(err)
	}
	in := reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID}
	if _, err := reservations.Get.Call(ctx, a, in); err != nil { // caches the decision
		t.Fatal(err)
	}
	e.queries.roundTrips()
	e.queries.take()
	got, err := reservations.Get.Call(ctx, a, in)
	if err != nil || got.ID != r.ID || len(got.Allocations) != 1 {
		t.Fatalf("get = %+v, %v", got, err)
	}
	sql := e.queries.take()
	if n := e.queries.roundTrips(); n != 1 || len(sql) != 3 || sql[0] != "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" || sql[2] != "COMMIT" {
		t.Fatalf("get: %d round trips, statements %q; want 1: BEGIN, the read, COMMIT", n, sql)
	}
}

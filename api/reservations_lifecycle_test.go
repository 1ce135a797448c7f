package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/iam/policies"
)

func TestReservationsListScopes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, _ := h100Pool(t, e)
	owner, sam := e.client(e.boot.UserToken), e.client(e.stranger)
	mine, err := reservations.Create.Call(ctx, owner, reserveInput("acme", p.ID, "l1", 1, reservationsT0, 3600))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reservations.Create.Call(ctx, owner, reserveInput("acme", p.ID, "l2", 1, reservationsT0.Add(2*time.Hour), 3600)); err != nil {
		t.Fatal(err)
	}
	if _, err := reservations.Cancel.Call(ctx, owner, reservations.ReservationInput{TenantID: "acme", ReservationID: mine.ID}); err != nil {
		t.Fatal(err)
	}

	list, err := reservations.List.Call(ctx, owner, reservations.ListInput{TenantID: "acme"})
	if err != nil || len(list.Items) != 2 || list.Items[0].CreatedAt < list.Items[1].CreatedAt {
		t.Fatalf("mine = %+v, %v; want both, newest first", list, err)
	}
	if len(list.Items[1].Allocations) != 1 {
		t.Fatalf("allocations missing from the list: %+v", list.Items[1])
	}
	list, err = reservations.List.Call(ctx, owner, reservations.ListInput{TenantID: "acme", State: "cancelled"})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != mine.ID {
		t.Fatalf("state filter = %+v, %v", list, err)
	}
	// A member of the tenant without a policy granting reads is denied at
	// the coarse gate.
	if _, err := reservations.List.Call(ctx, sam, reservations.ListInput{TenantID: "acme"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("stranger's list = %v", err)
	}
	if list, err := reservations.List.Call(ctx, owner, reservations.ListInput{TenantID: "acme", Scope: "all"}); err != nil || len(list.Items) != 2 {
		t.Fatalf("owner's all = %+v, %v", list, err)
	}
	if _, err := reservations.List.Call(ctx, e.client(e.globex), reservations.ListInput{TenantID: "acme"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("another tenant = %v", err)
	}
	if _, err := reservations.List.Call(ctx, owner, reservations.ListInput{TenantID: "acme", State: "gone"}); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("bad state = %v", err)
	}
}

func TestReservationsCancelFreesTheAtoms(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, _ := h100Pool(t, e)
	a := e.client(e.boot.UserToken)
	r, err := reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, "c1", 8, reservationsT0, 3600))
	if err != nil {
		t.Fatal(err)
	}
	// Not active yet: release is refused, pointing at cancel.
	_, err = reservations.Release.Call(ctx, a, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID})
	if ce := core.AsError(err); ce.Code != core.CodeInvalidState || ce.Details["hint"] != "reservations.cancel" {
		t.Fatalf("release of a placed reservation = %v %+v", err, ce.Details)
	}
	// Renew needs a lease.
	if _, err := reservations.Renew.Call(ctx, a, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("renew without a lease = %v", err)
	}
	for range 2 { // cancelling twice answers the same
		c, err := reservations.Cancel.Call(ctx, a, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID})
		if err != nil || c.State != "cancelled" {
			t.Fatalf("cancel = %+v, %v", c, err)
		}
	}
	if got := e.count(`SELECT count(*) FROM device_bookings`); got != 0 {
		t.Fatalf("%d bookings left after the cancel", got)
	}
	if _, err := reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, "c2", 8, reservationsT0, 3600)); err != nil {
		t.Fatalf("the cancelled atoms are not free: %v", err)
	}
	if _, err := reservations.Cancel.Call(ctx, e.client(e.globex), reservations.ReservationInput{TenantID: "globex", ReservationID: r.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("another tenant's cancel = %v", err)
	}
	if got := e.count(`SELECT count(*) FROM events WHERE resource_id = $1 AND type = 'reservation.cancelled'`, r.ID); got != 1 {
		t.Fatalf("%d cancelled events", got)
	}
}

func TestReservationsExtend(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, _ := h100Pool(t, e)
	a := e.client(e.boot.UserToken)
	r, err := reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, "x1", 4, reservationsT0, 3600))
	if err != nil {
		t.Fatal(err)
	}
	// Another reservation takes all eight GPUs from the third hour.
	if _, err := reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, "x2", 8, reservationsT0.Add(2*time.Hour), 3600)); err != nil {
		t.Fatal(err)
	}
	for range 2 { // extending to the same end twice books once
		x, err := reservations.Extend.Call(ctx, a, reservations.ExtendInput{TenantID: "acme", ReservationID: r.ID, Duration: 2 * 3600})
		if err != nil || x.End != reservationsT0.Add(2*time.Hour).UnixMilli() {
			t.Fatalf("extend = %+v, %v", x, err)
		}
	}
	if got := e.count(`SELECT count(*) FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id
		WHERE a.reservation_id = $1 AND b.during = tstzrange($2::timestamptz, $3::timestamptz)`,
		r.ID, reservationsT0, reservationsT0.Add(2*time.Hour)); got != 4 {
		t.Fatalf("%d bookings stretched to the new end, want 4", got)
	}
	// Into the hour the other reservation holds: CONFLICT, nothing changes.
	_, err = reservations.Extend.Call(ctx, a, reservations.ExtendInput{TenantID: "acme", ReservationID: r.ID, Duration: 3 * 3600})
	if ce := core.AsError(err); ce.Code != core.CodeConflict || ce.Details["reason"] != "atomsTaken" {
		t.Fatalf("extend into booked time = %v %+v", err, ce.Details)
	}
	got, err := reservations.Get.Call(ctx, a, reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID})
	if err != nil || got.End != reservationsT0.Add(2*time.Hour).UnixMilli() {
		t.Fatalf("after the refused extension = %+v, %v", got, err)
	}
	// Shorter is not an extension.
	if _, err := reservations.Extend.Call(ctx, a, reservations.ExtendInput{TenantID: "acme", ReservationID: r.ID, Duration: 1800}); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("shorter = %v", err)
	}
	// The authorization row still carries the real duration.
	var hours float64
	if err := e.store.Pool.QueryRow(ctx, `SELECT (attributes->>'durationHours')::float FROM authz_resources WHERE id = $1`, r.ID).Scan(&hours); err != nil || hours != 2 {
		t.Fatalf("durationHours = %v, %v; want 2", hours, err)
	}
}

// The shipped policies bound a reservation at 72 hours (H100 creates) and an
// extension's resulting duration too (bounded-extend): the extension is
// decided on the extended request, so it cannot pass the bound.
func TestReservationsExtendPastThePolicyIsDenied(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, _ := h100Pool(t, e)
	for _, name := range []string{"pool-users-reserve-h100", policies.BoundedExtend} {
		cedar, ok := policies.Get(name)
		if !ok {
			t.Fatalf("policy %s is not shipped", name)
		}
		if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "acme", Name: name, Cedar: cedar}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.admin.AddRelation(ctx, iam.Relation{TenantID: "acme", SubjectID: e.identityOf(e.stranger), Relation: "user",
		ResourceType: e.catalog.FullName("pool"), ResourceID: p.ID}); err != nil {
		t.Fatal(err)
	}
	sam := e.client(e.stranger)
	r, err := reservations.Create.Call(ctx, sam, reserveInput("acme", p.ID, "p1", 8, reservationsT0, 70*3600))
	if err != nil {
		t.Fatal(err)
	}
	if x, err := reservations.Extend.Call(ctx, sam, reservations.ExtendInput{TenantID: "acme", ReservationID: r.ID, Duration: 72*3600 - 1}); err != nil || x.End != r.Start+(72*3600-1)*1000 {
		t.Fatalf("extend within 72 h = %+v, %v", x, err)
	}
	if _, err := reservations.Extend.Call(ctx, sam, reservations.ExtendInput{TenantID: "acme", ReservationID: r.ID, Duration: 73 * 3600}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("extend past 72 h = %v, want ACCESS_DENIED", err)
	}
	got, err := reservations.Get.Call(ctx, e.client(e.boot.UserToken), reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID})
	if err != nil || got.End != r.Start+(72*3600-1)*1000 {
		t.Fatalf("after the denial = %+v, %v", got, err)
	}
	var hours float64
	if err := e.store.Pool.QueryRow(ctx, `SELECT (attributes->>'durationHours')::float FROM authz_resources WHERE id = $1`, r.ID).Scan(&hours); err != nil || hours != 72 {
		t.Fatalf("durationHours after the denial = %v, %v; want 72", hours, err)
	}
}

// A pool's policy.maxPending bounds how many of a tenant's reservations may
// wait for their start; one starting now is never held back by it.
func TestReservationsMaxPending(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{"maxPending": 1}`)
	e.node(schedulableNode(p.ID, "gpu-a01"), fixture(t, "h100-8x-sxm.json"))
	a := e.client(e.boot.UserToken)
	if _, err := reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, "m1", 1, reservationsT0, 3600)); err != nil {
		t.Fatal(err)
	}
	_, err := reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, "m2", 1, reservationsT0.Add(time.Hour), 3600))
	ce := core.AsError(err)
	if ce.Code != core.CodeQuotaExceeded || ce.Details["resource"] != "pendingReservations" || ce.Details["limit"] != float64(1) {
		t.Fatalf("second future reservation = %v %+v", err, ce.Details)
	}
	now := reservations.CreateInput{TenantID: "acme", PoolID: p.ID, Devices: reserveInput("", "", "", 1, reservationsT0, 0).Devices,
		Duration: 600, IdempotencyKey: "m3"}
	if r, err := reservations.Create.Call(ctx, a, now); err != nil || r.State != "placed" {
		t.Fatalf("a reservation starting now = %+v, %v", r, err)
	}
}

// An extension on an offered pool counts against the offer's quota over the
// added time.
func TestReservationsExtendWithinTheOfferQuota(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, _ := h100Pool(t, e)
	if _, err := pools.Offer.Call(ctx, e.client(e.boot.UserToken), pools.OfferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex",
		Quota: map[string]int64{"gpu": 3}}); err != nil {
		t.Fatal(err)
	}
	g := e.client(e.globex)
	r, err := reservations.Create.Call(ctx, g, reserveInput("globex", p.ID, "q1", 2, reservationsT0, 3600))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reservations.Create.Call(ctx, g, reserveInput("globex", p.ID, "q2", 2, reservationsT0.Add(2*time.Hour), 3600)); err != nil {
		t.Fatal(err)
	}
	// [1h, 2h) holds none of globex's GPUs: 2 more fit the quota of 3.
	if x, err := reservations.Extend.Call(ctx, g, reservations.ExtendInput{TenantID: "globex", ReservationID: r.ID, Duration: 2 * 3600}); err != nil || x.End != reservationsT0.Add(2*time.Hour).UnixMilli() {
		t.Fatalf("extend within the quota = %+v, %v", x, err)
	}
	// [2h, 3h) holds q2's 2: 2 more would be 4.
	_, err = reservations.Extend.Call(ctx, g, reservations.ExtendInput{TenantID: "globex", ReservationID: r.ID, Duration: 3 * 3600})
	if ce := core.AsError(err); ce.Code != core.CodeQuotaExceeded || ce.Details["limit"] != float64(3) || ce.Details["inUse"] != float64(2) {
		t.Fatalf("extend over the quota = %v %+v", err, ce.Details)
	}
	if got, err := reservations.Get.Call(ctx, g, reservations.ReservationInput{TenantID: "globex", ReservationID: r.ID}); err != nil || got.End != reservationsT0.Add(2*time.Hour).UnixMilli() {
		t.Fatalf("after the refusal = %+v, %v", got, err)
	}
}

// A request that does not fit takes atoms held only by spot reservations,
// which are preempted (a spot reservation not begun is cancelled, with the
// reason); spot requests never preempt.
func TestReservationsPreemptSpot(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, _ := h100Pool(t, e)
	a := e.client(e.boot.UserToken)
	spot := reserveInput("acme", p.ID, "spot-1", 8, reservationsT0, 2*3600)
	spot.Spot = true
	victim, err := reservations.Create.Call(ctx, a, spot)
	if err != nil || victim.State != "placed" {
		t.Fatalf("spot = %+v, %v", victim, err)
	}
	// Another spot request does not preempt it.
	other := reserveInput("acme", p.ID, "spot-2", 1, reservationsT0.Add(time.Hour), 3600)
	other.Spot = true
	if _, err := reservations.Create.Call(ctx, a, other); core.AsError(err).Details["reason"] != "noCapacity" {
		t.Fatalf("a spot request for a full pool = %v", err)
	}
	r, err := reservations.Create.Call(ctx, a, reserveInput("acme", p.ID, "regular", 4, reservationsT0.Add(time.Hour), 3600))
	if err != nil || r.State != "placed" {
		t.Fatalf("a regular request = %+v, %v", r, err)
	}
	got, err := reservations.Get.Call(ctx, a, reservations.ReservationInput{TenantID: "acme", ReservationID: victim.ID})
	if err != nil || got.State != "cancelled" || !strings.Contains(string(got.Failure), `"preempted"`) {
		t.Fatalf("the spot reservation = %+v (%s), %v", got, got.Failure, err)
	}
	if n := e.count(`SELECT count(*) FROM device_bookings b JOIN allocations a ON a.id = b.allocation_id WHERE a.reservation_id = $1`, victim.ID); n != 0 {
		t.Fatalf("%d bookings of the preempted reservation left", n)
	}
	if n := e.count(`SELECT count(*) FROM events WHERE resource_id = $1 AND type = 'reservation.cancelled'`, victim.ID); n != 1 {
		t.Fatalf("%d cancelled events", n)
	}
}

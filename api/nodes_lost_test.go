package api_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	rsvactivities "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store"
)

// deadNodeEnv is acme's H100 pool with a liveness sweeper and the
// reservation activities the workflow would run.
type deadNodeEnv struct {
	*env
	gateway *agentgateway.Gateway
	act     *rsvactivities.Reservations
}

func newDeadNodeEnv(t *testing.T) *deadNodeEnv {
	e := newEnv(t)
	return &deadNodeEnv{env: e, gateway: e.withGateway(agentgateway.Deps{}), act: &rsvactivities.Reservations{Store: e.store}}
}

// reserveNow reserves count GPUs of the pool from now for an hour.
func (de *deadNodeEnv) reserveNow(poolID, key string, count int) reservations.Reservation {
	de.t.Helper()
	r, err := reservations.Create.Call(context.Background(), de.client(de.boot.UserToken), reservations.CreateInput{
		TenantID: "acme", PoolID: poolID, Devices: placement.Request{Class: "gpu", Count: count}, Duration: 3600, IdempotencyKey: key})
	if err != nil || r.State != "placed" || len(r.Allocations) != 1 {
		de.t.Fatalf("create %s = %+v, %v", key, r, err)
	}
	return r
}

// bind runs the workflow's bind step: placed -> binding, cdi.expose queued.
func (de *deadNodeEnv) bind(id string) {
	de.t.Helper()
	if st, err := de.act.Bind(context.Background(), "acme", id, time.Minute); err != nil || st != "binding" {
		de.t.Fatalf("bind %s = %q, %v", id, st, err)
	}
}

func (de *deadNodeEnv) bindStatus(id string) string {
	de.t.Helper()
	st, err := de.act.BindStatus(context.Background(), "acme", id)
	if err != nil {
		de.t.Fatal(err)
	}
	return st
}

// lapse makes the node's liveness lease lapse ago ago and sweeps once.
func (de *deadNodeEnv) lapse(nodeID string, ago time.Duration) {
	de.t.Helper()
	if _, err := de.store.Pool.Exec(context.Background(), `INSERT INTO node_liveness (node_id, expires_at, last_heartbeat_at)
		VALUES ($1, now() - $2 * interval '1 millisecond', now())
		ON CONFLICT (node_id) DO UPDATE SET expires_at = EXCLUDED.expires_at`, nodeID, ago.Milliseconds()); err != nil {
		de.t.Fatal(err)
	}
	de.sweep()
}

func (de *deadNodeEnv) sweep() {
	de.t.Helper()
	if _, err := de.gateway.SweepLiveness(context.Background()); err != nil {
		de.t.Fatal(err)
	}
}

func (de *deadNodeEnv) get(id string) reservations.Reservation {
	de.t.Helper()
	r, err := reservations.Get.Call(context.Background(), de.client(de.boot.UserToken),
		reservations.ReservationInput{TenantID: "acme", ReservationID: id})
	if err != nil {
		de.t.Fatal(err)
	}
	return r
}

// commandStates are the states of the node's commands of kind.
func (de *deadNodeEnv) commandStates(nodeID, kind string) []string {
	de.t.Helper()
	rows, err := de.store.Pool.Query(context.Background(), `SELECT state FROM node_commands WHERE node_id = $1 AND kind = $2 ORDER BY seq`,
		nodeID, kind)
	if err != nil {
		de.t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			de.t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func failureOf(t *testing.T, r reservations.Reservation) (code, reason string) {
	t.Helper()
	var f struct {
		Code    string         `json:"code"`
		Details map[string]any `json:"details"`
	}
	if err := json.Unmarshal(r.Failure, &f); err != nil {
		t.Fatalf("failure %s: %v", r.Failure, err)
	}
	reason, _ = f.Details["reason"].(string)
	return f.Code, reason
}

func TestNodeUnreachableReplacesABindingReservation(t *testing.T) {
	de := newDeadNodeEnv(t)
	p, a := h100Pool(t, de.env)
	b := de.node(schedulableNode(p.ID, "gpu-a02"), fixture(t, "h100-8x-sxm.json"))
	r := de.reserveNow(p.ID, "whole", 8)
	dead, healthy := r.Allocations[0].NodeID, b.ID
	if dead == b.ID {
		healthy = a.ID
	}
	de.bind(r.ID)
	if got := de.commandStates(dead, store.CommandCDIExpose); len(got) != 1 || got[0] != "queued" {
		t.Fatalf("expose on the first node: %v", got)
	}

	de.lapse(dead, time.Second)

	got := de.get(r.ID)
	if got.State != "binding" || len(got.Allocations) != 1 || got.Allocations[0].NodeID != healthy || len(got.Allocations[0].Atoms) != 8 {
		t.Fatalf("after the node became unreachable: %+v", got)
	}
	if n := de.count(`SELECT count(*) FROM device_bookings WHERE device_node_id = $1`, dead); n != 0 {
		t.Fatalf("%d bookings left on the dead node", n)
	}
	if n := de.count(`SELECT count(*) FROM device_bookings b JOIN allocations l ON l.id = b.allocation_id
		WHERE l.reservation_id = $1 AND b.device_node_id = $2 AND upper(b.during) = to_timestamp($3 / 1000.0)`,
		r.ID, healthy, r.End); n != 8 {
		t.Fatalf("%d bookings on the healthy node to the end, want 8", n)
	}
	// The dead node's expose is cancelled (it must not expose the atoms
	// should it come back); the healthy node gets its own.
	if got := de.commandStates(dead, store.CommandCDIExpose); len(got) != 1 || got[0] != "cancelled" {
		t.Fatalf("expose on the dead node: %v", got)
	}
	if got := de.commandStates(healthy, store.CommandCDIExpose); len(got) != 1 || got[0] != "queued" {
		t.Fatalf("expose on the healthy node: %v", got)
	}
	if st := de.bindStatus(r.ID); st != store.BindingWaiting {
		t.Fatalf("bind status %q, want waiting", st)
	}
	if n := de.count(`SELECT count(*) FROM events WHERE resource_id = $1 AND type = 'reservation.replaced'`, r.ID); n != 1 {
		t.Fatalf("%d replaced events", n)
	}
	// Sweeping again changes nothing.
	de.sweep()
	if again := de.get(r.ID); again.Allocations[0].ID != got.Allocations[0].ID {
		t.Fatalf("a second sweep placed it again: %+v", again)
	}
}

func TestNodeUnreachableFailsABindingReservationWhenNothingElseFits(t *testing.T) {
	de := newDeadNodeEnv(t)
	p, n := h100Pool(t, de.env)
	r := de.reserveNow(p.ID, "now", 4)
	future, err := reservations.Create.Call(context.Background(), de.client(de.boot.UserToken),
		reserveInput("acme", p.ID, "future", 8, reservationsT0, 3600))
	if err != nil || future.State != "placed" {
		t.Fatalf("future = %+v, %v", future, err)
	}
	de.bind(r.ID)
	// The agent exposed the GPUs, then went silent before the workflow
	// saw it.
	if _, err := de.store.Pool.Exec(context.Background(), `UPDATE node_commands SET state = 'succeeded', result_at = now(),
		finished_at = now() WHERE node_id = $1`, n.ID); err != nil {
		t.Fatal(err)
	}

	de.lapse(n.ID, time.Second)

	got := de.get(r.ID)
	if got.State != "failed" || got.EndReason != "failed" || got.EndedAt == nil {
		t.Fatalf("after the node became unreachable: %+v", got)
	}
	if code, reason := failureOf(t, got); code != string(core.CodeUnavailable) || reason != "nodeUnreachable" {
		t.Fatalf("failure %s", got.Failure)
	}
	// The workflow's bind loop hears it on its next poll, not at the timeout.
	if st := de.bindStatus(r.ID); st != store.BindingFailed {
		t.Fatalf("bind status %q, want failed", st)
	}
	if n := de.count(`SELECT count(*) FROM device_bookings b JOIN allocations l ON l.id = b.allocation_id
		WHERE l.reservation_id = $1 AND upper(b.during) > now()`, r.ID); n != 0 {
		t.Fatalf("%d bookings still running", n)
	}
	if got := de.commandStates(n.ID, store.CommandCDIWithdraw); len(got) != 1 || got[0] != "queued" {
		t.Fatalf("withdraw on the dead node: %v", got)
	}
	// A reservation whose start is still ahead keeps its booking: the node
	// may come back before it.
	if f := de.get(future.ID); f.State != "placed" || len(f.Allocations) != 1 {
		t.Fatalf("future reservation: %+v", f)
	}
}

func TestNodeLostEndsAnActiveHold(t *testing.T) {
	de := newDeadNodeEnv(t)
	p, n := h100Pool(t, de.env)
	r := de.reserveNow(p.ID, "hold", 2)
	de.bind(r.ID)
	if st, err := de.act.MarkActive(context.Background(), "acme", r.ID); err != nil || st != "active" {
		t.Fatalf("activate = %q, %v", st, err)
	}

	// Unreachable: the hold stays active with the condition.
	de.lapse(n.ID, time.Second)
	got := de.get(r.ID)
	if got.State != "active" || len(got.Conditions) != 1 || got.Conditions[0].Type != "NodeUnreachable" ||
		got.Conditions[0].NodeID != n.ID || got.Conditions[0].Since == 0 {
		t.Fatalf("on an unreachable node: %+v", got)
	}
	since := got.Conditions[0].Since
	de.sweep()
	if again := de.get(r.ID); len(again.Conditions) != 1 || again.Conditions[0].Since != since {
		t.Fatalf("a second sweep changed the condition: %+v", again.Conditions)
	}

	// Heard from again: the condition goes.
	if _, err := de.store.Pool.Exec(context.Background(), `WITH l AS (INSERT INTO node_liveness (node_id, expires_at, last_heartbeat_at)
			VALUES ($1, now() + interval '1 hour', now())
			ON CONFLICT (node_id) DO UPDATE SET expires_at = EXCLUDED.expires_at)
		UPDATE nodes SET connectivity = 'connected' WHERE id = $1`,
		n.ID); err != nil {
		t.Fatal(err)
	}
	de.sweep()
	if got := de.get(r.ID); got.State != "active" || len(got.Conditions) != 0 {
		t.Fatalf("after the node came back: %+v", got)
	}

	// Lost (its lease lapsed longer ago than the pool's lostAfter): the hold
	// ends failed, reason nodeLost, its usage closed and its GPUs withdrawn.
	de.lapse(n.ID, time.Second)
	de.lapse(n.ID, time.Hour)
	got = de.get(r.ID)
	if got.State != "failed" || got.EndReason != "nodeLost" || got.EndedAt == nil || len(got.Conditions) != 0 {
		t.Fatalf("on a lost node: %+v", got)
	}
	if code, reason := failureOf(t, got); code != string(core.CodeUnavailable) || reason != "nodeLost" {
		t.Fatalf("failure %s", got.Failure)
	}
	if n := de.count(`SELECT count(*) FROM usage_intervals WHERE reservation_id = $1 AND ended_at IS NULL`, r.ID); n != 0 {
		t.Fatalf("%d usage intervals still open", n)
	}
	if n := de.count(`SELECT count(*) FROM usage_intervals WHERE reservation_id = $1`, r.ID); n != 1 {
		t.Fatalf("%d usage intervals, want 1", n)
	}
	if n := de.count(`SELECT count(*) FROM device_bookings b JOIN allocations l ON l.id = b.allocation_id
		WHERE l.reservation_id = $1 AND upper(b.during) > now()`, r.ID); n != 0 {
		t.Fatalf("%d bookings still running", n)
	}
	if got := de.commandStates(n.ID, store.CommandCDIWithdraw); len(got) != 1 {
		t.Fatalf("withdraw on the lost node: %v", got)
	}
	if n := de.count(`SELECT count(*) FROM events WHERE resource_id = $1 AND type = 'reservation.failed'
		AND data->>'endReason' = 'nodeLost'`, r.ID); n != 1 {
		t.Fatalf("%d failed events with endReason nodeLost", n)
	}
}

func TestNodeLostReplacesAPlacedReservationThenFailsIt(t *testing.T) {
	de := newDeadNodeEnv(t)
	p, a := h100Pool(t, de.env)
	b := de.node(schedulableNode(p.ID, "gpu-a02"), fixture(t, "h100-8x-sxm.json"))
	r := de.reserveNow(p.ID, "placed", 2) // placed, not bound yet: the workflow binds it
	first, second := r.Allocations[0].NodeID, b.ID
	if first == b.ID {
		second = a.ID
	}

	// Lost at once (the lease lapsed long past lostAfter): placed again on
	// the other node, still placed, no command queued for it.
	de.lapse(first, time.Hour)
	got := de.get(r.ID)
	if got.State != "placed" || len(got.Allocations) != 1 || got.Allocations[0].NodeID != second {
		t.Fatalf("after the first node was lost: %+v", got)
	}
	if n := de.count(`SELECT count(*) FROM node_commands`); n != 0 {
		t.Fatalf("%d commands queued for a reservation not binding", n)
	}
	if n := de.count(`SELECT count(*) FROM events WHERE resource_id = $1 AND type = 'reservation.replaced'
		AND data->>'reason' = 'nodeLost' AND data->>'nodeId' = $2`, r.ID, first); n != 1 {
		t.Fatalf("%d replaced events naming the lost node", n)
	}

	// The second node lost too: nothing else fits, and it fails at once.
	de.lapse(second, time.Hour)
	got = de.get(r.ID)
	if got.State != "failed" || got.EndReason != "nodeLost" {
		t.Fatalf("after the second node was lost: %+v", got)
	}
	if code, reason := failureOf(t, got); code != string(core.CodeUnavailable) || reason != "nodeLost" {
		t.Fatalf("failure %s", got.Failure)
	}
}

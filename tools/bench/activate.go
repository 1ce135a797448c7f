package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/core/placement"
	states "github.com/better-compute/better-compute/core/reservations"
)

// activate measures create -> active: each call creates a 1-GPU hold
// reservation starting now (its workflow binds it at once) and polls
// reservations.get every cfg.activatePoll until it is active. The row's
// latencies are create -> active; CreateCall is the create call's own.
// On the embedded stack it reserves in a pool of its own whose nodes need
// no agent to bind (see target.activation). Reservations starting now hold
// their GPUs for the run, so the scenario ends early once the pool's GPUs
// are booked (the note says so).
func activate(ctx context.Context, t *target, cfg config, prof *profiler, progress func(string, ...any)) (result, error) {
	res := result{Scenario: "activate", Clients: cfg.clients}
	poolID, limit := t.pool, t.perWindow // against -api: one node's worth of the -pool
	if t.activation != nil {
		progress("adding a pool of %d nodes that bind without an agent", cfg.activateNodes)
		var err error
		if poolID, err = t.activation(ctx, cfg.activateNodes); err != nil {
			return res, fmt.Errorf("activate pool: %w", err)
		}
		limit = 8 * cfg.activateNodes
	}
	var mu sync.Mutex
	var createCalls []time.Duration
	var created []string
	var full atomic.Bool
	stuck := map[states.State]int{} // the state a timed-out poll last saw
	call := func(ctx context.Context, i int) error {
		if i >= limit || full.Load() {
			return errEnough
		}
		in := reservations.CreateInput{TenantID: t.tenant, PoolID: poolID, Duration: windowSeconds,
			Devices:        placement.Request{Class: placement.ClassGPU, Count: 1},
			IdempotencyKey: fmt.Sprintf("bench-%s-activate-%d", t.runID, i)}
		t0 := time.Now()
		r, err := reservations.Create.Call(ctx, t.user, in)
		d := time.Since(t0)
		if noCapacity(err) {
			full.Store(true)
			return errEnough
		}
		mu.Lock()
		createCalls = append(createCalls, d)
		if err == nil {
			created = append(created, r.ID)
		}
		mu.Unlock()
		if err != nil {
			return err
		}
		get := reservations.ReservationInput{TenantID: t.tenant, ReservationID: r.ID}
		for state := states.State(r.State); state != states.Active; {
			if states.Terminal(state) || state == states.Expired {
				return fmt.Errorf("reservation %s became %s, not active", r.ID, state)
			}
			select {
			case <-ctx.Done():
				mu.Lock()
				stuck[state]++
				mu.Unlock()
				return ctx.Err()
			case <-time.After(cfg.activatePoll):
			}
			if r, err = reservations.Get.Call(ctx, t.user, get); err != nil {
				return err
			}
			state = states.State(r.State)
		}
		return nil
	}
	progress("creates starting now, polled every %s until active (at most %d)", cfg.activatePoll, limit)
	prof.begin(res.Scenario)
	run := drive(ctx, cfg.clients, cfg.duration, cfg.requests, call, nil)
	prof.end()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.fill(run)
	cc := summarize(createCalls)
	res.CreateCall = &cc
	res.Note = fmt.Sprintf("latencies are create -> active (polled every %s); the create call itself: p50 %.2f ms, p99 %.2f ms",
		cfg.activatePoll, cc.P50Ms, cc.P99Ms)
	for state, n := range stuck {
		res.Note += fmt.Sprintf("; %d timed out while %s", n, state)
	}
	if full.Load() || len(run.latencies) >= limit {
		res.Note += fmt.Sprintf("; ended early: the pool's GPUs were all booked after %d creates", len(createCalls))
	}
	if !t.embedded {
		// A deployment's GPUs are real: give them back (not measured).
		progress("releasing the %d reservations activate made", len(created))
		for _, id := range created {
			_, _ = reservations.Release.Call(context.WithoutCancel(ctx), t.user, reservations.ReservationInput{TenantID: t.tenant, ReservationID: id})
		}
	}
	return res, nil
}

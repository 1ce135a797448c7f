package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store"
)

// callTimeout bounds one API call; a slower one counts as an error.
const callTimeout = time.Minute

// loadRun is what drive measured.
type loadRun struct {
	latencies []time.Duration // every completed call, ok or not
	ok        int
	errors    map[string]int    // by error code
	firstErr  map[string]string // the first message of each error code
	elapsed   time.Duration
}

// drive runs call from clients goroutines until duration has passed (each
// client starts no call after it) or, when requests > 0, until that many
// calls were made. i numbers the calls from 0. classify says whether an
// error is an expected outcome (counted ok); nil means none is.
func drive(ctx context.Context, clients int, duration time.Duration, requests int,
	call func(ctx context.Context, i int) error, classify func(error) bool) loadRun {
	var next atomic.Int64
	var wg sync.WaitGroup
	per := make([]loadRun, clients)
	start := time.Now()
	deadline := start.Add(duration)
	for w := range clients {
		wg.Go(func() {
			r := &per[w]
			r.errors, r.firstErr = map[string]int{}, map[string]string{}
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if requests > 0 && i >= requests || requests == 0 && !time.Now().Before(deadline) {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				t0 := time.Now()
				err := call(cctx, i)
				d := time.Since(t0)
				cancel()
				if ctx.Err() != nil || errors.Is(err, errEnough) {
					return // interrupted, or done: the call's result says nothing
				}
				r.latencies = append(r.latencies, d)
				if err == nil || classify != nil && classify(err) {
					r.ok++
				} else {
					code := errorCode(err)
					if r.errors[code]++; r.errors[code] == 1 {
						r.firstErr[code] = err.Error()
					}
				}
			}
		})
	}
	wg.Wait()
	out := loadRun{errors: map[string]int{}, firstErr: map[string]string{}, elapsed: time.Since(start)}
	for _, r := range per {
		for k, v := range r.firstErr {
			if _, seen := out.firstErr[k]; !seen {
				out.firstErr[k] = v
			}
		}
		out.latencies = append(out.latencies, r.latencies...)
		out.ok += r.ok
		for k, v := range r.errors {
			out.errors[k] += v
		}
	}
	return out
}

// errorCode is the API's error code, or CLIENT for a failure to call.
func errorCode(err error) string {
	var e *core.Error
	if errors.As(err, &e) {
		return string(e.Code)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "TIMEOUT"
	}
	return "CLIENT"
}

func isCode(err error, code core.Code) bool {
	var e *core.Error
	return errors.As(err, &e) && e.Code == code
}

// noCapacity is the refusal of a create that does not fit.
func noCapacity(err error) bool {
	var e *core.Error
	return errors.As(err, &e) && e.Code == core.CodeInvalidState && e.Details["reason"] == "noCapacity"
}

// errEnough, returned by a call, ends its client without counting the
// call: the scenario has done what it can (activate, out of GPUs to book).
var errEnough = errors.New("enough calls")

func runScenario(ctx context.Context, t *target, cfg config, name string, prof *profiler, progress func(string, ...any)) (result, error) {
	res := result{Scenario: name, Clients: cfg.clients}
	var run loadRun
	switch name {
	case "create":
		prof.begin(name)
		defer prof.end()
		run = drive(ctx, cfg.clients, cfg.duration, cfg.requests, func(ctx context.Context, _ int) error {
			r, err := reservations.Create.Call(ctx, t.user, t.createInput(1))
			if err == nil {
				t.remember(r.ID)
			}
			return err
		}, nil)

	case "get":
		if err := ensureReservations(ctx, t, 100, cfg.clients, progress); err != nil {
			return res, err
		}
		ids := t.reservations()
		prof.begin(name)
		defer prof.end()
		run = drive(ctx, cfg.clients, cfg.duration, cfg.requests, func(ctx context.Context, _ int) error {
			_, err := reservations.Get.Call(ctx, t.user, reservations.ReservationInput{TenantID: t.tenant, ReservationID: ids[rand.IntN(len(ids))]})
			return err
		}, nil)

	case "list":
		if err := ensureReservations(ctx, t, cfg.listItems, cfg.clients, progress); err != nil {
			return res, err
		}
		if t.analyze != nil {
			if err := t.analyze(ctx, "reservations", "allocations", "device_bookings", "authz_resources"); err != nil {
				return res, err
			}
		}
		in := map[string]any{"tenantId": t.tenant, "scope": "all", "limit": store.MaxPageLimit}
		var probe struct {
			Items []json.RawMessage `json:"items"`
		}
		err := t.user.Call(ctx, "reservations.list", in, &probe)
		if isCode(err, core.CodeUnsupported) {
			res.Skipped = "not served (UNSUPPORTED)"
			return res, nil
		}
		if err != nil {
			return res, fmt.Errorf("probe: %w", err)
		}
		res.Note = fmt.Sprintf("%d items per call (answers read whole, decoded only by the probe)", len(probe.Items))
		prof.begin(name)
		defer prof.end()
		// The measured calls read each answer whole but leave it undecoded:
		// decoding 500 items costs the client nearly as much CPU as the server
		// spends, and on a small machine the bench's client shares the
		// API's cores.
		run = drive(ctx, cfg.clients, cfg.duration, cfg.requests, func(ctx context.Context, _ int) error {
			return t.user.Call(ctx, "reservations.list", in, nil)
		}, nil)

	case "contention":
		if t.contention == nil {
			res.Skipped = "needs the embedded stack (nodes have no public create method)"
			return res, nil
		}
		return contention(ctx, t, cfg, prof, progress)

	case "gin":
		return ginScenario(ctx, t, cfg, prof, progress)

	case "activate":
		return activate(ctx, t, cfg, prof, progress)

	case "capacity":
		if t.capacity == nil {
			res.Skipped = "needs the embedded stack (its nodes are bulk-inserted by SQL)"
			return res, nil
		}
		return capacityScenario(ctx, t, cfg, prof, progress)

	case "agents":
		return agentsScenario(ctx, cfg, progress)
	}
	res.fill(run)
	return res, nil
}

// ensureReservations creates reservations until the run has made n.
func ensureReservations(ctx context.Context, t *target, n, clients int, progress func(string, ...any)) error {
	missing := n - len(t.reservations())
	if missing <= 0 {
		return nil
	}
	progress("creating %d reservations first", missing)
	var mu sync.Mutex
	var first error
	run := drive(ctx, clients, 0, missing, func(ctx context.Context, _ int) error {
		r, err := reservations.Create.Call(ctx, t.user, t.createInput(1))
		if err != nil {
			mu.Lock()
			first = cmpOr(first, err)
			mu.Unlock()
			return err
		}
		t.remember(r.ID)
		return nil
	}, nil)
	if err := ctx.Err(); err != nil {
		return err
	}
	if run.ok < missing {
		return fmt.Errorf("creating reservations: %d of %d failed, first: %w", missing-run.ok, missing, first)
	}
	return nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// contention fires cfg.contentionCalls creates of 1 GPU at once at a pool
// with exactly 8 free GPUs over the window: exactly 8 must be placed and the
// rest refused with noCapacity.
func contention(ctx context.Context, t *target, cfg config, prof *profiler, progress func(string, ...any)) (result, error) {
	res := result{Scenario: "contention", Clients: cfg.contentionCalls}
	poolID, start, err := t.contention(ctx)
	if err != nil {
		return res, fmt.Errorf("contention pool: %w", err)
	}
	progress("%d concurrent creates for the 8 GPUs of pool %s", cfg.contentionCalls, poolID)
	var placed, refused atomic.Int64
	gate := make(chan struct{})
	var ready sync.WaitGroup
	ready.Add(cfg.contentionCalls)
	call := func(ctx context.Context, i int) error {
		in := reservations.CreateInput{TenantID: t.tenant, PoolID: poolID, Start: &start, Duration: 3600,
			Devices:        placement.Request{Class: placement.ClassGPU, Count: 1},
			IdempotencyKey: fmt.Sprintf("bench-%s-contention-%d", t.runID, i)}
		ready.Done()
		select { // every call leaves at once
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := reservations.Create.Call(ctx, t.user, in)
		switch {
		case err == nil:
			placed.Add(1)
		case noCapacity(err):
			refused.Add(1)
		}
		return err
	}
	go func() { ready.Wait(); close(gate) }()
	prof.begin("contention")
	run := drive(ctx, cfg.contentionCalls, 0, cfg.contentionCalls, call, noCapacity)
	prof.end()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.fill(run)
	p, r := int(placed.Load()), int(refused.Load())
	res.Placed, res.Refused = &p, &r
	res.Note = fmt.Sprintf("placed %d, refused %d (noCapacity)", p, r)
	if p != 8 {
		res.Violation = fmt.Sprintf("%d placed for 8 free GPUs", p)
	}
	return res, nil
}

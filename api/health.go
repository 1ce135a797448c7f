package api

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"go.temporal.io/sdk/client"
	"golang.org/x/sync/singleflight"

	healthact "github.com/better-compute/better-compute/activities/health"
	"github.com/better-compute/better-compute/core"
)

// Check is the result of one health check.
type Check struct {
	OK        bool    `json:"ok"`
	LatencyMs float64 `json:"latencyMs"`
	Error     string  `json:"error,omitempty"`
	// CheckedAt is when the check ran (epoch ms): a Temporal round trip is
	// shared by the calls of a few seconds (temporalCheckTTL).
	CheckedAt int64 `json:"checkedAt"`
}

// Health is /healthz's answer.
type Health struct {
	Status string           `json:"status"` // "ok" or "degraded"
	Checks map[string]Check `json:"checks"`
}

// healthTimeout bounds each check, so a hung dependency answers 503, not a hang.
const healthTimeout = 10 * time.Second

// handleHealth checks the database with a query and Temporal with a real
// workflow round trip through the control-plane worker, at most one per
// temporalCheckTTL and process.
func (s *Server) handleHealth(c *gin.Context) {
	h := s.CheckHealth(c.Request.Context())
	status := http.StatusOK
	if h.Status != "ok" {
		status = http.StatusServiceUnavailable
	}
	c.JSON(status, h)
}

// CheckHealth runs the database and Temporal checks side by side.
func (s *Server) CheckHealth(ctx context.Context) Health {
	type result struct {
		name string
		Check
	}
	results := make(chan result, 2)
	run := func(name string, fn func(context.Context) error) {
		ctx, cancel := context.WithTimeout(ctx, healthTimeout)
		defer cancel()
		results <- result{name: name, Check: timedCheck(ctx, fn)}
	}
	go run("database", s.checkDatabase)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, healthTimeout)
		defer cancel()
		results <- result{name: "temporal", Check: s.temporalRT.check(ctx, s.checkTemporal)}
	}()
	h := Health{Status: "ok", Checks: map[string]Check{}}
	for range 2 {
		r := <-results
		h.Checks[r.name] = r.Check
		if !r.OK {
			h.Status = "degraded"
		}
	}
	return h
}

// timedCheck runs fn and says how it went and how long it took.
func timedCheck(ctx context.Context, fn func(context.Context) error) Check {
	start := time.Now()
	err := fn(ctx)
	c := Check{OK: err == nil, LatencyMs: float64(time.Since(start).Microseconds()) / 1000, CheckedAt: start.UnixMilli()}
	if err != nil {
		c.Error = err.Error()
	}
	return c
}

// temporalCheckTTL is how long one Temporal round trip answers /healthz:
// a load balancer probing every replica each second would otherwise start
// a workflow per probe.
const temporalCheckTTL = 5 * time.Second

// roundTrips shares one Temporal round trip between the health checks of
// temporalCheckTTL; checks arriving while one runs wait for it. The zero
// value is ready.
type roundTrips struct {
	flight singleflight.Group
	mu     sync.Mutex
	last   Check
	valid  bool
}

func (r *roundTrips) check(ctx context.Context, fn func(context.Context) error) Check {
	r.mu.Lock()
	if r.valid && time.Since(time.UnixMilli(r.last.CheckedAt)) < temporalCheckTTL {
		c := r.last
		r.mu.Unlock()
		return c
	}
	r.mu.Unlock()
	ch := r.flight.DoChan("temporal", func() (any, error) {
		// The caller that starts the round trip may leave; the others
		// still need its answer, so it runs on its own deadline.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), healthTimeout)
		defer cancel()
		c := timedCheck(ctx, fn)
		r.mu.Lock()
		r.last, r.valid = c, true
		r.mu.Unlock()
		return c, nil
	})
	select {
	case res := <-ch:
		return res.Val.(Check)
	case <-ctx.Done():
		return Check{Error: fmt.Sprintf("temporal check: %v", ctx.Err()), CheckedAt: time.Now().UnixMilli()}
	}
}

func (s *Server) checkDatabase(ctx context.Context) error {
	if s.deps.Store == nil {
		return fmt.Errorf("no database configured")
	}
	return s.deps.Store.Ping(ctx)
}

// checkTemporal starts a HealthCheck workflow and waits for its echo.
func (s *Server) checkTemporal(ctx context.Context) error {
	if s.deps.Temporal == nil {
		return fmt.Errorf("no Temporal client configured")
	}
	nonce := core.NewID("hc")
	run, err := s.deps.Temporal.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       "healthz/" + nonce,
		TaskQueue:                s.deps.TaskQueue,
		WorkflowExecutionTimeout: healthTimeout,
	}, healthact.WorkflowName, nonce)
	if err != nil {
		return fmt.Errorf("start health workflow: %w", err)
	}
	var echoed string
	if err := run.Get(ctx, &echoed); err != nil {
		return fmt.Errorf("health workflow: %w", err)
	}
	if echoed != nonce {
		return fmt.Errorf("health workflow echoed %q, want %q", echoed, nonce)
	}
	return nil
}

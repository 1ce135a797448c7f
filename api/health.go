package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"go.temporal.io/sdk/client"

	healthact "github.com/better-compute/better-compute/activities/health"
	"github.com/better-compute/better-compute/core"
)

// Check is the result of one health check.
type Check struct {
	OK        bool    `json:"ok"`
	LatencyMs float64 `json:"latencyMs"`
	Error     string  `json:"error,omitempty"`
}

// Health is /healthz's answer.
type Health struct {
	Status string           `json:"status"` // "ok" or "degraded"
	Checks map[string]Check `json:"checks"`
}

// healthTimeout bounds each check, so a hung dependency answers 503, not a hang.
const healthTimeout = 10 * time.Second

// handleHealth checks the database with a query and Temporal with a real
// workflow round trip through the control-plane worker.
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
		start := time.Now()
		err := fn(ctx)
		r := result{name: name, Check: Check{OK: err == nil, LatencyMs: float64(time.Since(start).Microseconds()) / 1000}}
		if err != nil {
			r.Error = err.Error()
		}
		results <- r
	}
	go run("database", s.checkDatabase)
	go run("temporal", s.checkTemporal)
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

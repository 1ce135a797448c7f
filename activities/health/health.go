// Package health holds the activity of the health-check workflow
// (workflows/health) and the names both sides use.
package health

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/store"
)

// Names as registered; they are persisted in workflow histories and the API
// starts the workflow by its name, so they never change.
const (
	WorkflowName = "HealthCheck"
	ActivityEcho = "HealthEcho"
)

// Health is the activity side of the health-check workflow.
type Health struct {
	Store *store.Store
}

// HealthEcho returns nonce after checking that the worker reaches the
// database, so a green round trip means the worker is really able to work.
func (h *Health) HealthEcho(ctx context.Context, nonce string) (string, error) {
	if h.Store != nil {
		if err := h.Store.Ping(ctx); err != nil {
			return "", fmt.Errorf("worker database: %w", err)
		}
	}
	return nonce, nil
}

// Package activities holds the activity implementations, grouped by what
// they touch. Each group is a struct holding its dependencies.
package activities

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/store"
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

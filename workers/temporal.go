// Package workers wires Temporal: how processes reach the Temporal frontend,
// and which workflows and activities run on which task queue.
package workers

import (
	"context"
	"log/slog"

	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/workers/temporalclient"
)

// ControlPlaneQueue is the task queue of `better-compute worker`.
const ControlPlaneQueue = "control-plane"

// TemporalConfig says how to reach the Temporal frontend.
type TemporalConfig = temporalclient.Config

// Dial connects to Temporal and checks that the frontend answers. Its
// client carries the API caller's identity with updates, and its workers
// read it (visibility.CallerPropagator).
func Dial(ctx context.Context, cfg TemporalConfig, logger *slog.Logger) (client.Client, error) {
	return temporalclient.Dial(ctx, cfg, logger, visibility.CallerPropagator{})
}

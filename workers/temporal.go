// Package workers wires Temporal: how processes reach the Temporal frontend,
// and which workflows and activities run on which task queue.
package workers

import (
	"context"
	"fmt"
	"log/slog"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
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

// MissingSearchAttributes are the control plane's search attributes
// (visibility.Keywords) the namespace does not define as Keyword: until
// an operator creates them, the control plane's workflow starts are
// refused (docs/temporal.md).
func MissingSearchAttributes(ctx context.Context, c client.Client, namespace string) ([]string, error) {
	resp, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return nil, fmt.Errorf("list the search attributes of namespace %s: %w", namespace, err)
	}
	var missing []string
	for _, name := range visibility.Keywords() {
		if resp.GetCustomAttributes()[name] != enumspb.INDEXED_VALUE_TYPE_KEYWORD {
			missing = append(missing, name)
		}
	}
	return missing, nil
}

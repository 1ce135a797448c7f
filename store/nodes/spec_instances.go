package nodes

import (
	"context"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/store"
)

// specInstances reads the instances section of the node's NodeSpec: every
// instance placed on the node that is not deleted.
func specInstances(ctx context.Context, db store.DBTX, nodeID string) ([]nodespec.Instance, error) {
	return nil, nil
}

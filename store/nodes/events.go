package nodes

import (
	"context"
	"encoding/json"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// AddEvent appends one event to a node's history (nodes.events).
func AddEvent(ctx context.Context, tx store.Tx, nodeID, typ, message string, details map[string]any) error {
	if details == nil {
		details = map[string]any{}
	}
	raw, err := json.Marshal(details)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO node_events (id, node_id, type, message, details) VALUES ($1, $2, $3, $4, $5)`,
		core.NewID("nev"), nodeID, typ, message, string(raw))
	return err
}

package nodes

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// The inventory's types, as the methods answer them.
type (
	InventorySnapshot     = domain.InventorySnapshot
	InventoryHistoryEntry = domain.InventoryHistoryEntry
	InventoryHistory      = domain.InventoryHistory
	InventoryDiffOutput   = domain.InventoryDiffOutput
)

// InventoryInput is inventory.get's input; without seq, the latest snapshot.
type InventoryInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string `json:"nodeId" jsonschema:"required" id:"node"`
	Seq      *int64 `json:"seq,omitempty" jsonschema:"minimum=1"`
}

// InventoryHistoryInput is inventory.history's input: a page of the
// node's snapshots, newest first.
type InventoryHistoryInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string `json:"nodeId" jsonschema:"required" id:"node"`
	rpc.ListInput
}

// InventoryDiffInput is inventory.diff's input: fromSeq and toSeq, by
// default the last two (toSeq alone: it and the one before it).
type InventoryDiffInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string `json:"nodeId" jsonschema:"required" id:"node"`
	FromSeq  *int64 `json:"fromSeq,omitempty" jsonschema:"minimum=1"`
	ToSeq    *int64 `json:"toSeq,omitempty" jsonschema:"minimum=1"`
}

// The inventory.* methods.
const (
	GetInventory        rpc.Ref[InventoryInput, InventorySnapshot]       = "inventory.get"
	GetInventoryHistory rpc.Ref[InventoryHistoryInput, InventoryHistory] = "inventory.history"
	DiffInventory       rpc.Ref[InventoryDiffInput, InventoryDiffOutput] = "inventory.diff"
)

// seq is an optional snapshot number, 0 when absent.
func seq(v *int64) int64 {
	if v == nil {
		return 0
	}
	return *v
}

func (m methods) inventory() []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[InventoryInput, InventorySnapshot]{Name: GetInventory, Action: "compute:nodes:read",
			DecidedOn: "compute-node", Phase: "v0.1", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in InventoryInput) (InventorySnapshot, error) {
				return domain.Snapshot(ctx, tx, c.TenantID, in.NodeID, seq(in.Seq))
			}},
		&rpc.Method[InventoryHistoryInput, InventoryHistory]{Name: GetInventoryHistory, Action: "compute:nodes:read",
			DecidedOn: "compute-node", Phase: "v0.2", Kind: core.KindRead,
			// Newest first: by snapshot seq, descending.
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in InventoryHistoryInput) (InventoryHistory, error) {
				q, err := in.Page()
				if err != nil {
					return InventoryHistory{}, err
				}
				h, err := domain.History(ctx, tx, c.TenantID, in.NodeID, q)
				h.Items, h.NextCursor = rpc.Paged(h.Items, q, func(e domain.InventoryHistoryEntry) store.Key { return store.Key{Seq: e.Seq} })
				return h, err
			}},
		&rpc.Method[InventoryDiffInput, InventoryDiffOutput]{Name: DiffInventory, Action: "compute:nodes:read",
			DecidedOn: "compute-node", Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in InventoryDiffInput) (InventoryDiffOutput, error) {
				return domain.Diff(ctx, tx, c.TenantID, in.NodeID, seq(in.FromSeq), seq(in.ToSeq))
			}},
	}
}

package api

import (
	"context"

	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// The inventory's types, as the API returns them.
type (
	InventorySnapshot     = domain.InventorySnapshot
	InventoryHistoryEntry = domain.InventoryHistoryEntry
	InventoryHistory      = domain.InventoryHistory
	InventoryDiffOutput   = domain.InventoryDiffOutput
	IngestResult          = domain.IngestResult
)

// IngestInventory takes a node's NodeInventory v1 document, in the
// caller's transaction (domain.Ingest).
func (s *Server) IngestInventory(ctx context.Context, tx store.Tx, nodeID string, doc []byte) (IngestResult, error) {
	return domain.Ingest(ctx, tx, s.nodeTypes(), nodeID, doc)
}

func (s *Server) inventoryGet(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		NodeID string `json:"nodeId"`
		Seq    *int64 `json:"seq"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	seq, err := seqOf("seq", in.Seq)
	if err != nil {
		return nil, err
	}
	return domain.Snapshot(ctx, tx, c.TenantID, in.NodeID, seq)
}

// seqOf reads an optional snapshot number (0 when absent).
func seqOf(field string, v *int64) (int64, error) {
	if v == nil {
		return 0, nil
	}
	if *v < 1 {
		return 0, badField(field, "range", "%s must be at least 1", field)
	}
	return *v, nil
}

func (s *Server) inventoryHistory(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		NodeID    string `json:"nodeId"`
		Limit     *int   `json:"limit"`
		BeforeSeq *int64 `json:"beforeSeq"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	limit, err := limitOf(in.Limit, defaultEventLimit, maxEventLimit)
	if err != nil {
		return nil, err
	}
	before, err := seqOf("beforeSeq", in.BeforeSeq)
	if err != nil {
		return nil, err
	}
	return domain.History(ctx, tx, c.TenantID, in.NodeID, before, limit)
}

// inventoryDiff diffs two snapshots: fromSeq and toSeq, by default the
// last two (toSeq alone: it and the one before it).
func (s *Server) inventoryDiff(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		NodeID  string `json:"nodeId"`
		FromSeq *int64 `json:"fromSeq"`
		ToSeq   *int64 `json:"toSeq"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	from, err := seqOf("fromSeq", in.FromSeq)
	if err != nil {
		return nil, err
	}
	to, err := seqOf("toSeq", in.ToSeq)
	if err != nil {
		return nil, err
	}
	return domain.Diff(ctx, tx, c.TenantID, in.NodeID, from, to)
}

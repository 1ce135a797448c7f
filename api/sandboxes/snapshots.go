package sandboxes

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/sandboxes"
)

// Snapshot is a sandbox snapshot as the methods answer it.
type Snapshot = domain.Snapshot

// SnapshotList is sandboxSnapshots.list's answer.
type SnapshotList struct {
	Items      []Snapshot `json:"items"`
	NextCursor string     `json:"nextCursor,omitempty"`
}

// SnapshotInput is sandboxes.snapshot's input. With an idempotencyKey, a
// retry answers the snapshot that key took.
type SnapshotInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	SandboxID string `json:"sandboxId" jsonschema:"required" id:"sbx"`
	// IncludeMemory takes the processes too (gvisor only): a sandbox
	// restored from it continues where they were.
	IncludeMemory  bool   `json:"includeMemory,omitempty"`
	IdempotencyKey string `json:"idempotencyKey,omitempty" id:"tenant"`
}

// SnapshotRef names one snapshot.
type SnapshotRef struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	SnapshotID string `json:"snapshotId" jsonschema:"required" id:"snap"`
}

// SnapshotListInput is sandboxSnapshots.list's input: the tenant's
// snapshots, or one sandbox's.
type SnapshotListInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	SandboxID string `json:"sandboxId,omitempty" id:"sbx"`
	rpc.ListInput
}

// The snapshot methods.
const (
	TakeSnapshot   rpc.Ref[SnapshotInput, Snapshot]         = "sandboxes.snapshot"
	GetSnapshot    rpc.Ref[SnapshotRef, Snapshot]           = "sandboxSnapshots.get"
	ListSnapshots  rpc.Ref[SnapshotListInput, SnapshotList] = "sandboxSnapshots.list"
	DeleteSnapshot rpc.Ref[SnapshotRef, Snapshot]           = "sandboxSnapshots.delete"
)

func (m methods) snapshotType() string {
	return m.d.Catalog.FullName(coresandboxes.SnapshotResourceType)
}

// snapshots describes sandboxes.snapshot and sandboxSnapshots.*.
func (m methods) snapshots() []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[SnapshotInput, Snapshot]{Name: TakeSnapshot, Action: "compute:sandboxes:update", DecidedOn: "compute-sandbox",
			Phase: "v0.5", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in SnapshotInput) (Snapshot, error) {
				id := core.NewID("snap")
				if in.IdempotencyKey != "" {
					id = core.DerivedID("snap", c.TenantID, c.Caller.IdentityID, in.IdempotencyKey)
				}
				return domain.TakeSnapshot(ctx, tx, m.snapshotType(), c.TenantID, in.SandboxID, id, in.IncludeMemory)
			}},
		&rpc.Method[SnapshotRef, Snapshot]{Name: GetSnapshot, Action: "compute:sandboxes:read", DecidedOn: "compute-sandbox-snapshot",
			Phase: "v0.5", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in SnapshotRef) (Snapshot, error) {
				return domain.GetSnapshot(ctx, tx, c.TenantID, in.SnapshotID)
			}},
		&rpc.Method[SnapshotListInput, SnapshotList]{Name: ListSnapshots, Action: "compute:sandboxes:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.5", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in SnapshotListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				items, err := domain.ListSnapshots(ctx, tx, m.snapshotType(), c.TenantID, domain.SnapshotFilter{SandboxID: in.SandboxID}, q)
				return rpc.PageOf(items, q, func(s Snapshot) store.Key { return store.Key{At: s.CreatedAt, ID: s.ID} },
					func(s Snapshot) iam.Resource { return m.d.Resource(coresandboxes.SnapshotResourceType, s.ID) },
					func(kept []Snapshot, next string) any { return SnapshotList{Items: kept, NextCursor: next} }), err
			}},
		&rpc.Method[SnapshotRef, Snapshot]{Name: DeleteSnapshot, Action: "compute:sandboxes:delete", DecidedOn: "compute-sandbox-snapshot",
			Phase: "v0.5", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in SnapshotRef) (Snapshot, error) {
				return domain.DeleteSnapshot(ctx, tx, m.snapshotType(), c.TenantID, in.SnapshotID)
			}},
	}
}

// Package capacity describes the capacity.* methods and pools.capacity: a
// domain may describe a method of another group's name, and a pool's
// capacity is the capacity domain's, as its action (compute:capacity:read)
// says.
package capacity

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/capacity"
)

// The answers.
type (
	// PoolCapacity is one pool's capacity in a tenant's view.
	PoolCapacity = domain.PoolCapacity
	// Resource is one resource's counts.
	Resource = domain.Resource
	// CapacitySummary is capacity.summary's answer.
	CapacitySummary = domain.Summary
	// CapacityTimeline is capacity.timeline's answer.
	CapacityTimeline = domain.Timeline
	// TimelineBucket is one bucket of a timeline.
	TimelineBucket = domain.TimelineBucket
	// CapacityPreview is capacity.preview's answer.
	CapacityPreview = domain.Preview
	// PreviewQuota is how a previewed request stands against the quota.
	PreviewQuota = domain.PreviewQuota
)

// PoolInput names one pool.
type PoolInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
}

// TimelineInput is capacity.timeline's input: [from, to) in epoch
// milliseconds, to after from, in buckets of equal width (absent:
// domain.DefaultTimelineBuckets; the schema refuses 0).
type TimelineInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
	From     int64  `json:"from" jsonschema:"required,minimum=0" unit:"epoch-ms"`
	To       int64  `json:"to" jsonschema:"required" unit:"epoch-ms"`
	Buckets  int    `json:"buckets,omitempty" jsonschema:"minimum=1,maximum=500"`
}

// PreviewInput is capacity.preview's input: the devices (core/placement
// checks what their schema cannot say), start in epoch milliseconds
// (default now, at most 9999-12-31) and duration in seconds, at most
// domain.MaxPreviewDurationSeconds.
type PreviewInput struct {
	TenantID string            `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string            `json:"poolId" jsonschema:"required" id:"pool"`
	Devices  placement.Request `json:"devices" jsonschema:"required" maxBytes:"4096"`
	Start    *int64            `json:"start,omitempty" jsonschema:"minimum=0,maximum=253402300799999" unit:"epoch-ms"`
	Duration int64             `json:"duration" jsonschema:"required,minimum=1,maximum=31622400" unit:"s"`
}

// The methods.
const (
	Pool     rpc.Ref[PoolInput, PoolCapacity]          = "pools.capacity"
	Summary  rpc.Ref[rpc.TenantInput, CapacitySummary] = "capacity.summary"
	ByPool   rpc.Ref[PoolInput, PoolCapacity]          = "capacity.byPool"
	Timeline rpc.Ref[TimelineInput, CapacityTimeline]  = "capacity.timeline"
	Preview  rpc.Ref[PreviewInput, CapacityPreview]    = "capacity.preview"
)

// Methods describes pools.capacity and the capacity.* methods.
func Methods(rpc.Deps) []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[PoolInput, PoolCapacity]{Name: Pool, Action: "compute:capacity:read", DecidedOn: "compute-pool",
			Phase: "v0.1", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in PoolInput) (PoolCapacity, error) {
				return domain.OnePool(ctx, tx, c.TenantID, in.PoolID, false)
			}},
		&rpc.Method[rpc.TenantInput, CapacitySummary]{Name: Summary, Action: "compute:capacity:read", DecidedOn: "compute-tenant",
			Phase: "v0.1", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ rpc.TenantInput) (CapacitySummary, error) {
				return domain.Summarize(ctx, tx, c.TenantID)
			}},
		&rpc.Method[PoolInput, PoolCapacity]{Name: ByPool, Action: "compute:capacity:read", DecidedOn: "compute-pool",
			Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in PoolInput) (PoolCapacity, error) {
				return domain.OnePool(ctx, tx, c.TenantID, in.PoolID, true)
			}},
		&rpc.Method[TimelineInput, CapacityTimeline]{Name: Timeline, Action: "compute:capacity:read", DecidedOn: "compute-pool",
			Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in TimelineInput) (CapacityTimeline, error) {
				n := in.Buckets
				if n == 0 {
					n = domain.DefaultTimelineBuckets
				}
				return domain.TimelineOf(ctx, tx, c.TenantID, in.PoolID, in.From, in.To, n)
			}},
		&rpc.Method[PreviewInput, CapacityPreview]{Name: Preview, Action: "compute:capacity:read", DecidedOn: "compute-pool",
			Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in PreviewInput) (CapacityPreview, error) {
				return domain.PreviewOf(ctx, tx, c.TenantID, in.PoolID, in.Devices, in.Start, in.Duration)
			}},
	}
}

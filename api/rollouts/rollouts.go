// Package rollouts describes the releases.* and rollouts.* methods
// (docs/rollouts.md): registering a release over fleet images, and
// rolling it out to a pool's nodes wave by wave. All are decided on
// compute-fleet, in the root tenant.
package rollouts

import (
	"context"
	"time"

	rolloutsact "github.com/better-compute/better-compute/activities/rollouts"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	corerollouts "github.com/better-compute/better-compute/core/rollouts"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/rollouts"
)

// The answers.
type (
	Release  = domain.Release
	Artifact = domain.Artifact
	Rollout  = domain.Rollout
)

// ReleaseList is releases.list's answer.
type ReleaseList struct {
	Items      []Release `json:"items"`
	NextCursor string    `json:"nextCursor,omitempty"`
}

// RolloutList is rollouts.list's answer (without each rollout's nodes).
type RolloutList struct {
	Items      []Rollout `json:"items"`
	NextCursor string    `json:"nextCursor,omitempty"`
}

// ArtifactInput is one artifact of a release.
type ArtifactInput struct {
	Name    string `json:"name" jsonschema:"required,maxLength=63,pattern=^[a-z0-9]([a-z0-9._-]{0\\,61}[a-z0-9])?$" jsonschema_description:"The artifact's name: bcd for a bcd release's build."`
	ImageID string `json:"imageId" jsonschema:"required" id:"img" jsonschema_description:"A fleet image (images.register with scope fleet), available and verified, in format binary."`
}

// RegisterInput is releases.register's input.
type RegisterInput struct {
	TenantID     string          `json:"tenantId" jsonschema:"required" id:"tenant"`
	Name         string          `json:"name" jsonschema:"required,maxLength=64,pattern=^[a-z0-9]([a-z0-9._-]{0\\,62}[a-z0-9])?$"`
	Version      string          `json:"version" jsonschema:"required,maxLength=64,pattern=^[A-Za-z0-9]([A-Za-z0-9._+-]{0\\,62}[A-Za-z0-9])?$"`
	Kind         string          `json:"kind" jsonschema:"required,enum=bcd,enum=profile,enum=driver,enum=firmware" jsonschema_description:"bcd (the node agent) is served; the other kinds answer UNSUPPORTED."`
	Artifacts    []ArtifactInput `json:"artifacts" jsonschema:"required,minItems=1,maxItems=8"`
	AgentVersion string          `json:"agentVersion,omitempty" jsonschema:"maxLength=128" jsonschema_description:"For bcd: the agentVersion the build says in its hello (bcd/0.2.0)."`
}

// ReleaseListInput is releases.list's input: oldest first.
type ReleaseListInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	Name     string `json:"name,omitempty" jsonschema:"maxLength=64,pattern=^[a-z0-9]([a-z0-9._-]{0\\,62}[a-z0-9])?$"`
	rpc.ListInput
}

// Selection is which nodes a rollout updates: the pool's node-agent nodes
// carrying every label.
type Selection struct {
	PoolID string            `json:"poolId" jsonschema:"required" id:"pool"`
	Labels map[string]string `json:"labels,omitempty" maxBytes:"4096"`
}

// AcceptanceInput is the check run on each updated node.
type AcceptanceInput struct {
	Argv           []string `json:"argv,omitempty" jsonschema:"maxItems=64" jsonschema_description:"argv run directly (no shell); required."`
	TimeoutSeconds int64    `json:"timeoutSeconds,omitempty" jsonschema:"minimum=1,maximum=3600"`
}

// CreateInput is rollouts.create's input.
type CreateInput struct {
	TenantID  string              `json:"tenantId" jsonschema:"required" id:"tenant"`
	ReleaseID string              `json:"releaseId" jsonschema:"required" id:"rel"`
	Selection Selection           `json:"selection" jsonschema:"required"`
	Canary    int                 `json:"canary,omitempty" jsonschema:"minimum=0,maximum=100000" jsonschema_description:"The first wave's node count (0: no canary wave)."`
	Waves     []corerollouts.Wave `json:"waves,omitempty" jsonschema:"maxItems=32" jsonschema_description:"The waves after the canary, each a percent of the selection or a count; what is left joins the last."`
	// FailureThreshold is the share of a wave's nodes that may fail before
	// the rollout pauses itself (pausedOnFailure).
	FailureThreshold   float64          `json:"failureThreshold,omitempty" jsonschema:"minimum=0,maximum=1"`
	AcceptanceCommand  *AcceptanceInput `json:"acceptanceCommand,omitempty"`
	NodeTimeoutSeconds int              `json:"nodeTimeoutSeconds,omitempty" jsonschema:"minimum=10,maximum=86400" jsonschema_description:"How long a node may take in each step (drain, update, check) before it fails (default 900)."`
}

// RolloutInput names one rollout.
type RolloutInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	RolloutID string `json:"rolloutId" jsonschema:"required" id:"rollout"`
}

// AbortInput is rollouts.abort's input.
type AbortInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	RolloutID string `json:"rolloutId" jsonschema:"required" id:"rollout"`
	Rollback  bool   `json:"rollback,omitempty" jsonschema_description:"Put the nodes this rollout updated back on the previous release of the same name."`
}

// RolloutListInput is rollouts.list's input: oldest first.
type RolloutListInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	State    string `json:"state,omitempty" jsonschema:"enum=running,enum=paused,enum=pausedOnFailure,enum=aborting,enum=aborted,enum=succeeded"`
	rpc.ListInput
}

// The methods.
const (
	RegisterRelease rpc.Ref[RegisterInput, Release]        = "releases.register"
	ListReleases    rpc.Ref[ReleaseListInput, ReleaseList] = "releases.list"
	Create          rpc.Ref[CreateInput, Rollout]          = "rollouts.create"
	List            rpc.Ref[RolloutListInput, RolloutList] = "rollouts.list"
	Get             rpc.Ref[RolloutInput, Rollout]         = "rollouts.get"
	Pause           rpc.Ref[RolloutInput, Rollout]         = "rollouts.pause"
	Resume          rpc.Ref[RolloutInput, Rollout]         = "rollouts.resume"
	Abort           rpc.Ref[AbortInput, Rollout]           = "rollouts.abort"
)

const (
	action    = "compute:fleet:admin"
	decidedOn = "compute-fleet"
	phase     = "v0.4"
)

type methods struct{ d rpc.Deps }

// root refuses a call outside the root tenant: releases and rollouts are
// the platform's.
func (m methods) root(c *rpc.Call) error {
	if c.TenantID != m.d.RootTenant {
		return core.Errorf(core.CodeInvalidInput, "releases and rollouts belong to the platform: call in the root tenant").
			WithDetails(map[string]any{"field": "tenantId", "reason": "tenant"})
	}
	return nil
}

// Methods describes the releases.* and rollouts.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	m := methods{d}
	state := func(f func(context.Context, store.Tx, string) (Rollout, error)) func(context.Context, *rpc.Call, store.Tx, RolloutInput) (Rollout, error) {
		return func(ctx context.Context, c *rpc.Call, tx store.Tx, in RolloutInput) (Rollout, error) {
			if err := m.root(c); err != nil {
				return Rollout{}, err
			}
			return f(ctx, tx, in.RolloutID)
		}
	}
	return []rpc.Descriptor{
		&rpc.Method[RegisterInput, Release]{Name: RegisterRelease, Action: action, DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in RegisterInput) (Release, error) {
				if err := m.root(c); err != nil {
					return Release{}, err
				}
				arts := make([]Artifact, len(in.Artifacts))
				for i, a := range in.Artifacts {
					arts[i] = Artifact{Name: a.Name, ImageID: a.ImageID}
				}
				return domain.RegisterRelease(ctx, tx, domain.RegisterRequest{TenantID: c.TenantID, Name: in.Name,
					Version: in.Version, Kind: in.Kind, Artifacts: arts, AgentVersion: in.AgentVersion, By: c.Caller.IdentityID})
			}},
		&rpc.Method[ReleaseListInput, ReleaseList]{Name: ListReleases, Action: action, DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ReleaseListInput) (ReleaseList, error) {
				if err := m.root(c); err != nil {
					return ReleaseList{}, err
				}
				q, err := in.Page()
				if err != nil {
					return ReleaseList{}, err
				}
				rows, err := domain.ListReleases(ctx, tx, in.Name, q)
				items, next := rpc.Paged(rows, q, func(r Release) store.Key { return store.Key{At: r.CreatedAt, ID: r.ID} })
				return ReleaseList{Items: items, NextCursor: next}, err
			}},
		&rpc.Method[CreateInput, Rollout]{Name: Create, Action: action, DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateInput) (Rollout, error) {
				if err := m.root(c); err != nil {
					return Rollout{}, err
				}
				var acc *domain.Acceptance
				if a := in.AcceptanceCommand; a != nil {
					acc = &domain.Acceptance{Argv: a.Argv, TimeoutSeconds: a.TimeoutSeconds}
				}
				return domain.Create(ctx, tx, domain.CreateRequest{TenantID: c.TenantID, ReleaseID: in.ReleaseID,
					PoolID: in.Selection.PoolID, Labels: in.Selection.Labels, Canary: in.Canary, Waves: in.Waves,
					FailureThreshold: in.FailureThreshold, Acceptance: acc,
					NodeTimeout: time.Duration(in.NodeTimeoutSeconds) * time.Second, By: c.Caller.IdentityID})
			},
			After: func(ctx context.Context, _ *rpc.Call, _ CreateInput, o Rollout) (Rollout, error) {
				return o, m.start(ctx, o.ID)
			}},
		&rpc.Method[RolloutListInput, RolloutList]{Name: List, Action: action, DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in RolloutListInput) (RolloutList, error) {
				if err := m.root(c); err != nil {
					return RolloutList{}, err
				}
				q, err := in.Page()
				if err != nil {
					return RolloutList{}, err
				}
				rows, err := domain.List(ctx, tx, in.State, q)
				items, next := rpc.Paged(rows, q, func(o Rollout) store.Key { return store.Key{At: o.CreatedAt, ID: o.ID} })
				return RolloutList{Items: items, NextCursor: next}, err
			}},
		&rpc.Method[RolloutInput, Rollout]{Name: Get, Action: action, DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindRead,
			Run: state(func(ctx context.Context, tx store.Tx, id string) (Rollout, error) {
				return domain.Get(ctx, tx, id, true)
			})},
		&rpc.Method[RolloutInput, Rollout]{Name: Pause, Action: action, DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindMutation, Run: state(domain.Pause), After: m.signal},
		&rpc.Method[RolloutInput, Rollout]{Name: Resume, Action: action, DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindMutation, Run: state(domain.Resume),
			// A paused workflow keeps running and polling; a lost one is
			// started again here rather than at the reconciler's next run.
			After: func(ctx context.Context, _ *rpc.Call, _ RolloutInput, o Rollout) (Rollout, error) {
				return o, m.start(ctx, o.ID)
			}},
		&rpc.Method[AbortInput, Rollout]{Name: Abort, Action: action, DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in AbortInput) (Rollout, error) {
				if err := m.root(c); err != nil {
					return Rollout{}, err
				}
				return domain.Abort(ctx, tx, in.RolloutID, in.Rollback)
			},
			After: func(ctx context.Context, _ *rpc.Call, _ AbortInput, o Rollout) (Rollout, error) {
				return o, m.start(ctx, o.ID)
			}},
	}
}

// start starts (or keeps) the rollout's workflow and wakes it; the
// reconciler starts one this misses.
func (m methods) start(ctx context.Context, id string) error {
	if m.d.Temporal == nil {
		return nil
	}
	if err := rolloutsact.StartRollout(ctx, m.d.Temporal, m.d.TaskQueue, rolloutsact.RolloutParams{RolloutID: id}); err != nil {
		return err
	}
	return rolloutsact.Signal(ctx, m.d.Temporal, id)
}

func (m methods) signal(ctx context.Context, _ *rpc.Call, _ RolloutInput, o Rollout) (Rollout, error) {
	if m.d.Temporal == nil {
		return o, nil
	}
	return o, rolloutsact.Signal(ctx, m.d.Temporal, o.ID)
}

// Package batches describes the commandBatches.* methods
// (docs/command-batches.md): commands run over an exact list of a
// tenant's nodes, destructive ones only behind a quorum of approvers who
// sign the batch's digest with keys the platform registered for them. All
// are decided on compute-tenant; approve and cancel need
// compute:batches:approve on top of the signature, never instead of it.
package batches

import (
	"context"
	"encoding/json"
	"time"

	batchesact "github.com/better-compute/better-compute/activities/batches"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	corebatches "github.com/better-compute/better-compute/core/batches"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/batches"
)

// The answers.
type (
	Batch         = domain.Batch
	Node          = domain.Node
	CommandResult = domain.CommandResult
	Approval      = domain.Approval
	Scope         = domain.Scope
)

// List is commandBatches.list's answer (without each batch's node list).
type List struct {
	Items      []Batch `json:"items"`
	NextCursor string  `json:"nextCursor,omitempty"`
}

// CommandInput is one command of a batch.
type CommandInput struct {
	Kind string          `json:"kind" jsonschema:"required,enum=exec,enum=reboot,enum=inventory.refresh" jsonschema_description:"exec and reboot are destructive: the batch waits for its quorum."`
	Args json.RawMessage `json:"args,omitempty" jsonschema:"type=object" maxBytes:"65536" jsonschema_description:"The kind's args, as commands.run takes them (exec: argv, timeoutSeconds, env)."`
}

// Selection names the tenant's nodes: those of a pool, carrying every
// label, among the ids given (each part optional, one at least).
type Selection struct {
	PoolID  string            `json:"poolId,omitempty" id:"pool"`
	Labels  map[string]string `json:"labels,omitempty" maxBytes:"4096"`
	NodeIDs []string          `json:"nodeIds,omitempty" jsonschema:"maxItems=10000"`
}

func (s Selection) domain() domain.Selection {
	return domain.Selection{PoolID: s.PoolID, Labels: s.Labels, NodeIDs: s.NodeIDs}
}

// CreateInput is commandBatches.create's input.
type CreateInput struct {
	TenantID    string         `json:"tenantId" jsonschema:"required" id:"tenant"`
	Description string         `json:"description,omitempty" jsonschema:"maxLength=500"`
	Commands    []CommandInput `json:"commands" jsonschema:"required,minItems=1,maxItems=16" jsonschema_description:"Run in order on each node; a node stops at its first failure."`
	Selection   Selection      `json:"selection" jsonschema:"required"`
	Quorum      *int           `json:"quorum,omitempty" jsonschema:"minimum=0,maximum=10" jsonschema_description:"Distinct approvers besides the creator (default 2 for destructive commands, which need 1 at least; 0 otherwise)."`
	Concurrency int            `json:"concurrency,omitempty" jsonschema:"minimum=1,maximum=1000" jsonschema_description:"Nodes per wave, all in flight at once (default 10)."`
	MaxFailures int            `json:"maxFailures,omitempty" jsonschema:"minimum=0,maximum=10000" jsonschema_description:"Failed nodes tolerated before the batch starts no other (default 0)."`
	// NodeTimeoutSeconds bounds each command on a node.
	NodeTimeoutSeconds int `json:"nodeTimeoutSeconds,omitempty" jsonschema:"minimum=10,maximum=86400" jsonschema_description:"How long one command may take on a node before it is cancelled and the node failed (default 900)."`
	ApprovalTTLSeconds int `json:"approvalTtlSeconds,omitempty" jsonschema:"minimum=60,maximum=604800" jsonschema_description:"How long an approval counts (default 86400)."`
}

// BatchInput names one batch.
type BatchInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	BatchID  string `json:"batchId" jsonschema:"required" id:"batch"`
}

// ListInput is commandBatches.list's input: oldest first.
type ListInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	State    string `json:"state,omitempty" jsonschema:"enum=awaitingApproval,enum=running,enum=succeeded,enum=failed,enum=cancelled"`
	rpc.ListInput
}

// ScopeInput is commandBatches.scope's input: a selection (what a create
// would freeze), or a batch (what its selection resolves to now, against
// the list its digest covers).
type ScopeInput struct {
	TenantID  string     `json:"tenantId" jsonschema:"required" id:"tenant"`
	Selection *Selection `json:"selection,omitempty"`
	BatchID   string     `json:"batchId,omitempty" id:"batch"`
}

// ApproveInput is commandBatches.approve's input: the digest the approver
// read (commandBatches.get) and their signature of it,
// `ssh-keygen -Y sign -n better-compute-command-batch` over the digest text.
type ApproveInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	BatchID   string `json:"batchId" jsonschema:"required" id:"batch"`
	Digest    string `json:"digest" jsonschema:"required,pattern=^sha256:[0-9a-f]{64}$"`
	Signature string `json:"signature" jsonschema:"required,maxLength=16384" jsonschema_description:"An armored SSH signature (-----BEGIN SSH SIGNATURE-----)."`
}

// CancelInput is commandBatches.cancel's input: a signature of the
// batch's digest in the namespace better-compute-command-batch-cancel.
type CancelInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	BatchID   string `json:"batchId" jsonschema:"required" id:"batch"`
	Signature string `json:"signature" jsonschema:"required,maxLength=16384"`
}

// The methods.
const (
	Create     rpc.Ref[CreateInput, Batch]  = "commandBatches.create"
	Get        rpc.Ref[BatchInput, Batch]   = "commandBatches.get"
	ListMethod rpc.Ref[ListInput, List]     = "commandBatches.list"
	ScopeOf    rpc.Ref[ScopeInput, Scope]   = "commandBatches.scope"
	Approve    rpc.Ref[ApproveInput, Batch] = "commandBatches.approve"
	Cancel     rpc.Ref[CancelInput, Batch]  = "commandBatches.cancel"
)

const (
	decidedOn = "compute-tenant"
	phase     = "v1.0"
	// approveAction is the table's cell: the envelope decides
	// compute:batches:approve, and the handler checks the signature too.
	approveAction = "compute:batches:approve (on top of the approver signatures, never instead of them)"
)

type methods struct{ d rpc.Deps }

// Methods describes the commandBatches.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	m := methods{d}
	return []rpc.Descriptor{
		&rpc.Method[CreateInput, Batch]{Name: Create, Action: "compute:batches:create", DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateInput) (Batch, error) {
				cmds := make([]corebatches.Command, len(in.Commands))
				for i, cmd := range in.Commands {
					cmds[i] = corebatches.Command{Kind: cmd.Kind, Args: cmd.Args}
				}
				return domain.Create(ctx, tx, domain.CreateRequest{TenantID: c.TenantID, Description: in.Description,
					Commands: cmds, Selection: in.Selection.domain(), Quorum: in.Quorum, Concurrency: in.Concurrency,
					MaxFailures: in.MaxFailures, NodeTimeout: time.Duration(in.NodeTimeoutSeconds) * time.Second,
					ApprovalTTL: time.Duration(in.ApprovalTTLSeconds) * time.Second, Caller: c.AuditCaller()})
			},
			After: start[CreateInput](m)},
		&rpc.Method[BatchInput, Batch]{Name: Get, Action: "compute:batches:read", DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in BatchInput) (Batch, error) {
				return domain.Get(ctx, tx, c.TenantID, in.BatchID, true)
			}},
		&rpc.Method[ListInput, List]{Name: ListMethod, Action: "compute:batches:read", DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (List, error) {
				q, err := in.Page()
				if err != nil {
					return List{}, err
				}
				rows, err := domain.List(ctx, tx, c.TenantID, in.State, q)
				items, next := rpc.Paged(rows, q, func(b Batch) store.Key { return store.Key{At: b.CreatedAt, ID: b.ID} })
				return List{Items: items, NextCursor: next}, err
			}},
		&rpc.Method[ScopeInput, Scope]{Name: ScopeOf, Action: "compute:batches:read", DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ScopeInput) (Scope, error) {
				switch {
				case (in.Selection == nil) == (in.BatchID == ""):
					return Scope{}, core.Errorf(core.CodeInvalidInput, "name a selection or a batchId, not both").
						WithDetails(map[string]any{"field": "selection", "reason": "oneOf"})
				case in.BatchID != "":
					return domain.ScopeOfBatch(ctx, tx, c.TenantID, in.BatchID)
				}
				return domain.ScopeOf(ctx, tx, c.TenantID, in.Selection.domain())
			}},
		&rpc.Method[ApproveInput, Batch]{Name: Approve, Action: approveAction, DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ApproveInput) (Batch, error) {
				keys, err := m.keys(ctx, c)
				if err != nil {
					return Batch{}, err
				}
				return domain.Approve(ctx, tx, domain.ApproveRequest{TenantID: c.TenantID, BatchID: in.BatchID,
					Approver: c.Caller.IdentityID, Digest: in.Digest, Signature: in.Signature, Keys: keys})
			},
			After: start[ApproveInput](m)},
		&rpc.Method[CancelInput, Batch]{Name: Cancel, Action: approveAction, DecidedOn: decidedOn, Phase: phase,
			Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in CancelInput) (Batch, error) {
				keys, err := m.keys(ctx, c)
				if err != nil {
					return Batch{}, err
				}
				return domain.Cancel(ctx, tx, domain.CancelRequest{TenantID: c.TenantID, BatchID: in.BatchID,
					By: c.Caller.IdentityID, Signature: in.Signature, Keys: keys})
			},
			After: func(ctx context.Context, _ *rpc.Call, _ CancelInput, b Batch) (Batch, error) {
				if m.d.Temporal == nil {
					return b, nil
				}
				return b, batchesact.Signal(ctx, m.d.Temporal, b.ID)
			}},
	}
}

// keys are the caller's registered approver keys, in their own tenant.
func (m methods) keys(ctx context.Context, c *rpc.Call) ([]domain.Key, error) {
	if m.d.Approvers == nil {
		return nil, core.Errorf(core.CodeUnavailable, "no approver keys are served here (the IAM is remote)")
	}
	ks, err := m.d.Approvers.ApproverKeys(ctx, c.Caller.TenantID, c.Caller.IdentityID)
	if err != nil {
		return nil, err
	}
	out := make([]domain.Key, len(ks))
	for i, k := range ks {
		out[i] = domain.Key{Fingerprint: k.Fingerprint, PublicKey: k.PublicKey}
	}
	return out, nil
}

// start starts (or keeps) a running batch's workflow and wakes it, once
// the call that made it run has committed; the reconciler starts one this
// misses.
func start[I any](m methods) func(context.Context, *rpc.Call, I, Batch) (Batch, error) {
	return func(ctx context.Context, _ *rpc.Call, _ I, b Batch) (Batch, error) {
		if m.d.Temporal == nil || b.State != domain.Running {
			return b, nil
		}
		if err := batchesact.Start(ctx, m.d.Temporal, m.d.TaskQueue, batchesact.BatchParams{BatchID: b.ID}); err != nil {
			return b, err
		}
		return b, batchesact.Signal(ctx, m.d.Temporal, b.ID)
	}
}

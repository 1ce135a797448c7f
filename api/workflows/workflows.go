// Package workflows describes the workflows.* methods: a node's
// provisioning workflows (what metal.deploy made from a profile) as a
// user reads them, and pause, resume, retry and abort of the live one.
// Every method is decided on the node. Handlers change the row in the
// call's transaction; once it commits, the node's lifecycle workflow
// (<nodeId>/metal) is told (a signal, best effort: it also reads the row)
// or, for retry, started as metal.* operations start it.
package workflows

import (
	"context"
	"encoding/json"

	metalact "github.com/better-compute/better-compute/activities/metal"
	apimetal "github.com/better-compute/better-compute/api/metal"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/provisioning"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/metal"
	"github.com/better-compute/better-compute/store/workflows"
)

// Workflow is a workflow as the methods answer it.
type Workflow = workflows.Workflow

// Step is one step of a workflow as the methods answer it.
type Step = workflows.Step

// GetInput names a node's workflow; without workflowId, the node's latest.
type GetInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID     string `json:"nodeId" jsonschema:"required" id:"node"`
	WorkflowID string `json:"workflowId,omitempty" id:"wf"`
}

// WorkflowInput names one workflow of the node.
type WorkflowInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID     string `json:"nodeId" jsonschema:"required" id:"node"`
	WorkflowID string `json:"workflowId" jsonschema:"required" id:"wf"`
}

// ListInput is workflows.list's input: a page of the node's workflows,
// newest first.
type ListInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string `json:"nodeId" jsonschema:"required" id:"node"`
	rpc.ListInput
}

// List is workflows.list's answer.
type List struct {
	Items      []Workflow `json:"items"`
	NextCursor string     `json:"nextCursor,omitempty"`
}

// RetryArgs are the Retry operation's op_args: the workflow it resumes.
type RetryArgs struct {
	WorkflowID string `json:"workflowId"`
}

// The workflows.* methods.
const (
	Get    rpc.Ref[GetInput, Workflow]      = "workflows.get"
	ListOf rpc.Ref[ListInput, List]         = "workflows.list"
	Pause  rpc.Ref[WorkflowInput, Workflow] = "workflows.pause"
	Resume rpc.Ref[WorkflowInput, Workflow] = "workflows.resume"
	Retry  rpc.Ref[WorkflowInput, Workflow] = "workflows.retry"
	Abort  rpc.Ref[WorkflowInput, Workflow] = "workflows.abort"
)

type methods struct{ d rpc.Deps }

// Methods describes the workflows.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	m := methods{d: d}
	read, manage := "compute:workflows:read", "compute:workflows:manage"
	return []rpc.Descriptor{
		&rpc.Method[GetInput, Workflow]{Name: Get, Action: read, DecidedOn: "compute-node", Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in GetInput) (Workflow, error) {
				return workflows.Get(ctx, tx, c.TenantID, in.NodeID, in.WorkflowID)
			}},
		&rpc.Method[ListInput, List]{Name: ListOf, Action: read, DecidedOn: "compute-node", Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (List, error) {
				q, err := in.Page()
				if err != nil {
					return List{}, err
				}
				read, err := workflows.List(ctx, tx, c.TenantID, in.NodeID, q)
				items, next := rpc.Paged(read, q, Workflow.Key)
				if items == nil {
					items = []Workflow{}
				}
				return List{Items: items, NextCursor: next}, err
			}},
		&rpc.Method[WorkflowInput, Workflow]{Name: Pause, Action: manage, DecidedOn: "compute-node", Phase: "v0.2",
			Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in WorkflowInput) (Workflow, error) {
				return workflows.Pause(ctx, tx, c.TenantID, in.NodeID, in.WorkflowID)
			},
			After: m.signal},
		&rpc.Method[WorkflowInput, Workflow]{Name: Resume, Action: manage, DecidedOn: "compute-node", Phase: "v0.2",
			Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in WorkflowInput) (Workflow, error) {
				return workflows.Resume(ctx, tx, c.TenantID, in.NodeID, in.WorkflowID)
			},
			After: m.signal},
		&rpc.Method[WorkflowInput, Workflow]{Name: Retry, Action: manage, DecidedOn: "compute-node", Phase: "v0.2",
			Kind: core.KindMutation, Run: m.retry, After: m.afterRetry},
		&rpc.Method[WorkflowInput, Workflow]{Name: Abort, Action: manage, DecidedOn: "compute-node", Phase: "v0.2",
			Kind: core.KindMutation, Run: m.abort, After: m.afterAbort},
	}
}

// signal tells the node's lifecycle workflow that the row changed. Best
// effort: the run reads the row before each step, so a lost signal only
// delays a resume until its next look.
func (m methods) signal(ctx context.Context, _ *rpc.Call, _ WorkflowInput, w Workflow) (Workflow, error) {
	if m.d.Temporal == nil {
		return w, nil
	}
	if err := m.d.Temporal.SignalWorkflow(ctx, metalact.MetalWorkflowID(w.NodeID), "", metalact.SignalWorkflowChanged, w.ID); err != nil &&
		m.d.Logger != nil {
		m.d.Logger.Info("workflows: lifecycle not signalled", "node", w.NodeID, "workflow", w.ID, "error", err)
	}
	return w, nil
}

// retry checks that the node is failed by this failed workflow, begins
// the Retry operation (its op_args name the workflow) and moves the
// workflow to it, its failed step and the rest pending again.
func (m methods) retry(ctx context.Context, c *rpc.Call, tx store.Tx, in WorkflowInput) (Workflow, error) {
	if _, err := workflows.CheckRetry(ctx, tx, c.TenantID, in.NodeID, in.WorkflowID); err != nil {
		return Workflow{}, err
	}
	args, err := json.Marshal(RetryArgs{WorkflowID: in.WorkflowID})
	if err != nil {
		return Workflow{}, err
	}
	n, err := apimetal.Begin(ctx, m.d, c, tx, in.NodeID, coremetal.Retry, args)
	if err != nil {
		return Workflow{}, err
	}
	if err := workflows.Rerun(ctx, tx, in.WorkflowID, n.Lifecycle.OpSeq); err != nil {
		return Workflow{}, err
	}
	return workflows.Get(ctx, tx, c.TenantID, in.NodeID, in.WorkflowID)
}

// afterRetry starts the retry's lifecycle workflow (owed when it fails).
func (m methods) afterRetry(ctx context.Context, c *rpc.Call, in WorkflowInput, w Workflow) (Workflow, error) {
	n, err := m.node(ctx, c.TenantID, in.NodeID)
	if err != nil {
		return Workflow{}, err
	}
	apimetal.Start(ctx, m.d, n)
	return m.reread(ctx, c.TenantID, in.NodeID, w.ID)
}

// abort records the abort of the node's operation when it runs this live
// workflow; anything else is INVALID_STATE with what the workflow admits.
func (m methods) abort(ctx context.Context, c *rpc.Call, tx store.Tx, in WorkflowInput) (Workflow, error) {
	w, err := workflows.Get(ctx, tx, c.TenantID, in.NodeID, in.WorkflowID)
	if err != nil {
		return Workflow{}, err
	}
	if !provisioning.Live(w.State) {
		return Workflow{}, core.Errorf(core.CodeInvalidState, "workflow %s is %s: only a live workflow is aborted", w.ID, w.State).
			WithDetails(map[string]any{"workflowId": w.ID, "state": w.State, "allowed": w.Allowed})
	}
	n, err := domain.RequestAbort(ctx, tx, c.TenantID, in.NodeID, c.Caller.IdentityID)
	if err != nil {
		return Workflow{}, err
	}
	if n.Lifecycle.OpSeq != w.OpSeq {
		return Workflow{}, core.Errorf(core.CodeInvalidState, "the node's operation in flight does not run workflow %s", w.ID).
			WithDetails(map[string]any{"workflowId": w.ID, "state": w.State, "allowed": []string{}})
	}
	return w, nil
}

// afterAbort is metal.abort's: the running lifecycle aborts (or the call
// fails the node when none runs), and the workflow is answered as it ended.
func (m methods) afterAbort(ctx context.Context, c *rpc.Call, in WorkflowInput, w Workflow) (Workflow, error) {
	n, err := m.node(ctx, c.TenantID, in.NodeID)
	if err != nil {
		return Workflow{}, err
	}
	if _, err := apimetal.AbortAfter(ctx, m.d, c, n); err != nil {
		return Workflow{}, err
	}
	return m.reread(ctx, c.TenantID, in.NodeID, w.ID)
}

func (m methods) node(ctx context.Context, tenantID, nodeID string) (apimetal.MetalNode, error) {
	var n apimetal.MetalNode
	err := m.d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		n, err = domain.Get(ctx, tx, tenantID, nodeID, false)
		return err
	})
	return n, err
}

func (m methods) reread(ctx context.Context, tenantID, nodeID, id string) (Workflow, error) {
	var w Workflow
	err := m.d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		w, err = workflows.Get(ctx, tx, tenantID, nodeID, id)
		return err
	})
	return w, err
}

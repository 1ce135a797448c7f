// Package metal describes the bare-metal methods (metal.*): enrolling a
// machine behind its BMC, each lifecycle operation of core/metal's table,
// abort, power, bulk runs, and the machines a site discovered. Handlers
// call store/metal in the call's transaction; once it commits, the
// operation's workflow (activities/metal) is started, and a start that
// fails is owed: the row records it and the reconciler makes it.
package metal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/better-compute/better-compute/drivers"

	metalact "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/core/provisioning"
	coresecrets "github.com/better-compute/better-compute/core/secrets"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/metal"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/store/profiles"
	"github.com/better-compute/better-compute/store/workflows"
)

// The metal domain's types, as the methods answer them.
type (
	MetalNode  = domain.Node
	Lifecycle  = domain.Lifecycle
	BMC        = domain.BMC
	LastError  = domain.LastError
	Discovered = domain.Discovered
)

// RedfishInput is a machine's Redfish service: its https URL, the user,
// and the password as a secret reference (secret://<tenant>/<name>) of the
// pool's owner or of the fleet, never the password itself. Address,
// username and passwordSecret are required (checked by the domain, which
// names the field).
type RedfishInput struct {
	Address            string `json:"address" jsonschema:"maxLength=2048,pattern=^https://[^/?#@]+(/.*)?$"`
	Username           string `json:"username" jsonschema:"minLength=1,maxLength=128"`
	PasswordSecret     string `json:"passwordSecret" jsonschema:"maxLength=256,pattern=^secret://"`
	CAPEM              string `json:"caPem,omitempty" jsonschema:"maxLength=65536"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`
}

// IPMIInput is a machine's IPMI over LAN endpoint (host[:port], 623 when
// left out).
type IPMIInput struct {
	Address        string `json:"address" jsonschema:"maxLength=255,pattern=^[A-Za-z0-9._:-]+$"`
	Username       string `json:"username" jsonschema:"minLength=1,maxLength=128"`
	PasswordSecret string `json:"passwordSecret" jsonschema:"maxLength=256,pattern=^secret://"`
}

// BMCInput is a machine's BMC: Redfish, IPMI or both (drivers fail over).
type BMCInput struct {
	Redfish *RedfishInput `json:"redfish,omitempty"`
	IPMI    *IPMIInput    `json:"ipmi,omitempty"`
}

// macPattern is a MAC address, colon or dash separated.
const macPattern = `^[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}$`

// EnrollInput is metal.enroll's input: a machine behind its BMC becomes a
// node of the tenant's own pool, in provision state enrolling. Bindings
// choose a driver per concern (drivers.list); bootMac is the MAC it
// network-boots from, when known.
type EnrollInput struct {
	TenantID string            `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string            `json:"poolId" jsonschema:"required" id:"pool"`
	Name     string            `json:"name" jsonschema:"required,minLength=1,maxLength=63"`
	BMC      BMCInput          `json:"bmc" jsonschema:"required"`
	Bindings map[string]string `json:"bindings,omitempty" maxBytes:"4096"`
	BootMAC  string            `json:"bootMac,omitempty" jsonschema:"pattern=^[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}$"`
	Labels   map[string]string `json:"labels,omitempty" maxBytes:"16384"`
}

// NodeInput names one enrolled node.
type NodeInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string `json:"nodeId" jsonschema:"required" id:"node"`
}

// PowerAction is what metal.power does.
type PowerAction string

// The power actions.
const (
	PowerOn    PowerAction = "on"
	PowerOff   PowerAction = "off"
	PowerCycle PowerAction = "cycle"
	PowerReset PowerAction = "reset"
)

// Enum makes an input field of this type take only these values.
func (PowerAction) Enum() []string { return []string{"on", "off", "cycle", "reset"} }

// PowerInput is metal.power's input.
type PowerInput struct {
	TenantID string      `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string      `json:"nodeId" jsonschema:"required" id:"node"`
	Action   PowerAction `json:"action" jsonschema:"required"`
}

// BulkInput is metal.bulk's input: one operation over nodes of the pool,
// at most concurrency at a time (4 when left out); args are the
// operation's (power: {"action": …}; deploy: {"profileId": …, "profileVersion": …}).
type BulkInput struct {
	TenantID    string              `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID      string              `json:"poolId" jsonschema:"required" id:"pool"`
	Operation   coremetal.Operation `json:"operation" jsonschema:"required"`
	NodeIDs     []string            `json:"nodeIds" jsonschema:"required,maxItems=100" maxBytes:"8192"`
	Concurrency int                 `json:"concurrency,omitempty" jsonschema:"minimum=1,maximum=16"`
	Args        json.RawMessage     `json:"args,omitempty" jsonschema:"type=object" maxBytes:"4096"`
}

// BulkItem is one node's outcome of metal.bulk: whether its operation
// began, or why not (ACCESS_DENIED, NOT_FOUND, INVALID_STATE, …).
type BulkItem struct {
	NodeID   string `json:"nodeId"`
	Accepted bool   `json:"accepted"`
	Code     string `json:"code,omitempty"`
	Message  string `json:"message,omitempty"`
	OpSeq    int64  `json:"opSeq,omitempty"`
}

// BulkResult is metal.bulk's answer: per node, in the input's order, and
// the bulk run's workflow id ("" when no node was accepted). It is not a
// list (it does not page), so its items are "results".
type BulkResult struct {
	BulkID  string     `json:"bulkId,omitempty"`
	Results []BulkItem `json:"results"`
}

// DiscoveredInput is metal.discovered's input: a page of the site's
// discovered machines, newest seen first.
type DiscoveredInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	SiteID   string `json:"siteId" jsonschema:"required" id:"site"`
	rpc.ListInput
}

// DiscoveredList is metal.discovered's answer.
type DiscoveredList struct {
	Items      []Discovered `json:"items"`
	NextCursor string       `json:"nextCursor,omitempty"`
}

// ConfirmMACInput is metal.confirmMac's input.
type ConfirmMACInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string `json:"nodeId" jsonschema:"required" id:"node"`
	MAC      string `json:"mac" jsonschema:"required,pattern=^[0-9A-Fa-f]{2}([:-][0-9A-Fa-f]{2}){5}$"`
}

// The metal.* methods.
const (
	Enroll     rpc.Ref[EnrollInput, MetalNode]          = "metal.enroll"
	Manage     rpc.Ref[NodeInput, MetalNode]            = "metal.manage"
	Inspect    rpc.Ref[NodeInput, MetalNode]            = "metal.inspect"
	Provide    rpc.Ref[NodeInput, MetalNode]            = "metal.provide"
	Deploy     rpc.Ref[DeployInput, Deployed]           = "metal.deploy"
	Undeploy   rpc.Ref[NodeInput, MetalNode]            = "metal.undeploy"
	Rescue     rpc.Ref[NodeInput, MetalNode]            = "metal.rescue"
	Unrescue   rpc.Ref[NodeInput, MetalNode]            = "metal.unrescue"
	Abort      rpc.Ref[NodeInput, MetalNode]            = "metal.abort"
	Recover    rpc.Ref[NodeInput, MetalNode]            = "metal.recover"
	Retire     rpc.Ref[NodeInput, MetalNode]            = "metal.retire"
	Power      rpc.Ref[PowerInput, MetalNode]           = "metal.power"
	Bulk       rpc.Ref[BulkInput, BulkResult]           = "metal.bulk"
	ListFound  rpc.Ref[DiscoveredInput, DiscoveredList] = "metal.discovered"
	ConfirmMAC rpc.Ref[ConfirmMACInput, MetalNode]      = "metal.confirmMac"
)

// DeployInput is metal.deploy's input: the profile (and its version, 0:
// the latest) the node is deployed with.
type DeployInput struct {
	TenantID       string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID         string `json:"nodeId" jsonschema:"required" id:"node"`
	ProfileID      string `json:"profileId" jsonschema:"required" id:"prof"`
	ProfileVersion int    `json:"profileVersion,omitempty" jsonschema:"minimum=0"`
}

// Deployed is metal.deploy's answer: the node, and the provisioning
// workflow its deploy runs (workflows.get).
type Deployed struct {
	MetalNode
	WorkflowID string `json:"workflowId"`
}

// DefaultPowerWait bounds how long metal.power waits for the read-back.
const DefaultPowerWait = 60 * time.Second

// abortWait bounds how long metal.abort waits for the workflow's answer.
const abortWait = 30 * time.Second

// DefaultBulkConcurrency is metal.bulk's concurrency when left out.
const DefaultBulkConcurrency = 4

type methods struct {
	d         rpc.Deps
	types     nodes.Types
	deadlines domain.Deadlines
}

// Methods describes the metal domain's methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	m := newMethods(d)
	out := []rpc.Descriptor{
		&rpc.Method[EnrollInput, MetalNode]{Name: Enroll, Action: "compute:nodes:provision", DecidedOn: "compute-pool",
			Phase: "v0.2", Kind: core.KindMutation, Run: m.enroll},
		&rpc.Method[DeployInput, Deployed]{Name: Deploy, Action: "compute:nodes:provision", DecidedOn: "compute-node",
			Phase: "v0.2", Kind: core.KindMutation, Run: m.deploy,
			After: func(ctx context.Context, _ *rpc.Call, _ DeployInput, out Deployed) (Deployed, error) {
				out.MetalNode = m.start(ctx, out.MetalNode)
				return out, nil
			}},
	}
	for _, op := range []struct {
		ref rpc.Ref[NodeInput, MetalNode]
		op  coremetal.Operation
	}{{Manage, coremetal.Manage}, {Inspect, coremetal.Inspect}, {Provide, coremetal.Provide},
		{Undeploy, coremetal.Undeploy}, {Rescue, coremetal.Rescue}, {Unrescue, coremetal.Unrescue},
		{Recover, coremetal.Recover}, {Retire, coremetal.Retire}} {
		operation := op.op
		out = append(out, &rpc.Method[NodeInput, MetalNode]{Name: op.ref, Action: "compute:nodes:provision",
			DecidedOn: "compute-node", Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in NodeInput) (MetalNode, error) {
				return domain.BeginOperation(ctx, tx, m.types, domain.Begin{TenantID: c.TenantID, NodeID: in.NodeID,
					Operation: operation, By: c.Caller.IdentityID, Deadlines: m.deadlines})
			},
			After: func(ctx context.Context, _ *rpc.Call, _ NodeInput, n MetalNode) (MetalNode, error) {
				return m.start(ctx, n), nil
			}})
	}
	return append(out,
		&rpc.Method[NodeInput, MetalNode]{Name: Abort, Action: "compute:nodes:provision", DecidedOn: "compute-node",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in NodeInput) (MetalNode, error) {
				return domain.RequestAbort(ctx, tx, c.TenantID, in.NodeID, c.Caller.IdentityID)
			},
			After: m.afterAbort},
		&rpc.Method[PowerInput, MetalNode]{Name: Power, Action: "compute:nodes:power", DecidedOn: "compute-node",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in PowerInput) (MetalNode, error) {
				args, err := json.Marshal(metalact.PowerArgs{Action: string(in.Action)})
				if err != nil {
					return MetalNode{}, err
				}
				return domain.BeginOperation(ctx, tx, m.types, domain.Begin{TenantID: c.TenantID, NodeID: in.NodeID,
					Operation: coremetal.Power, Args: args, By: c.Caller.IdentityID, Deadlines: m.deadlines})
			},
			After: m.afterPower},
		&rpc.Method[BulkInput, BulkResult]{Name: Bulk, Action: "compute:nodes:provision", DecidedOn: "compute-pool, then each node",
			Phase: "v1.0", Kind: core.KindMutation, Direct: m.bulk},
		&rpc.Method[DiscoveredInput, DiscoveredList]{Name: ListFound, Action: "compute:sites:read",
			DecidedOn: "compute-site (the site's owning tenant only)", Phase: "v1.0", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in DiscoveredInput) (DiscoveredList, error) {
				q, err := in.Page()
				if err != nil {
					return DiscoveredList{}, err
				}
				read, err := domain.ListDiscovered(ctx, tx, c.TenantID, in.SiteID, q)
				items, next := rpc.Paged(read, q, Discovered.Key)
				if items == nil {
					items = []Discovered{}
				}
				return DiscoveredList{Items: items, NextCursor: next}, err
			}},
		&rpc.Method[ConfirmMACInput, MetalNode]{Name: ConfirmMAC, Action: "compute:nodes:provision", DecidedOn: "compute-node",
			Phase: "v1.0", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ConfirmMACInput) (MetalNode, error) {
				return domain.ConfirmMAC(ctx, tx, m.types, c.TenantID, in.NodeID, in.MAC, c.Caller.IdentityID)
			}},
	)
}

func newMethods(d rpc.Deps) methods {
	m := methods{d: d, deadlines: domain.Deadlines{}}
	if d.Catalog != nil {
		m.types = nodes.TypesOf(d.Catalog)
	}
	for k, v := range d.Metal.Deadlines {
		m.deadlines[nodestate.ProvisionState(k)] = v
	}
	return m
}

// Begin begins op on the node in the caller's transaction, as the metal.*
// operations do (workflows.retry's Retry).
func Begin(ctx context.Context, d rpc.Deps, c *rpc.Call, tx store.Tx, nodeID string, op coremetal.Operation, args json.RawMessage) (MetalNode, error) {
	m := newMethods(d)
	return domain.BeginOperation(ctx, tx, m.types, domain.Begin{TenantID: c.TenantID, NodeID: nodeID, Operation: op,
		Args: args, By: c.Caller.IdentityID, Deadlines: m.deadlines})
}

// Start starts a committed operation's lifecycle workflow as the metal.*
// operations' After does (a start that fails is owed).
func Start(ctx context.Context, d rpc.Deps, n MetalNode) MetalNode {
	return newMethods(d).start(ctx, n)
}

// AbortAfter is metal.abort's After: the running workflow's abort, or,
// when none runs, the node failed by the call (workflows.abort).
func AbortAfter(ctx context.Context, d rpc.Deps, c *rpc.Call, n MetalNode) (MetalNode, error) {
	return newMethods(d).afterAbort(ctx, c, NodeInput{TenantID: n.Node.TenantID, NodeID: n.Node.ID}, n)
}

// deploy expands the profile for the node, begins the Deploy operation and
// creates its workflow, pinned to that version, in one transaction: a
// profile that does not expand changes nothing and names the field.
func (m methods) deploy(ctx context.Context, c *rpc.Call, tx store.Tx, in DeployInput) (Deployed, error) {
	return m.beginDeploy(ctx, tx, c, in, nil, 0)
}

// beginDeploy is metal.deploy's transaction, and each node's of a bulk
// deploy (args and turns are the bulk run's).
func (m methods) beginDeploy(ctx context.Context, tx store.Tx, c *rpc.Call, in DeployInput, args json.RawMessage, turns int) (Deployed, error) {
	target, err := profiles.TargetForNode(ctx, tx, c.TenantID, in.NodeID)
	if err != nil {
		return Deployed{}, err
	}
	r, err := profiles.Expand(ctx, tx, m.d.Secrets, c.TenantID, in.ProfileID, in.ProfileVersion, target)
	if err != nil {
		return Deployed{}, err
	}
	n, err := domain.BeginOperation(ctx, tx, m.types, domain.Begin{TenantID: c.TenantID, NodeID: in.NodeID,
		Operation: coremetal.Deploy, Args: args, By: c.Caller.IdentityID, Deadlines: m.deadlines, Turns: turns})
	if err != nil {
		return Deployed{}, err
	}
	w, err := workflows.Create(ctx, tx, workflows.New{TenantID: c.TenantID, NodeID: in.NodeID, ProfileID: r.Context.ProfileID,
		ProfileVersion: r.Context.ProfileVersion, OpSeq: n.Lifecycle.OpSeq, Context: r.Context, Steps: r.Steps,
		CreatedBy: c.Caller.IdentityID})
	if err != nil {
		return Deployed{}, err
	}
	return Deployed{MetalNode: n, WorkflowID: w.ID}, nil
}

// enroll checks the endpoints and that each password reference names a
// secret of the pool's owner or of the fleet, then enrolls the machine.
// A reference to a missing secret and to another tenant's read the same.
func (m methods) enroll(ctx context.Context, c *rpc.Call, tx store.Tx, in EnrollInput) (MetalNode, error) {
	b := domain.BMC{}
	refs := map[string]string{}
	if r := in.BMC.Redfish; r != nil {
		b.Redfish = &domain.RedfishEndpoint{Address: r.Address, Username: r.Username, PasswordSecret: r.PasswordSecret,
			CAPEM: r.CAPEM, InsecureSkipVerify: r.InsecureSkipVerify}
		refs["bmc.redfish.passwordSecret"] = r.PasswordSecret
	}
	if i := in.BMC.IPMI; i != nil {
		b.IPMI = &domain.IPMIEndpoint{Address: i.Address, Username: i.Username, PasswordSecret: i.PasswordSecret}
		refs["bmc.ipmi.passwordSecret"] = i.PasswordSecret
	}
	if in.BootMAC != "" {
		mac, err := domain.NormalizeMAC("bootMac", in.BootMAC)
		if err != nil {
			return MetalNode{}, err
		}
		b.BootMAC = mac
	}
	if err := domain.CheckEndpoints(b); err != nil {
		return MetalNode{}, err
	}
	for _, concern := range slices.Sorted(maps.Keys(in.Bindings)) {
		if why := drivers.CheckBinding(concern, in.Bindings[concern]); why != "" {
			return MetalNode{}, core.Errorf(core.CodeInvalidInput, "bindings.%s: %s", concern, why).
				WithDetails(map[string]any{"field": "bindings." + concern, "reason": "binding"})
		}
	}
	for _, field := range []string{"bmc.redfish.passwordSecret", "bmc.ipmi.passwordSecret"} {
		ref, ok := refs[field]
		if !ok {
			continue
		}
		if _, _, err := coresecrets.ParseRef(ref); err != nil {
			return MetalNode{}, core.Errorf(core.CodeInvalidInput, "%s is not a secret reference (secret://<tenant>/<name>)", field).
				WithDetails(map[string]any{"field": field, "reason": "secretRef"})
		}
		if m.d.Secrets == nil {
			return MetalNode{}, core.Errorf(core.CodeUnavailable, "no secret store is configured")
		}
		ok, err := m.d.Secrets.Exists(ctx, tx, c.TenantID, ref)
		if err != nil {
			return MetalNode{}, err
		}
		if ok && c.TenantID != m.d.RootTenant {
			// A fleet secret serves only machines at the platform's own
			// sites: a tenant's custom site runs the tenant's agent, which
			// must never read it. Refused as if it did not exist.
			refTenant, _, _ := coresecrets.ParseRef(ref)
			if refTenant != c.TenantID {
				if ok, err = domain.PoolAtPlatformSite(ctx, tx, in.PoolID, m.d.RootTenant); err != nil {
					return MetalNode{}, err
				}
			}
		}
		if !ok {
			return MetalNode{}, core.Errorf(core.CodeInvalidInput, "%s names no secret of this tenant or of the fleet", field).
				WithDetails(map[string]any{"field": field, "reason": "secretNotFound"})
		}
	}
	return domain.Enroll(ctx, tx, m.types, domain.Enrollment{TenantID: c.TenantID, PoolID: in.PoolID, Name: in.Name,
		BMC: b, Bindings: in.Bindings, Labels: in.Labels, RootTenant: m.d.RootTenant, By: c.Caller.IdentityID})
}

// start starts the committed operation's workflow and records the start.
// A start that fails is owed, not an error: the row says so
// (workflowStarted false) and the reconciler makes it.
func (m methods) start(ctx context.Context, n MetalNode) MetalNode {
	if m.d.Temporal == nil || n.Lifecycle.Operation == "" {
		return n
	}
	p := metalact.MetalParams{TenantID: n.Node.TenantID, NodeID: n.Node.ID, OpSeq: n.Lifecycle.OpSeq}
	// A run of the node's previous operation may still be closing (its row
	// already moved on): StartLifecycle supersedes it.
	if err := metalact.StartLifecycle(ctx, m.d.Temporal, m.d.TaskQueue, p); err != nil {
		m.logWarn("metal: workflow start owed", "node", n.Node.ID, "opSeq", p.OpSeq, "error", err)
		return n
	}
	if err := m.d.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return domain.MarkStarted(ctx, tx, n.Node.ID, p.OpSeq)
	}); err != nil {
		m.logWarn("metal: workflow started, not recorded", "node", n.Node.ID, "opSeq", p.OpSeq, "error", err)
		return n
	}
	n.Lifecycle.WorkflowStarted = true
	return n
}

func (m methods) logWarn(msg string, args ...any) {
	if m.d.Logger != nil {
		m.d.Logger.Warn(msg, args...)
	}
}

// reread answers the node as it stands now.
func (m methods) reread(ctx context.Context, tenantID, nodeID string) (MetalNode, error) {
	var n MetalNode
	err := m.d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		n, err = domain.Get(ctx, tx, tenantID, nodeID, false)
		return err
	})
	return n, err
}

// afterAbort sends the running workflow its abort update, which answers
// once the node failed (reason aborted). When no workflow runs (never
// started, or lost), the call fails the node itself.
func (m methods) afterAbort(ctx context.Context, c *rpc.Call, _ NodeInput, n MetalNode) (MetalNode, error) {
	lost := m.d.Temporal == nil
	var updateErr error
	if !lost {
		// The workflow answers once the node failed; bounded, so a
		// workflow that cannot answer (its worker down) leaves the call
		// UNAVAILABLE rather than hanging.
		uctx, cancel := context.WithTimeout(ctx, abortWait)
		lost, updateErr = metalact.AbortLifecycle(uctx, m.d.Temporal, n.Node.ID, c.Caller.IdentityID)
		cancel()
	}
	if lost {
		err := m.d.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			return domain.FailOperation(ctx, tx, m.types, domain.Failure{NodeID: n.Node.ID, OpSeq: n.Lifecycle.OpSeq,
				Reason: coremetal.ReasonAborted, Code: string(core.CodeInvalidState),
				Message:       "aborted by " + c.Caller.IdentityID + " (no workflow ran the operation)",
				WorkflowState: provisioning.WorkflowAborted})
		})
		if err != nil && !domain.IsSuperseded(err) {
			return MetalNode{}, err
		}
	}
	now, err := m.reread(ctx, n.Node.TenantID, n.Node.ID)
	if err != nil {
		return MetalNode{}, err
	}
	if updateErr != nil && now.Lifecycle.Operation != "" && now.Lifecycle.OpSeq == n.Lifecycle.OpSeq {
		return MetalNode{}, core.Wrap(core.CodeUnavailable, updateErr, "the abort is recorded, but the workflow did not answer it; call metal.abort again")
	}
	return now, nil
}

// afterPower starts the power operation's workflow and waits, bounded, for
// its end; it answers the node with the power read back, or, past the
// bound, with the operation still in flight.
func (m methods) afterPower(ctx context.Context, _ *rpc.Call, _ PowerInput, n MetalNode) (MetalNode, error) {
	n = m.start(ctx, n)
	if m.d.Temporal == nil || !n.Lifecycle.WorkflowStarted {
		return n, nil
	}
	wait := m.d.Metal.PowerWait
	if wait <= 0 {
		wait = DefaultPowerWait
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	run := m.d.Temporal.GetWorkflow(wctx, metalact.MetalWorkflowID(n.Node.ID), "")
	var result json.RawMessage
	err := run.Get(wctx, &result)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && wctx.Err() == nil {
		m.logWarn("metal: power workflow ended with an error", "node", n.Node.ID, "error", err)
	}
	return m.reread(ctx, n.Node.TenantID, n.Node.ID)
}

// bulk decides on the pool (the envelope did), then on each node with IAM
// (a denied node is its item's ACCESS_DENIED), begins each allowed node's
// operation in a transaction of its own, and starts one bulk run that
// starts the nodes' workflows at most concurrency at a time.
func (m methods) bulk(ctx context.Context, c *rpc.Call, in BulkInput) (BulkResult, error) {
	if _, ok := coremetal.EdgeOf(in.Operation); !ok || in.Operation == coremetal.Retry {
		return BulkResult{}, core.Errorf(core.CodeInvalidInput, "operation %q is not a lifecycle operation of metal.bulk", in.Operation).
			WithDetails(map[string]any{"field": "operation", "reason": "enum"})
	}
	concurrency := in.Concurrency
	if concurrency == 0 {
		concurrency = DefaultBulkConcurrency
	}
	if len(in.NodeIDs) == 0 {
		return BulkResult{}, core.Errorf(core.CodeInvalidInput, "nodeIds needs at least one node").
			WithDetails(map[string]any{"field": "nodeIds", "reason": "minItems"})
	}
	seen := map[string]bool{}
	for _, id := range in.NodeIDs {
		if !core.ValidID("node", id) {
			return BulkResult{}, core.Errorf(core.CodeInvalidInput, "nodeIds: %q is not a node id", id).
				WithDetails(map[string]any{"field": "nodeIds", "reason": "pattern"})
		}
		if seen[id] {
			return BulkResult{}, core.Errorf(core.CodeInvalidInput, "nodeIds: %s is named twice", id).
				WithDetails(map[string]any{"field": "nodeIds", "reason": "uniqueItems"})
		}
		seen[id] = true
	}
	args := map[string]any{}
	if len(in.Args) > 0 {
		if err := json.Unmarshal(in.Args, &args); err != nil {
			return BulkResult{}, core.Errorf(core.CodeInvalidInput, "args must be an object").
				WithDetails(map[string]any{"field": "args", "reason": "type"})
		}
	}
	if in.Operation == coremetal.Power {
		if a, _ := args["action"].(string); !slices.Contains(PowerAction("").Enum(), a) {
			return BulkResult{}, core.Errorf(core.CodeInvalidInput, "a bulk power needs args.action: on, off, cycle or reset").
				WithDetails(map[string]any{"field": "args", "reason": "enum"})
		}
	}
	var deploy DeployInput
	if in.Operation == coremetal.Deploy {
		id, _ := args["profileId"].(string)
		version, _ := args["profileVersion"].(float64)
		if !core.ValidID("prof", id) || version < 0 || version != float64(int(version)) {
			return BulkResult{}, core.Errorf(core.CodeInvalidInput, "a bulk deploy needs args.profileId (and optionally args.profileVersion)").
				WithDetails(map[string]any{"field": "args.profileId", "reason": "required"})
		}
		deploy = DeployInput{TenantID: c.TenantID, ProfileID: id, ProfileVersion: int(version)}
	}
	requestID := c.Cred.RequestID
	if requestID == "" {
		requestID = core.NewID("bulk")
	}
	bulkID := metalact.BulkWorkflowID(in.PoolID, requestID)
	args["bulkId"] = bulkID
	rawArgs, err := json.Marshal(args)
	if err != nil {
		return BulkResult{}, err
	}

	// Which nodes are the pool's (one read), then the per-node decisions
	// outside any transaction.
	items := make([]BulkItem, len(in.NodeIDs))
	err = m.d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		p, err := pools.View(ctx, tx, c.TenantID, in.PoolID)
		if err != nil {
			return err
		}
		if p.TenantID != c.TenantID {
			return core.Errorf(core.CodeAccessDenied, "pool %s is offered to tenant %s: only its owner runs its machines' lifecycle", p.ID, c.TenantID)
		}
		for i, id := range in.NodeIDs {
			items[i].NodeID = id
			n, err := nodes.Get(ctx, tx, c.TenantID, id, false)
			var e *core.Error
			switch {
			case errors.As(err, &e) && e.Code == core.CodeNotFound, err == nil && n.PoolID != in.PoolID:
				items[i].Code, items[i].Message = string(core.CodeNotFound), fmt.Sprintf("node %s not found in pool %s", id, in.PoolID)
			case err != nil:
				return err
			}
		}
		return nil
	})
	if err != nil {
		return BulkResult{}, err
	}
	for i := range items {
		if items[i].Code != "" {
			continue
		}
		if err := m.decide(ctx, c, items[i].NodeID); err != nil {
			items[i].Code, items[i].Message = codeOf(err), err.Error()
		}
	}
	var begun []metalact.BulkNode
	for i := range items {
		if items[i].Code != "" {
			continue
		}
		var n MetalNode
		err := m.d.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			if in.Operation == coremetal.Deploy {
				in := deploy
				in.NodeID = items[i].NodeID
				d, err := m.beginDeploy(ctx, tx, c, in, rawArgs, len(begun)/concurrency)
				n = d.MetalNode
				return err
			}
			n, err = domain.BeginOperation(ctx, tx, m.types, domain.Begin{TenantID: c.TenantID, NodeID: items[i].NodeID,
				Operation: in.Operation, Args: rawArgs, By: c.Caller.IdentityID, Deadlines: m.deadlines,
				Turns: len(begun) / concurrency})
			return err
		})
		if err != nil {
			items[i].Code, items[i].Message = codeOf(err), err.Error()
			continue
		}
		items[i].Accepted, items[i].OpSeq = true, n.Lifecycle.OpSeq
		begun = append(begun, metalact.BulkNode{NodeID: n.Node.ID, OpSeq: n.Lifecycle.OpSeq})
	}
	out := BulkResult{Results: items}
	if len(begun) == 0 {
		return out, nil
	}
	out.BulkID = bulkID
	if m.d.Temporal != nil {
		if err := metalact.StartBulk(ctx, m.d.Temporal, m.d.TaskQueue, requestID, metalact.BulkParams{TenantID: c.TenantID,
			PoolID: in.PoolID, Operation: string(in.Operation), Nodes: begun, Concurrency: concurrency}); err != nil {
			// The nodes' starts are owed: the reconciler starts them once
			// no bulk run holds them.
			m.logWarn("metal: bulk run start owed", "bulk", bulkID, "error", err)
		}
	}
	return out, nil
}

// decide is the per-node decision of metal.bulk.
func (m methods) decide(ctx context.Context, c *rpc.Call, nodeID string) error {
	if m.d.IAM == nil {
		return core.Errorf(core.CodeUnavailable, "no per-node decisions configured")
	}
	d, err := m.d.IAM.Authorize(ctx, c.Request(iam.Resource{Type: m.d.Catalog.FullName(nodes.ResourceType), ID: nodeID}))
	if err != nil {
		return err
	}
	if !d.Allowed {
		return core.Errorf(core.CodeAccessDenied, "access denied")
	}
	return nil
}

func codeOf(err error) string {
	var e *core.Error
	if errors.As(err, &e) {
		return string(e.Code)
	}
	return string(core.CodeInternal)
}

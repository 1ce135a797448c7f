// Package nodes describes the methods of the nodes domain: nodes.*, the
// join tokens and join requests by which machines become nodes, their
// inventory and their commands. Handlers call store/nodes; nodes.drain
// starts the node's drain workflow once the drain is committed.
package nodes

import (
	"context"
	"slices"

	nodesact "github.com/better-compute/better-compute/activities/nodes"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/metal"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// The nodes domain's types, as the methods answer them.
type (
	Node          = domain.Node
	NodeCondition = domain.Condition
	NodeTaint     = domain.Taint
	TaintRef      = domain.TaintRef
	NodeEvent     = domain.Event
)

// NodeDetail is nodes.get's answer: the node and, for a machine enrolled
// behind its BMC (metal.enroll), its lifecycle and BMC endpoints (secret
// references only, never a value).
type NodeDetail struct {
	Node
	Metal *MetalView `json:"metal,omitempty"`
}

// MetalView is an enrolled node's lifecycle and BMC, as the metal methods
// answer them.
type MetalView struct {
	Lifecycle metal.Lifecycle `json:"lifecycle"`
	BMC       metal.BMC       `json:"bmc"`
}

// NodeList is nodes.list's answer.
type NodeList struct {
	Items      []Node `json:"items"`
	NextCursor string `json:"nextCursor,omitempty"`
}

// NodeEventList is nodes.events' answer, newest first.
type NodeEventList struct {
	Items      []NodeEvent `json:"items"`
	NextCursor string      `json:"nextCursor,omitempty"`
}

// EventAdopted records an adoption.
const EventAdopted = domain.EventAdopted

// NodeInput names one node.
type NodeInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string `json:"nodeId" jsonschema:"required" id:"node"`
}

// ListInput is nodes.list's input: the tenant's live nodes, filtered by
// pool, provision state, connectivity and computed schedulability.
type ListInput struct {
	TenantID       string                `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID         string                `json:"poolId,omitempty" id:"pool"`
	ProvisionState states.ProvisionState `json:"provisionState,omitempty"`
	Connectivity   states.Connectivity   `json:"connectivity,omitempty"`
	Schedulable    *bool                 `json:"schedulable,omitempty"`
	rpc.ListInput
}

// EventsInput is nodes.events' input: a page of the node's events.
type EventsInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string `json:"nodeId" jsonschema:"required" id:"node"`
	rpc.ListInput
}

// DrainInput is nodes.drain's input. Mode wait (the default) waits until
// no reservation holds the node's atoms any more; release releases the
// active ones and cancels those not begun.
type DrainInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string `json:"nodeId" jsonschema:"required" id:"node"`
	Mode     string `json:"mode,omitempty" jsonschema:"enum=wait,enum=release"`
}

// LabelInput is nodes.label's input: labels to set and to remove (the
// domain checks their keys and values).
type LabelInput struct {
	TenantID string            `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string            `json:"nodeId" jsonschema:"required" id:"node"`
	Set      map[string]string `json:"set,omitempty" maxBytes:"16384"`
	Remove   []string          `json:"remove,omitempty" maxBytes:"16384"`
}

// TaintInput is nodes.taint's input: taints to add and to remove (the
// domain checks their keys, values and effects).
type TaintInput struct {
	TenantID string      `json:"tenantId" jsonschema:"required" id:"tenant"`
	NodeID   string      `json:"nodeId" jsonschema:"required" id:"node"`
	Add      []NodeTaint `json:"add,omitempty" maxBytes:"16384"`
	Remove   []TaintRef  `json:"remove,omitempty" maxBytes:"16384"`
}

// The nodes.* methods (but the join requests' nodes.revokeIdentity).
const (
	List     rpc.Ref[ListInput, NodeList]        = "nodes.list"
	Get      rpc.Ref[NodeInput, NodeDetail]      = "nodes.get"
	Events   rpc.Ref[EventsInput, NodeEventList] = "nodes.events"
	Cordon   rpc.Ref[NodeInput, Node]            = "nodes.cordon"
	Uncordon rpc.Ref[NodeInput, Node]            = "nodes.uncordon"
	Drain    rpc.Ref[DrainInput, Node]           = "nodes.drain"
	Label    rpc.Ref[LabelInput, Node]           = "nodes.label"
	Taint    rpc.Ref[TaintInput, Node]           = "nodes.taint"
	Adopt    rpc.Ref[NodeInput, Node]            = "nodes.adopt"
	Delete   rpc.Ref[NodeInput, Node]            = "nodes.delete"
)

// methods are the handlers and what they share.
type methods struct{ d rpc.Deps }

// Methods describes the nodes domain's methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	m := methods{d}
	return append(m.nodes(), append(m.joins(), append(m.inventory(), append(m.commands(), m.sshCerts()...)...)...)...)
}

func (m methods) nodes() []rpc.Descriptor {
	d := m.d
	return []rpc.Descriptor{
		// Oldest first: creation millisecond, then id.
		&rpc.Method[ListInput, NodeList]{Name: List, Action: "compute:nodes:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.1", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				f := domain.Filter{PoolID: in.PoolID, ProvisionState: string(in.ProvisionState),
					Connectivity: string(in.Connectivity), Schedulable: in.Schedulable}
				read, err := domain.List(ctx, tx, d.Catalog.FullName(domain.ResourceType), c.TenantID, f, q)
				rows, next := rpc.Paged(read, q, func(n Node) store.Key { return store.Key{At: n.CreatedAt, ID: n.ID} })
				return rpc.PageFrom(slices.DeleteFunc(rows, func(n Node) bool { return !f.Keep(n) }), next,
					func(n Node) iam.Resource { return d.Resource(domain.ResourceType, n.ID) },
					func(kept []Node, next string) any { return NodeList{Items: kept, NextCursor: next} }), err
			}},
		&rpc.Method[NodeInput, NodeDetail]{Name: Get, Action: "compute:nodes:read", DecidedOn: "compute-node",
			Phase: "v0.1", Kind: core.KindRead,
			Read: func(c *rpc.Call, b *store.Batch, in NodeInput) func() (NodeDetail, error) {
				node, view := domain.QueueGet(b, c.TenantID, in.NodeID), metal.QueueView(b, in.NodeID)
				return func() (NodeDetail, error) {
					n, err := node()
					if err != nil {
						return NodeDetail{}, err
					}
					v, err := view(n)
					if err != nil || v == nil {
						return NodeDetail{Node: n}, err
					}
					return NodeDetail{Node: n, Metal: &MetalView{Lifecycle: v.Lifecycle, BMC: v.BMC}}, nil
				}
			}},
		&rpc.Method[EventsInput, NodeEventList]{Name: Events, Action: "compute:nodes:read", DecidedOn: "compute-node",
			Phase: "v0.1", Kind: core.KindRead,
			// Newest first: the event's microsecond, then id, both descending.
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in EventsInput) (NodeEventList, error) {
				q, err := in.Page()
				if err != nil {
					return NodeEventList{}, err
				}
				read, err := domain.Events(ctx, tx, c.TenantID, in.NodeID, q)
				items, next := rpc.Paged(read, q, NodeEvent.Key)
				return NodeEventList{Items: items, NextCursor: next}, err
			}},
		&rpc.Method[NodeInput, Node]{Name: Cordon, Action: "compute:nodes:cordon", DecidedOn: "compute-node",
			Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in NodeInput) (Node, error) {
				return domain.SetCordon(ctx, tx, c.TenantID, in.NodeID, true, c.Caller.IdentityID)
			}},
		// Uncordoning also ends a drain.
		&rpc.Method[NodeInput, Node]{Name: Uncordon, Action: "compute:nodes:cordon", DecidedOn: "compute-node",
			Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in NodeInput) (Node, error) {
				return domain.SetCordon(ctx, tx, c.TenantID, in.NodeID, false, c.Caller.IdentityID)
			}},
		// A drain cordons the node (the pool's disruption budget bounds the
		// drains) and, once committed, starts its drain workflow
		// (NodeDrainWorkflow, id <nodeId>/drain), which marks it drained.
		&rpc.Method[DrainInput, Node]{Name: Drain, Action: "compute:nodes:drain", DecidedOn: "compute-node",
			Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in DrainInput) (Node, error) {
				mode := in.Mode
				if mode == "" {
					mode = nodesact.DrainWait
				}
				return domain.Drain(ctx, tx, c.TenantID, in.NodeID, mode, c.Caller.IdentityID)
			},
			After: m.afterDrain},
		&rpc.Method[LabelInput, Node]{Name: Label, Action: "compute:nodes:update", DecidedOn: "compute-node",
			Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in LabelInput) (Node, error) {
				return domain.Label(ctx, tx, c.TenantID, in.NodeID, in.Set, in.Remove, c.Caller.IdentityID)
			}},
		&rpc.Method[TaintInput, Node]{Name: Taint, Action: "compute:nodes:update", DecidedOn: "compute-node",
			Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in TaintInput) (Node, error) {
				return domain.SetTaints(ctx, tx, c.TenantID, in.NodeID, in.Add, in.Remove, c.Caller.IdentityID)
			}},
		// Adoption completes the takeover of a machine that already ran bcd
		// and joined a pool whose acceptance asks for more than approval.
		&rpc.Method[NodeInput, Node]{Name: Adopt, Action: "compute:nodes:provision", DecidedOn: "compute-node",
			Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in NodeInput) (Node, error) {
				return domain.Adopt(ctx, tx, c.TenantID, in.NodeID, c.Caller.IdentityID)
			}},
		// Only a cordoned node is deleted (softly).
		&rpc.Method[NodeInput, Node]{Name: Delete, Action: "compute:nodes:delete", DecidedOn: "compute-node",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in NodeInput) (Node, error) {
				return domain.Delete(ctx, tx, c.TenantID, in.NodeID, c.Caller.IdentityID)
			}},
	}
}

// afterDrain starts the node's drain workflow once the drain is committed.
// Without a Temporal client (tests of the API alone) nothing drives drains.
func (m methods) afterDrain(ctx context.Context, _ *rpc.Call, _ DrainInput, n Node) (Node, error) {
	if n.DrainState != "draining" || m.d.Temporal == nil {
		return n, nil
	}
	if err := nodesact.StartNodeDrain(ctx, m.d.Temporal, m.d.TaskQueue,
		nodesact.NodeDrainParams{TenantID: n.TenantID, NodeID: n.ID, Mode: n.DrainMode}); err != nil {
		return Node{}, core.Wrap(core.CodeUnavailable, err, "the node is draining, but its drain workflow could not be started; drain it again")
	}
	return n, nil
}

package api

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// The nodes domain's types, as the API returns them.
type (
	Node          = domain.Node
	NodeCondition = domain.Condition
	Taint         = domain.Taint
	NodeEvent     = domain.Event
	NewNode       = domain.NewNode
)

// NodeList is nodes.list's answer.
type NodeList struct {
	Items []Node `json:"items"`
}

// NodeEventList is nodes.events' answer, newest first.
type NodeEventList struct {
	Items []NodeEvent `json:"items"`
}

// Limits of nodes.events and inventory.history.
const (
	defaultEventLimit = 100
	maxEventLimit     = 500
)

func (s *Server) nodeTypes() domain.Types { return domain.TypesOf(s.catalog) }

func (s *Server) nodeResource(id string) iam.Resource {
	return iam.Resource{Type: s.catalog.FullName(domain.ResourceType), ID: id}
}

// CreateNode makes a node in a live pool (domain.Create), in the caller's
// transaction.
func (s *Server) CreateNode(ctx context.Context, tx store.Tx, in NewNode) (Node, error) {
	return domain.Create(ctx, tx, s.nodeTypes(), in)
}

type nodeIDInput struct {
	NodeID string `json:"nodeId"`
}

func (s *Server) nodesGet(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in nodeIDInput
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return domain.Get(ctx, tx, c.TenantID, in.NodeID, false)
}

// nodesList answers the tenant's live nodes the projection holds, filtered
// by pool, provision state, connectivity and computed schedulability.
func (s *Server) nodesList(ctx context.Context, c *Call, tx store.Tx) (rpc.Page, error) {
	var in struct {
		PoolID         string `json:"poolId"`
		ProvisionState string `json:"provisionState"`
		Connectivity   string `json:"connectivity"`
		Schedulable    *bool  `json:"schedulable"`
	}
	if err := decode(c.Input, &in); err != nil {
		return rpc.Page{}, err
	}
	list, err := domain.List(ctx, tx, s.catalog.FullName(domain.ResourceType), c.TenantID,
		domain.Filter{PoolID: in.PoolID, ProvisionState: in.ProvisionState, Connectivity: in.Connectivity, Schedulable: in.Schedulable},
		listLimit)
	if err != nil {
		return rpc.Page{}, err
	}
	return rpc.PageOf(list, func(n Node) iam.Resource { return s.nodeResource(n.ID) },
		func(kept []Node) any { return NodeList{Items: kept} }), nil
}

func (s *Server) nodesEvents(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		NodeID string `json:"nodeId"`
		Limit  *int   `json:"limit"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	limit, err := limitOf(in.Limit, defaultEventLimit, maxEventLimit)
	if err != nil {
		return nil, err
	}
	items, err := domain.Events(ctx, tx, c.TenantID, in.NodeID, limit)
	if err != nil {
		return nil, err
	}
	return NodeEventList{Items: items}, nil
}

// limitOf reads an optional limit in [1, max].
func limitOf(v *int, def, max int) (int, error) {
	if v == nil {
		return def, nil
	}
	if *v < 1 || *v > max {
		return 0, badField("limit", "range", "limit must be in [1, %d]", max)
	}
	return *v, nil
}

func (s *Server) nodesCordon(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	return s.setCordon(ctx, c, tx, true)
}

func (s *Server) nodesUncordon(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	return s.setCordon(ctx, c, tx, false)
}

func (s *Server) setCordon(ctx context.Context, c *Call, tx store.Tx, cordon bool) (any, error) {
	var in nodeIDInput
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return domain.SetCordon(ctx, tx, c.TenantID, in.NodeID, cordon, c.Caller.IdentityID)
}

// nodesLabel sets and removes labels.
func (s *Server) nodesLabel(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		NodeID string            `json:"nodeId"`
		Set    map[string]string `json:"set"`
		Remove []string          `json:"remove"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return domain.Label(ctx, tx, c.TenantID, in.NodeID, in.Set, in.Remove, c.Caller.IdentityID)
}

// nodesTaint adds and removes taints.
func (s *Server) nodesTaint(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		NodeID string            `json:"nodeId"`
		Add    []Taint           `json:"add"`
		Remove []domain.TaintRef `json:"remove"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return domain.SetTaints(ctx, tx, c.TenantID, in.NodeID, in.Add, in.Remove, c.Caller.IdentityID)
}

// nodesDelete soft-deletes a cordoned node.
func (s *Server) nodesDelete(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in nodeIDInput
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return domain.Delete(ctx, tx, c.TenantID, in.NodeID, c.Caller.IdentityID)
}

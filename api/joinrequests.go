package api

import (
	"context"

	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
)

// JoinRequest is a join request as the API returns it: a join to a pool
// whose policy asks for approval. NodeID is set once approved. Neither its
// secret nor its CSR is shown.
type JoinRequest struct {
	ID          string `json:"id"`
	TenantID    string `json:"tenantId"`
	PoolID      string `json:"poolId"`
	JoinTokenID string `json:"joinTokenId"`
	Name        string `json:"name"`
	HardwareKey string `json:"hardwareKey"`
	State       string `json:"state"` // pending, approved, rejected or expired
	NodeID      string `json:"nodeId,omitempty"`
	DecidedBy   string `json:"decidedBy,omitempty"`
	DecidedAt   *int64 `json:"decidedAt,omitempty"`
	CreatedAt   int64  `json:"createdAt"`
	ExpiresAt   int64  `json:"expiresAt"`
}

// JoinRequestList is joinRequests.list's answer, oldest first.
type JoinRequestList struct {
	Items []JoinRequest `json:"items"`
}

func joinRequestOf(r domain.JoinRequest) JoinRequest {
	return JoinRequest{ID: r.ID, TenantID: r.TenantID, PoolID: r.PoolID, JoinTokenID: r.JoinTokenID, Name: r.Name,
		HardwareKey: r.HardwareKey, State: r.State, NodeID: r.NodeID, DecidedBy: r.DecidedBy,
		DecidedAt: msPtr(r.DecidedAt), CreatedAt: r.CreatedAt.UnixMilli(), ExpiresAt: r.ExpiresAt.UnixMilli()}
}

type joinRequestInput struct {
	PoolID        string `json:"poolId"`
	JoinRequestID string `json:"joinRequestId"`
}

// joinRequestsList answers the join requests of the tenant's own pool,
// optionally in one state. Decided on the pool, so a plain read.
func (s *Server) joinRequestsList(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID string `json:"poolId"`
		State  string `json:"state"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if _, err := pools.Own(ctx, tx, c.TenantID, in.PoolID); err != nil {
		return nil, err
	}
	rows, err := domain.ListJoinRequests(ctx, tx, c.TenantID, in.PoolID, in.State, listLimit)
	if err != nil {
		return nil, err
	}
	out := JoinRequestList{Items: make([]JoinRequest, len(rows))}
	for i, r := range rows {
		out.Items[i] = joinRequestOf(r)
	}
	return out, nil
}

// joinRequestsApprove admits a pending join: the node is made (or found by
// its hardware key), its inventory ingested, the stored CSR signed and the
// identity recorded; the certificate waits on the request for the agent's
// next poll. The pool must be live.
func (s *Server) joinRequestsApprove(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	if s.deps.NodeCA == nil {
		return nil, noNodeCA()
	}
	var in joinRequestInput
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	pool, err := pools.Live(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return nil, err
	}
	r, err := domain.GetJoinRequest(ctx, tx, c.TenantID, in.PoolID, in.JoinRequestID, true)
	if err != nil {
		return nil, err
	}
	if err := domain.JoinRequestPendingCheck(r); err != nil {
		return nil, err
	}
	cand, err := domain.CheckJoin("-", r.Name, r.Inventory, r.CSR)
	if err != nil {
		return nil, err
	}
	res, err := domain.Admit(ctx, tx, s.nodeTypes(), pool, cand, c.Caller.IdentityID, s.rootTenant, s.deps.NodeCA.SignNode)
	if err != nil {
		return nil, err
	}
	r, err = domain.DecideJoinRequest(ctx, tx, c.TenantID, in.PoolID, in.JoinRequestID, domain.JoinRequestDecision{
		State: domain.JoinRequestApproved, NodeID: res.NodeID, Certificate: string(res.Certificate), DecidedBy: c.Caller.IdentityID})
	if err != nil {
		return nil, err
	}
	return joinRequestOf(r), nil
}

// joinRequestsReject refuses a pending join; the agent's next poll is
// ACCESS_DENIED (reason rejected). The token's use stays spent.
func (s *Server) joinRequestsReject(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in joinRequestInput
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if _, err := pools.Load(ctx, tx, c.TenantID, in.PoolID); err != nil {
		return nil, err
	}
	r, err := domain.DecideJoinRequest(ctx, tx, c.TenantID, in.PoolID, in.JoinRequestID, domain.JoinRequestDecision{
		State: domain.JoinRequestRejected, DecidedBy: c.Caller.IdentityID})
	if err != nil {
		return nil, err
	}
	return joinRequestOf(r), nil
}

// nodesRevokeIdentity revokes every certificate of the tenant's node
// (domain.RevokeIdentity). It answers the node.
func (s *Server) nodesRevokeIdentity(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in nodeIDInput
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return domain.RevokeIdentity(ctx, tx, c.TenantID, in.NodeID, c.Caller.IdentityID)
}

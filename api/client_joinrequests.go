package api

import "context"

// JoinRequestsList calls joinRequests.list; state "" lists every state.
func (c *Client) JoinRequestsList(ctx context.Context, tenantID, poolID, state string) (JoinRequestList, error) {
	in := map[string]string{"tenantId": tenantID, "poolId": poolID}
	if state != "" {
		in["state"] = state
	}
	var out JoinRequestList
	return out, c.Call(ctx, "joinRequests.list", in, &out)
}

// JoinRequestsApprove calls joinRequests.approve: the node is admitted and
// the agent's next poll receives its certificate.
func (c *Client) JoinRequestsApprove(ctx context.Context, tenantID, poolID, joinRequestID string) (JoinRequest, error) {
	var out JoinRequest
	return out, c.Call(ctx, "joinRequests.approve",
		map[string]string{"tenantId": tenantID, "poolId": poolID, "joinRequestId": joinRequestID}, &out)
}

// JoinRequestsReject calls joinRequests.reject.
func (c *Client) JoinRequestsReject(ctx context.Context, tenantID, poolID, joinRequestID string) (JoinRequest, error) {
	var out JoinRequest
	return out, c.Call(ctx, "joinRequests.reject",
		map[string]string{"tenantId": tenantID, "poolId": poolID, "joinRequestId": joinRequestID}, &out)
}

// NodesRevokeIdentity calls nodes.revokeIdentity: every certificate of the
// node is revoked and its session closed. It answers the node.
func (c *Client) NodesRevokeIdentity(ctx context.Context, tenantID, nodeID string) (Node, error) {
	var out Node
	return out, c.Call(ctx, "nodes.revokeIdentity", map[string]string{"tenantId": tenantID, "nodeId": nodeID}, &out)
}

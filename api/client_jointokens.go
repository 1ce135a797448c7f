package api

import "context"

// JoinTokensCreateInput is joinTokens.create's input; zero fields take the
// defaults (24 h, one use).
type JoinTokensCreateInput struct {
	TenantID   string `json:"tenantId"`
	PoolID     string `json:"poolId"`
	Name       string `json:"name,omitempty"`
	TTLSeconds int64  `json:"ttlSeconds,omitempty"`
	MaxUses    int64  `json:"maxUses,omitempty"`
}

// JoinTokensCreate calls joinTokens.create; the answer's Token is shown
// only here.
func (c *Client) JoinTokensCreate(ctx context.Context, in JoinTokensCreateInput) (JoinToken, error) {
	var out JoinToken
	return out, c.Call(ctx, "joinTokens.create", in, &out)
}

// JoinTokensList calls joinTokens.list: every token of the pool, without secrets.
func (c *Client) JoinTokensList(ctx context.Context, tenantID, poolID string) (JoinTokenList, error) {
	var out JoinTokenList
	return out, c.Call(ctx, "joinTokens.list", map[string]string{"tenantId": tenantID, "poolId": poolID}, &out)
}

// JoinTokensRevoke calls joinTokens.revoke.
func (c *Client) JoinTokensRevoke(ctx context.Context, tenantID, poolID, tokenID string) (JoinToken, error) {
	var out JoinToken
	return out, c.Call(ctx, "joinTokens.revoke", map[string]string{"tenantId": tenantID, "poolId": poolID, "tokenId": tokenID}, &out)
}

package api

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
)

// JoinToken is a join token as the API returns it. Token is set only in
// joinTokens.create's answer: it is shown once and stored only as SHA-256
// (domain.HashJoinToken). State is active, expired, exhausted or revoked.
type JoinToken struct {
	ID        string `json:"id"`
	TenantID  string `json:"tenantId"`
	PoolID    string `json:"poolId"`
	Name      string `json:"name"`
	Token     string `json:"token,omitempty"`
	State     string `json:"state"`
	ExpiresAt int64  `json:"expiresAt"`
	MaxUses   int    `json:"maxUses"`
	Uses      int    `json:"uses"`
	CreatedBy string `json:"createdBy"`
	CreatedAt int64  `json:"createdAt"`
	RevokedAt *int64 `json:"revokedAt,omitempty"`
}

// JoinTokenList is joinTokens.list's answer: every token of the pool, in
// every state, without secrets.
type JoinTokenList struct {
	Items []JoinToken `json:"items"`
}

// JoinTokenPrefix starts every join token.
const JoinTokenPrefix = domain.JoinTokenPrefix

// joinTokens.create's bounds: ttlSeconds in [60 s, 30 days] (24 h when not
// given), maxUses in [1, 10000] (1 when not given).
const (
	defaultJoinTokenTTL = 24 * 60 * 60
	minJoinTokenTTL     = 60
	maxJoinTokenTTL     = 30 * 24 * 60 * 60
	defaultJoinTokenUse = 1
	maxJoinTokenUses    = 10000
)

func joinTokenOf(t domain.JoinToken) JoinToken {
	return JoinToken{ID: t.ID, TenantID: t.TenantID, PoolID: t.PoolID, Name: t.Name, State: t.State,
		ExpiresAt: t.ExpiresAt.UnixMilli(), MaxUses: t.MaxUses, Uses: t.Uses, CreatedBy: t.CreatedBy,
		CreatedAt: t.CreatedAt.UnixMilli(), RevokedAt: msPtr(t.RevokedAt)}
}

// joinTokensCreate makes a join token of the tenant's own, live pool whose
// nodes run bcd. The answer is the only place the token ever appears.
func (s *Server) joinTokensCreate(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID     string `json:"poolId"`
		Name       string `json:"name"`
		TTLSeconds *int64 `json:"ttlSeconds"`
		MaxUses    *int64 `json:"maxUses"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	ttl, maxUses := int64(defaultJoinTokenTTL), int64(defaultJoinTokenUse)
	if in.TTLSeconds != nil {
		if ttl = *in.TTLSeconds; ttl < minJoinTokenTTL || ttl > maxJoinTokenTTL {
			return nil, badField("ttlSeconds", "range", "ttlSeconds must be in [%d, %d] (60 s to 30 days)", minJoinTokenTTL, maxJoinTokenTTL)
		}
	}
	if in.MaxUses != nil {
		if maxUses = *in.MaxUses; maxUses < 1 || maxUses > maxJoinTokenUses {
			return nil, badField("maxUses", "range", "maxUses must be in [1, %d]", maxJoinTokenUses)
		}
	}
	p, err := pools.Live(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return nil, err
	}
	if p.Agent != "bcd" {
		return nil, core.Errorf(core.CodeInvalidState, "pool %s runs no node agent (agent %s): nodes do not join it", p.ID, p.Agent).
			WithDetails(map[string]any{"reason": "agent"})
	}
	tok, hash, err := domain.NewJoinTokenSecret()
	if err != nil {
		return nil, err
	}
	t, err := domain.CreateJoinToken(ctx, tx, domain.NewJoinToken{TenantID: p.TenantID, PoolID: p.ID, Name: in.Name,
		Hash: hash, TTL: time.Duration(ttl) * time.Second, MaxUses: int(maxUses), CreatedBy: c.Caller.IdentityID})
	if err != nil {
		return nil, err
	}
	out := joinTokenOf(t)
	out.Token = tok // shown once: this answer is the only place it exists
	return out, nil
}

// joinTokensList answers every join token of the tenant's pool, whatever
// its state, never with a secret. The method is decided on the pool (not
// per item), so it is a plain read.
func (s *Server) joinTokensList(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID string `json:"poolId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if _, err := pools.Own(ctx, tx, c.TenantID, in.PoolID); err != nil {
		return nil, err
	}
	rows, err := domain.ListJoinTokens(ctx, tx, c.TenantID, in.PoolID, listLimit)
	if err != nil {
		return nil, err
	}
	out := JoinTokenList{Items: make([]JoinToken, len(rows))}
	for i, t := range rows {
		out.Items[i] = joinTokenOf(t)
	}
	return out, nil
}

// joinTokensRevoke revokes a join token of the tenant's pool, archived or
// not. Revoking a revoked token answers it unchanged (its first revokedAt).
func (s *Server) joinTokensRevoke(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		PoolID  string `json:"poolId"`
		TokenID string `json:"tokenId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if _, err := pools.Load(ctx, tx, c.TenantID, in.PoolID); err != nil {
		return nil, err
	}
	t, err := domain.RevokeJoinToken(ctx, tx, c.TenantID, in.PoolID, in.TokenID)
	if err != nil {
		return nil, err
	}
	return joinTokenOf(t), nil
}

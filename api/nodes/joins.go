package nodes

import (
	"context"
	"strings"
	"time"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
)

// JoinToken is a join token as the methods answer it. Token is set only in
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
	// JoinCommand, with Token, is the command line that joins a machine
	// with this token: `bcd node join` with the API's public URL
	// (rpc.Deps.PublicURL, or "$BC_API_URL" for the shell to expand when
	// the server was given none), the token and the default state
	// directory.
	JoinCommand string `json:"joinCommand,omitempty"`
}

// JoinStateDir is where the join command keeps the node's identity, the
// state directory `bcd node run` reads after it.
const JoinStateDir = "/var/lib/bcd"

// JoinCommand is the `bcd node join` command line of a token, each
// argument quoted for a POSIX shell (the URL placeholder stays
// expandable).
func JoinCommand(publicURL, token string) string {
	api := `"$BC_API_URL"`
	if publicURL != "" {
		api = shellQuote(publicURL)
	}
	return "bcd node join --api " + api + " --token " + shellQuote(token) + " --state-dir " + shellQuote(JoinStateDir)
}

// shellQuote quotes s for a POSIX shell unless it is made of characters
// no shell treats specially.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,:/@%+=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// JoinTokenList is joinTokens.list's answer: every token of the pool, in
// every state, without secrets.
type JoinTokenList struct {
	Items      []JoinToken `json:"items"`
	NextCursor string      `json:"nextCursor,omitempty"`
}

// JoinTokenPrefix starts every join token.
const JoinTokenPrefix = domain.JoinTokenPrefix

// JoinRequest is a join request as the methods answer it: a join to a pool
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
	Items      []JoinRequest `json:"items"`
	NextCursor string        `json:"nextCursor,omitempty"`
}

// CreateJoinTokenInput is joinTokens.create's input: ttlSeconds from 60 s
// to 30 days (24 h when not given), maxUses 1 when not given.
type CreateJoinTokenInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID     string `json:"poolId" jsonschema:"required" id:"pool"`
	Name       string `json:"name,omitempty" jsonschema:"maxLength=128"`
	TTLSeconds *int64 `json:"ttlSeconds,omitempty" jsonschema:"minimum=60,maximum=2592000"`
	MaxUses    *int64 `json:"maxUses,omitempty" jsonschema:"minimum=1,maximum=10000"`
}

// PoolInput names one pool.
type PoolInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
}

// JoinTokenInput names one join token of a pool.
type JoinTokenInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
	TokenID  string `json:"tokenId" jsonschema:"required" id:"jt"`
}

// ListJoinRequestsInput is joinRequests.list's input; state filters when set.
type ListJoinRequestsInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
	State    string `json:"state,omitempty" jsonschema:"enum=pending,enum=approved,enum=rejected,enum=expired"`
	rpc.ListInput
}

// ListJoinTokensInput is joinTokens.list's input: a pool's tokens, a page
// of them.
type ListJoinTokensInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
	rpc.ListInput
}

// JoinRequestInput names one join request of a pool.
type JoinRequestInput struct {
	TenantID      string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID        string `json:"poolId" jsonschema:"required" id:"pool"`
	JoinRequestID string `json:"joinRequestId" jsonschema:"required" id:"jreq"`
}

// The join tokens' and join requests' methods, and the revocation of a
// node's identity.
const (
	CreateJoinToken    rpc.Ref[CreateJoinTokenInput, JoinToken]        = "joinTokens.create"
	ListJoinTokens     rpc.Ref[ListJoinTokensInput, JoinTokenList]     = "joinTokens.list"
	RevokeJoinToken    rpc.Ref[JoinTokenInput, JoinToken]              = "joinTokens.revoke"
	ListJoinRequests   rpc.Ref[ListJoinRequestsInput, JoinRequestList] = "joinRequests.list"
	ApproveJoinRequest rpc.Ref[JoinRequestInput, JoinRequest]          = "joinRequests.approve"
	RejectJoinRequest  rpc.Ref[JoinRequestInput, JoinRequest]          = "joinRequests.reject"
	RevokeIdentity     rpc.Ref[NodeInput, Node]                        = "nodes.revokeIdentity"
)

// joinTokens.create's defaults.
const (
	defaultJoinTokenTTL  = 24 * time.Hour
	defaultJoinTokenUses = 1
)

func joinTokenOf(t domain.JoinToken) JoinToken {
	return JoinToken{ID: t.ID, TenantID: t.TenantID, PoolID: t.PoolID, Name: t.Name, State: t.State,
		ExpiresAt: t.ExpiresAt.UnixMilli(), MaxUses: t.MaxUses, Uses: t.Uses, CreatedBy: t.CreatedBy,
		CreatedAt: t.CreatedAt.UnixMilli(), RevokedAt: msPtr(t.RevokedAt)}
}

func joinRequestOf(r domain.JoinRequest) JoinRequest {
	return JoinRequest{ID: r.ID, TenantID: r.TenantID, PoolID: r.PoolID, JoinTokenID: r.JoinTokenID, Name: r.Name,
		HardwareKey: r.HardwareKey, State: r.State, NodeID: r.NodeID, DecidedBy: r.DecidedBy,
		DecidedAt: msPtr(r.DecidedAt), CreatedAt: r.CreatedAt.UnixMilli(), ExpiresAt: r.ExpiresAt.UnixMilli()}
}

func msPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	ms := t.UnixMilli()
	return &ms
}

func (m methods) joins() []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[CreateJoinTokenInput, JoinToken]{Name: CreateJoinToken, Action: "compute:join-tokens:create",
			DecidedOn: "compute-pool", Phase: "v0.1", Kind: core.KindMutation, Run: m.createJoinToken},
		// Decided on the pool (not per item), so a plain read. Oldest
		// first: creation millisecond, then id.
		&rpc.Method[ListJoinTokensInput, JoinTokenList]{Name: ListJoinTokens, Action: "compute:join-tokens:read",
			DecidedOn: "compute-pool", Phase: "v0.1", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListJoinTokensInput) (JoinTokenList, error) {
				q, err := in.Page()
				if err != nil {
					return JoinTokenList{}, err
				}
				if _, err := ownPool(ctx, tx, c.TenantID, in.PoolID); err != nil {
					return JoinTokenList{}, err
				}
				read, err := domain.ListJoinTokens(ctx, tx, c.TenantID, in.PoolID, q)
				rows, next := rpc.Paged(read, q, func(t domain.JoinToken) store.Key {
					return store.Key{At: t.CreatedAt.UnixMilli(), ID: t.ID}
				})
				out := JoinTokenList{Items: make([]JoinToken, len(rows)), NextCursor: next}
				for i, t := range rows {
					out.Items[i] = joinTokenOf(t)
				}
				return out, err
			}},
		// A token of an archived pool may be revoked too; revoking a revoked
		// token answers it unchanged (its first revokedAt).
		&rpc.Method[JoinTokenInput, JoinToken]{Name: RevokeJoinToken, Action: "compute:join-tokens:revoke",
			DecidedOn: "compute-pool", Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in JoinTokenInput) (JoinToken, error) {
				if _, err := ownPool(ctx, tx, c.TenantID, in.PoolID); err != nil {
					return JoinToken{}, err
				}
				if _, err := pools.Load(ctx, tx, c.TenantID, in.PoolID); err != nil {
					return JoinToken{}, err
				}
				t, err := domain.RevokeJoinToken(ctx, tx, c.TenantID, in.PoolID, in.TokenID)
				if err != nil {
					return JoinToken{}, err
				}
				return joinTokenOf(t), nil
			}},
		// Decided on the pool, so a plain read. Oldest first: creation
		// millisecond, then id.
		&rpc.Method[ListJoinRequestsInput, JoinRequestList]{Name: ListJoinRequests, Action: "compute:join-tokens:read",
			DecidedOn: "compute-pool", Phase: "v0.2", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListJoinRequestsInput) (JoinRequestList, error) {
				q, err := in.Page()
				if err != nil {
					return JoinRequestList{}, err
				}
				if _, err := ownPool(ctx, tx, c.TenantID, in.PoolID); err != nil {
					return JoinRequestList{}, err
				}
				read, err := domain.ListJoinRequests(ctx, tx, c.TenantID, in.PoolID, in.State, q)
				rows, next := rpc.Paged(read, q, func(r domain.JoinRequest) store.Key {
					return store.Key{At: r.CreatedAt.UnixMilli(), ID: r.ID}
				})
				out := JoinRequestList{Items: make([]JoinRequest, len(rows)), NextCursor: next}
				for i, r := range rows {
					out.Items[i] = joinRequestOf(r)
				}
				return out, err
			}},
		&rpc.Method[JoinRequestInput, JoinRequest]{Name: ApproveJoinRequest, Action: "compute:join-tokens:create",
			DecidedOn: "compute-pool", Phase: "v0.2", Kind: core.KindMutation, Run: m.approveJoinRequest},
		// The agent's next poll is ACCESS_DENIED (reason rejected); the
		// token's use stays spent.
		&rpc.Method[JoinRequestInput, JoinRequest]{Name: RejectJoinRequest, Action: "compute:join-tokens:create",
			DecidedOn: "compute-pool", Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in JoinRequestInput) (JoinRequest, error) {
				if _, err := ownPool(ctx, tx, c.TenantID, in.PoolID); err != nil {
					return JoinRequest{}, err
				}
				if _, err := pools.Load(ctx, tx, c.TenantID, in.PoolID); err != nil {
					return JoinRequest{}, err
				}
				r, err := domain.DecideJoinRequest(ctx, tx, c.TenantID, in.PoolID, in.JoinRequestID, domain.JoinRequestDecision{
					State: domain.JoinRequestRejected, DecidedBy: c.Caller.IdentityID})
				if err != nil {
					return JoinRequest{}, err
				}
				return joinRequestOf(r), nil
			}},
		// Every certificate of the node is revoked and its session closed.
		&rpc.Method[NodeInput, Node]{Name: RevokeIdentity, Action: "compute:nodes:revoke-identity",
			DecidedOn: "compute-node", Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in NodeInput) (Node, error) {
				return domain.RevokeIdentity(ctx, tx, c.TenantID, in.NodeID, c.Caller.IdentityID)
			}},
	}
}

// ownPool reads the tenant's own pool for the join methods, whose tokens
// and requests are the pool owner's alone. A pool offered to the tenant is
// in its view (pools.get shows it), so refusing it is ACCESS_DENIED, not
// NOT_FOUND; a pool outside the view stays NOT_FOUND.
func ownPool(ctx context.Context, tx store.Tx, tenantID, poolID string) (pools.Pool, error) {
	p, err := pools.View(ctx, tx, tenantID, poolID)
	if err != nil {
		return pools.Pool{}, err
	}
	if p.TenantID != tenantID {
		return pools.Pool{}, core.Errorf(core.CodeAccessDenied, "pool %s is offered to tenant %s: only its owner enrols nodes in it", p.ID, tenantID).
			WithDetails(map[string]any{"reason": "offeredPool", "poolId": p.ID})
	}
	return p, nil
}

// createJoinToken makes a join token of the tenant's own, live pool whose
// nodes run bcd. The answer is the only place the token ever appears.
func (m methods) createJoinToken(ctx context.Context, c *rpc.Call, tx store.Tx, in CreateJoinTokenInput) (JoinToken, error) {
	ttl, maxUses := defaultJoinTokenTTL, defaultJoinTokenUses
	if in.TTLSeconds != nil {
		ttl = time.Duration(*in.TTLSeconds) * time.Second
	}
	if in.MaxUses != nil {
		maxUses = int(*in.MaxUses)
	}
	if _, err := ownPool(ctx, tx, c.TenantID, in.PoolID); err != nil {
		return JoinToken{}, err
	}
	p, err := pools.Live(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return JoinToken{}, err
	}
	if p.Agent != "bcd" {
		return JoinToken{}, core.Errorf(core.CodeInvalidState, "pool %s runs no node agent (agent %s): nodes do not join it", p.ID, p.Agent).
			WithDetails(map[string]any{"reason": "agent"})
	}
	tok, hash, err := domain.NewJoinTokenSecret()
	if err != nil {
		return JoinToken{}, err
	}
	t, err := domain.CreateJoinToken(ctx, tx, domain.NewJoinToken{TenantID: p.TenantID, PoolID: p.ID, Name: in.Name,
		Hash: hash, TTL: ttl, MaxUses: maxUses, CreatedBy: c.Caller.IdentityID})
	if err != nil {
		return JoinToken{}, err
	}
	out := joinTokenOf(t)
	out.Token = tok // shown once: this answer is the only place it exists
	out.JoinCommand = JoinCommand(m.d.PublicURL, tok)
	return out, nil
}

// approveJoinRequest admits a pending join: the node is made (or found by
// its hardware key), its inventory ingested, the stored CSR signed and the
// identity recorded; the certificate waits on the request for the agent's
// next poll. The pool must be live.
func (m methods) approveJoinRequest(ctx context.Context, c *rpc.Call, tx store.Tx, in JoinRequestInput) (JoinRequest, error) {
	if m.d.NodeCA == nil {
		return JoinRequest{}, core.Errorf(core.CodeUnavailable, "no node CA configured")
	}
	if _, err := ownPool(ctx, tx, c.TenantID, in.PoolID); err != nil {
		return JoinRequest{}, err
	}
	pool, err := pools.Live(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return JoinRequest{}, err
	}
	r, err := domain.GetJoinRequest(ctx, tx, c.TenantID, in.PoolID, in.JoinRequestID, true)
	if err != nil {
		return JoinRequest{}, err
	}
	if err := domain.JoinRequestPendingCheck(r); err != nil {
		return JoinRequest{}, err
	}
	cand, err := domain.CheckJoin("-", r.Name, r.Inventory, r.CSR)
	if err != nil {
		return JoinRequest{}, err
	}
	res, err := domain.Admit(ctx, tx, domain.TypesOf(m.d.Catalog), pool, cand, c.Caller.IdentityID, m.d.RootTenant, m.d.NodeCA.SignNode)
	if err != nil {
		return JoinRequest{}, err
	}
	r, err = domain.DecideJoinRequest(ctx, tx, c.TenantID, in.PoolID, in.JoinRequestID, domain.JoinRequestDecision{
		State: domain.JoinRequestApproved, NodeID: res.NodeID, Certificate: string(res.Certificate), DecidedBy: c.Caller.IdentityID})
	if err != nil {
		return JoinRequest{}, err
	}
	return joinRequestOf(r), nil
}

package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
)

var joinTokenPattern = regexp.MustCompile(`^bcjt_[a-z2-7]{52}$`)

// consumeJoinToken spends one use of token, as the join will.
func (e *env) consumeJoinToken(token string) (nodesdomain.JoinToken, error) {
	var jt nodesdomain.JoinToken
	err := e.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		jt, err = nodesdomain.ConsumeJoinToken(context.Background(), tx, token)
		return err
	})
	return jt, err
}

// joinTokenStates lists the pool's tokens as id → state.
func (e *env) joinTokenStates(tenant, poolID string) map[string]string {
	e.t.Helper()
	list, err := nodes.ListJoinTokens.Call(context.Background(), e.client(e.tokenOf(tenant)), nodes.ListJoinTokensInput{TenantID: tenant, PoolID: poolID})
	if err != nil {
		e.t.Fatalf("joinTokens.list: %v", err)
	}
	out := map[string]string{}
	for _, t := range list.Items {
		if t.Token != "" || t.JoinCommand != "" {
			e.t.Fatalf("list shows the secret of %s", t.ID)
		}
		out[t.ID] = t.State
	}
	return out
}

func TestJoinTokens(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.pool(e.boot.UserToken, "acme", s.ID, "train")

	// The defaults: 24 hours, one use.
	one, err := nodes.CreateJoinToken.Call(ctx, c, nodes.CreateJoinTokenInput{TenantID: "acme", PoolID: p.ID})
	if err != nil || !core.ValidID("jt", one.ID) || one.TenantID != "acme" || one.PoolID != p.ID || one.Name != "" ||
		!joinTokenPattern.MatchString(one.Token) || one.State != "active" || one.MaxUses != 1 || one.Uses != 0 ||
		one.ExpiresAt-one.CreatedAt != 24*3600*1000 || one.CreatedBy != e.boot.UserIdentityID || one.RevokedAt != nil {
		t.Fatalf("create = %+v, %v", one, err)
	}
	// The answer carries the command that joins a machine with it; this
	// server was given no public URL, so the shell fills it in.
	if want := `bcd node join --api "$BC_API_URL" --token ` + one.Token + " --state-dir " + nodes.JoinStateDir; one.JoinCommand != want {
		t.Fatalf("joinCommand = %q, want %q", one.JoinCommand, want)
	}
	many, err := nodes.CreateJoinToken.Call(ctx, c, nodes.CreateJoinTokenInput{TenantID: "acme", PoolID: p.ID, Name: "rack-7",
		TTLSeconds: new(int64(600)), MaxUses: new(int64(3))})
	if err != nil || many.Name != "rack-7" || many.MaxUses != 3 || many.ExpiresAt-many.CreatedAt != 600*1000 ||
		!joinTokenPattern.MatchString(many.Token) || many.Token == one.Token {
		t.Fatalf("create with options = %+v, %v", many, err)
	}
	// The bounds are inclusive.
	for _, in := range []nodes.CreateJoinTokenInput{{TTLSeconds: new(int64(60)), MaxUses: new(int64(10000))}, {TTLSeconds: new(int64(30 * 24 * 3600))}} {
		in.TenantID, in.PoolID = "acme", p.ID
		if _, err := nodes.CreateJoinToken.Call(ctx, c, in); err != nil {
			t.Fatalf("create %+v = %v", in, err)
		}
	}
	bound := e.joinTokenStates("acme", p.ID)
	for id := range bound {
		if id != one.ID && id != many.ID {
			if _, err := nodes.RevokeJoinToken.Call(ctx, c, nodes.JoinTokenInput{TenantID: "acme", PoolID: p.ID, TokenID: id}); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Shown once: the list never carries a secret, and the database holds
	// only SHA-256, nowhere the token in plain text.
	status, raw := e.call(e.boot.UserToken, "joinTokens.list", `{"tenantId":"acme","poolId":"`+p.ID+`"}`)
	if status != 200 || strings.Contains(raw, `"token"`) || strings.Contains(raw, one.Token) || strings.Contains(raw, many.Token) {
		t.Fatalf("list = %d %s", status, raw)
	}
	var dump string
	if err := e.store.Pool.QueryRow(ctx, `SELECT string_agg(row_to_json(t)::text, ' ') FROM join_tokens t`).Scan(&dump); err != nil {
		t.Fatal(err)
	}
	for _, plain := range []string{one.Token, many.Token} {
		if strings.Contains(dump, strings.TrimPrefix(plain, nodes.JoinTokenPrefix)) {
			t.Fatalf("join_tokens holds a token in plain text: %s", dump)
		}
		var hash []byte
		if err := e.store.Pool.QueryRow(ctx, `SELECT token_hash FROM join_tokens WHERE pool_id = $1 AND token_hash = $2`,
			p.ID, nodesdomain.HashJoinToken(plain)).Scan(&hash); err != nil {
			t.Fatalf("no row holds the token's hash: %v", err)
		}
		if sum := sha256.Sum256([]byte(plain)); string(hash) != string(sum[:]) {
			t.Fatalf("stored hash %x is not SHA-256 of the token", hash)
		}
	}
	var audits int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM audit_events WHERE method = 'joinTokens.create' AND resource_id = $1`, p.ID).Scan(&audits); err != nil || audits != 4 {
		t.Fatalf("%d joinTokens.create audit rows on the pool, %v", audits, err)
	}

	// Exhausted: the join spends uses; one past maxUses is refused.
	if _, err := e.consumeJoinToken(one.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := e.consumeJoinToken(one.Token); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("a second join with a one-use token = %v, want INVALID_STATE", err)
	}
	// Expired: its expiry is in the past.
	if _, err := e.store.Pool.Exec(ctx, `UPDATE join_tokens SET expires_at = now() - interval '1 second' WHERE id = $1`, many.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.consumeJoinToken(many.Token); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("a join with an expired token = %v, want INVALID_STATE", err)
	}
	states := e.joinTokenStates("acme", p.ID)
	if len(states) != 4 || states[one.ID] != "exhausted" || states[many.ID] != "expired" {
		t.Fatalf("states = %v", states)
	}
	list, err := nodes.ListJoinTokens.Call(ctx, c, nodes.ListJoinTokensInput{TenantID: "acme", PoolID: p.ID})
	if err != nil || list.Items[0].ID != one.ID || list.Items[0].Uses != 1 || list.Items[1].ID != many.ID {
		t.Fatalf("list = %+v, %v", list, err)
	}

	// Revoke, twice: the second answers the token as the first left it.
	fresh, err := nodes.CreateJoinToken.Call(ctx, c, nodes.CreateJoinTokenInput{TenantID: "acme", PoolID: p.ID, MaxUses: new(int64(5))})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := nodes.RevokeJoinToken.Call(ctx, c, nodes.JoinTokenInput{TenantID: "acme", PoolID: p.ID, TokenID: fresh.ID})
	if err != nil || rev.ID != fresh.ID || rev.State != "revoked" || rev.RevokedAt == nil || rev.Token != "" {
		t.Fatalf("revoke = %+v, %v", rev, err)
	}
	again, err := nodes.RevokeJoinToken.Call(ctx, c, nodes.JoinTokenInput{TenantID: "acme", PoolID: p.ID, TokenID: fresh.ID})
	if err != nil || again.RevokedAt == nil || *again.RevokedAt != *rev.RevokedAt || again.State != "revoked" {
		t.Fatalf("second revoke = %+v, %v", again, err)
	}
	if _, err := e.consumeJoinToken(fresh.Token); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("a join with a revoked token = %v, want INVALID_STATE", err)
	}
	if states := e.joinTokenStates("acme", p.ID); states[fresh.ID] != "revoked" {
		t.Fatalf("states after revoke = %v", states)
	}
	if _, err := nodes.RevokeJoinToken.Call(ctx, c, nodes.JoinTokenInput{TenantID: "acme", PoolID: p.ID, TokenID: core.NewID("jt")}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("revoke of a missing token = %v, want NOT_FOUND", err)
	}
	p2 := e.pool(e.boot.UserToken, "acme", s.ID, "infer")
	if _, err := nodes.RevokeJoinToken.Call(ctx, c, nodes.JoinTokenInput{TenantID: "acme", PoolID: p2.ID, TokenID: fresh.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("revoke through another pool = %v, want NOT_FOUND", err)
	}
	if l, err := nodes.ListJoinTokens.Call(ctx, c, nodes.ListJoinTokensInput{TenantID: "acme", PoolID: p2.ID}); err != nil || len(l.Items) != 0 {
		t.Fatalf("another pool's list = %+v, %v", l, err)
	}
	// An unknown token is UNAUTHENTICATED.
	if _, err := e.consumeJoinToken(nodes.JoinTokenPrefix + strings.Repeat("a", 52)); codeOf(err) != core.CodeUnauthn {
		t.Fatalf("an unknown token = %v, want UNAUTHENTICATED", err)
	}
}

// Join tokens are the pool's: a missing pool is NOT_FOUND; an archived
// pool takes no new token, yet lists and revokes its own; a pool whose
// nodes run no agent takes none.
func TestJoinTokensPoolState(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.pool(e.boot.UserToken, "acme", s.ID, "train")
	missing := core.NewID("pool")
	if _, err := nodes.CreateJoinToken.Call(ctx, c, nodes.CreateJoinTokenInput{TenantID: "acme", PoolID: missing}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("create on a missing pool = %v, want NOT_FOUND", err)
	}
	if _, err := nodes.ListJoinTokens.Call(ctx, c, nodes.ListJoinTokensInput{TenantID: "acme", PoolID: missing}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("list of a missing pool = %v, want NOT_FOUND", err)
	}
	if _, err := nodes.RevokeJoinToken.Call(ctx, c, nodes.JoinTokenInput{TenantID: "acme", PoolID: missing, TokenID: core.NewID("jt")}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("revoke on a missing pool = %v, want NOT_FOUND", err)
	}
	tok, err := nodes.CreateJoinToken.Call(ctx, c, nodes.CreateJoinTokenInput{TenantID: "acme", PoolID: p.ID, MaxUses: new(int64(2))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Archive.Call(ctx, c, pools.PoolInput{TenantID: "acme", PoolID: p.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.CreateJoinToken.Call(ctx, c, nodes.CreateJoinTokenInput{TenantID: "acme", PoolID: p.ID}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("create on an archived pool = %v, want INVALID_STATE", err)
	}
	if _, err := e.consumeJoinToken(tok.Token); codeOf(err) != core.CodeInvalidState ||
		core.AsError(err).Details["reason"] != nodesdomain.JoinTokenPoolArchived {
		t.Fatalf("a join into an archived pool = %v, want INVALID_STATE (poolArchived)", err)
	}
	if states := e.joinTokenStates("acme", p.ID); len(states) != 1 || states[tok.ID] != "active" {
		t.Fatalf("an archived pool's tokens = %v", states)
	}
	if rev, err := nodes.RevokeJoinToken.Call(ctx, c, nodes.JoinTokenInput{TenantID: "acme", PoolID: p.ID, TokenID: tok.ID}); err != nil || rev.State != "revoked" {
		t.Fatalf("revoke on an archived pool = %+v, %v", rev, err)
	}
	none, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: s.ID, Name: "bmc-only", Class: "metal-dedicated",
		GPUModel: "H100", GPUMemoryGb: 80, Agent: "none"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = nodes.CreateJoinToken.Call(ctx, c, nodes.CreateJoinTokenInput{TenantID: "acme", PoolID: none.ID})
	if codeOf(err) != core.CodeInvalidState || core.AsError(err).Details["reason"] != "agent" {
		t.Fatalf("create on an agent-less pool = %v, want INVALID_STATE (agent)", err)
	}
}

// Another tenant's pool is NOT_FOUND, offered or not (an offer lends
// capacity, not the pool); a foreign tenantId is ACCESS_DENIED before any
// query or decision; a person with no policy is ACCESS_DENIED.
func TestJoinTokensAcrossTenants(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, g := e.client(e.boot.UserToken), e.client(e.globex)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.pool(e.boot.UserToken, "acme", s.ID, "train")
	tok, err := nodes.CreateJoinToken.Call(ctx, a, nodes.CreateJoinTokenInput{TenantID: "acme", PoolID: p.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Get.Call(ctx, a, pools.PoolInput{TenantID: "acme", PoolID: p.ID}); err != nil { // the projection holds the pool's row
		t.Fatal(err)
	}
	wantNotFound := func(when string) {
		t.Helper()
		if _, err := nodes.CreateJoinToken.Call(ctx, g, nodes.CreateJoinTokenInput{TenantID: "globex", PoolID: p.ID}); codeOf(err) != core.CodeNotFound {
			t.Fatalf("%s: globex create on acme's pool = %v, want NOT_FOUND", when, err)
		}
		if _, err := nodes.ListJoinTokens.Call(ctx, g, nodes.ListJoinTokensInput{TenantID: "globex", PoolID: p.ID}); codeOf(err) != core.CodeNotFound {
			t.Fatalf("%s: globex list of acme's pool = %v, want NOT_FOUND", when, err)
		}
		if _, err := nodes.RevokeJoinToken.Call(ctx, g, nodes.JoinTokenInput{TenantID: "globex", PoolID: p.ID, TokenID: tok.ID}); codeOf(err) != core.CodeNotFound {
			t.Fatalf("%s: globex revoke on acme's pool = %v, want NOT_FOUND", when, err)
		}
	}
	wantNotFound("not offered")
	if _, err := pools.Offer.Call(ctx, a, pools.OfferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex",
		Quota: map[string]int64{"gpu": 8}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Get.Call(ctx, g, pools.PoolInput{TenantID: "globex", PoolID: p.ID}); err != nil { // offered: in globex's view
		t.Fatal(err)
	}
	// Offered: the pool is in globex's view, so the refusal says so.
	wantDenied := func(what string, err error) {
		t.Helper()
		if ce := core.AsError(err); ce.Code != core.CodeAccessDenied || ce.Details["reason"] != "offeredPool" {
			t.Fatalf("globex %s on the pool offered to it = %v, want ACCESS_DENIED offeredPool", what, err)
		}
	}
	_, err = nodes.CreateJoinToken.Call(ctx, g, nodes.CreateJoinTokenInput{TenantID: "globex", PoolID: p.ID})
	wantDenied("joinTokens.create", err)
	_, err = nodes.ListJoinTokens.Call(ctx, g, nodes.ListJoinTokensInput{TenantID: "globex", PoolID: p.ID})
	wantDenied("joinTokens.list", err)
	_, err = nodes.RevokeJoinToken.Call(ctx, g, nodes.JoinTokenInput{TenantID: "globex", PoolID: p.ID, TokenID: tok.ID})
	wantDenied("joinTokens.revoke", err)
	_, err = nodes.ListJoinRequests.Call(ctx, g, nodes.ListJoinRequestsInput{TenantID: "globex", PoolID: p.ID})
	wantDenied("joinRequests.list", err)
	if n := e.count(`SELECT count(*) FROM join_tokens WHERE tenant_id <> 'acme' OR revoked_at IS NOT NULL`); n != 0 {
		t.Fatalf("globex changed %d join tokens", n)
	}

	if _, err := api.SystemWhoami.Call(ctx, g, rpc.NoInput{}); err != nil { // warm the authentication cache
		t.Fatal(err)
	}
	for method, body := range map[string]string{
		"joinTokens.create": `{"tenantId":"acme","poolId":"` + p.ID + `"}`,
		"joinTokens.list":   `{"tenantId":"acme","poolId":"` + p.ID + `"}`,
		"joinTokens.revoke": `{"tenantId":"acme","poolId":"` + p.ID + `","tokenId":"` + tok.ID + `"}`,
	} {
		e.outer.reset()
		e.queries.n.Store(0)
		status, out := e.call(e.globex, method, body)
		if status != 403 || !strings.Contains(out, "ACCESS_DENIED") {
			t.Fatalf("foreign %s = %d %s", method, status, out)
		}
		if a, d, q := e.outer.authenticate.Load(), e.outer.decisions(), e.queries.n.Load(); a != 1 || d != 0 || q != 0 {
			t.Fatalf("foreign %s cost %d authenticate, %d decisions, %d queries; want 1, 0, 0", method, a, d, q)
		}
		if status, out := e.call(e.stranger, method, body); status != 403 || !strings.Contains(out, "ACCESS_DENIED") {
			t.Fatalf("%s by a person with no policy = %d %s", method, status, out)
		}
	}
}

func TestJoinTokensInvalidInput(t *testing.T) {
	e := newEnv(t)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.pool(e.boot.UserToken, "acme", s.ID, "train")
	ok := `"tenantId":"acme","poolId":"` + p.ID + `"`
	// The schema's checks (before any decision) and the handler's ranges.
	e.wantInvalid(e.boot.UserToken, "joinTokens.create", map[string]string{
		`{"tenantId":"acme"}`:                                    "poolId",
		`{"tenantId":"acme","poolId":"site_x"}`:                  "poolId",
		`{` + ok + `,"token":"bcjt_x"}`:                          "token",
		`{` + ok + `,"name":"` + strings.Repeat("n", 129) + `"}`: "name",
		`{` + ok + `,"ttlSeconds":"3600"}`:                       "ttlSeconds",
		`{` + ok + `,"ttlSeconds":1.5}`:                          "ttlSeconds",
		`{` + ok + `,"ttlSeconds":59}`:                           "ttlSeconds",
		`{` + ok + `,"ttlSeconds":0}`:                            "ttlSeconds",
		`{` + ok + `,"ttlSeconds":-60}`:                          "ttlSeconds",
		`{` + ok + `,"ttlSeconds":2592001}`:                      "ttlSeconds",
		`{` + ok + `,"maxUses":0}`:                               "maxUses",
		`{` + ok + `,"maxUses":-1}`:                              "maxUses",
		`{` + ok + `,"maxUses":10001}`:                           "maxUses",
		`{` + ok + `,"maxUses":true}`:                            "maxUses",
	})
	e.wantInvalid(e.boot.UserToken, "joinTokens.list", map[string]string{
		`{"tenantId":"acme"}`:           "poolId", // the decision is on the pool
		`{` + ok + `,"state":"active"}`: "state",
	})
	e.wantInvalid(e.boot.UserToken, "joinTokens.revoke", map[string]string{
		`{` + ok + `}`:                         "tokenId",
		`{` + ok + `,"tokenId":"stok_x"}`:      "tokenId",
		`{"tenantId":"acme","tokenId":"jt_x"}`: "poolId",
	})
	// Nothing was made.
	if n := e.count(`SELECT count(*) FROM join_tokens`); n != 0 {
		t.Fatalf("%d join tokens after invalid input", n)
	}
	// The out-of-range answer says the bound it crossed.
	status, out := e.call(e.boot.UserToken, "joinTokens.create", `{`+ok+`,"ttlSeconds":59}`)
	var body struct {
		Error core.Error `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &body); err != nil || status != 400 || body.Error.Details["reason"] != "range" ||
		!strings.Contains(body.Error.Message, "want 60") {
		t.Fatalf("ttlSeconds 59 = %d %s", status, out)
	}
}

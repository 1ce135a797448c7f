package api_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/sites"
	sitedomain "github.com/better-compute/better-compute/store/sites"
)

// siteAgentServer is an API on e's database that tells site agents where
// Temporal is (lease ttl one minute), or not at all without temporal.
func siteAgentServer(t *testing.T, e *env, temporal bool) string {
	t.Helper()
	deps := agentgateway.Deps{Store: e.store, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), SiteLease: time.Minute}
	if temporal {
		deps.TemporalAddress, deps.TemporalNamespace = "127.0.0.1:7233", "better-compute"
	}
	gw, err := agentgateway.New(deps)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Deps{Store: e.store, Logger: deps.Logger, Routes: gw})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return hs.URL
}

func postAgent(t *testing.T, base, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

func TestAgentSite(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	tok, err := sites.CreateToken.Call(ctx, c, sites.CreateTokenInput{TenantID: "acme", SiteID: s.ID, Name: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	revoked, err := sites.CreateToken.Call(ctx, c, sites.CreateTokenInput{TenantID: "acme", SiteID: s.ID, Name: "old"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sites.RevokeToken.Call(ctx, c, sites.RevokeTokenInput{TenantID: "acme", SiteID: s.ID, TokenID: revoked.ID}); err != nil {
		t.Fatal(err)
	}
	gone := e.site(e.boot.UserToken, "acme", "fra-gone", "custom")
	goneTok, err := sites.CreateToken.Call(ctx, c, sites.CreateTokenInput{TenantID: "acme", SiteID: gone.ID, Name: ""})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sites.Delete.Call(ctx, c, sites.SiteInput{TenantID: "acme", SiteID: gone.ID}); err != nil {
		t.Fatal(err)
	}
	base := siteAgentServer(t, e, true)
	lease := "site:" + s.ID + ":boot"
	reg := func(token, holder string) string { return `{"token":"` + token + `","holder":"` + holder + `"}` }
	renew := func(token, holder, epoch string) string {
		return `{"token":"` + token + `","holder":"` + holder + `","epoch":` + epoch + `}`
	}
	expire := func() {
		if _, err := e.store.Pool.Exec(ctx, `UPDATE leases SET expires_at = now() - interval '1 second' WHERE name = $1`, lease); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name, path, body string
		before           func()
		status           int
		code             string
		epoch            int64 // on 200
	}{
		{"a registers and takes the lease", protocol.SiteRegisterPath, reg(tok.Token, "a"), nil, 200, "", 1},
		{"b is refused while a holds it", protocol.SiteRegisterPath, reg(tok.Token, "b"), nil, 409, "CONFLICT", 0},
		{"a registering again keeps its epoch", protocol.SiteRegisterPath, reg(tok.Token, "a"), nil, 200, "", 1},
		{"a renews", protocol.SiteRenewPath, renew(tok.Token, "a", "1"), nil, 200, "", 1},
		{"a stale epoch is lost", protocol.SiteRenewPath, renew(tok.Token, "a", "7"), nil, 409, "CONFLICT", 0},
		{"b cannot renew a's lease", protocol.SiteRenewPath, renew(tok.Token, "b", "1"), nil, 409, "CONFLICT", 0},
		{"b takes over once it expired", protocol.SiteRegisterPath, reg(tok.Token, "b"), expire, 200, "", 2},
		{"a has lost it", protocol.SiteRenewPath, renew(tok.Token, "a", "1"), nil, 409, "CONFLICT", 0},
		{"an unknown token", protocol.SiteRegisterPath, reg(sitedomain.TokenPrefix+"nope", "a"), nil, 401, "UNAUTHENTICATED", 0},
		{"no token", protocol.SiteRegisterPath, reg("", "a"), nil, 401, "UNAUTHENTICATED", 0},
		{"a revoked token", protocol.SiteRegisterPath, reg(revoked.Token, "a"), nil, 401, "UNAUTHENTICATED", 0},
		{"a revoked token renewing", protocol.SiteRenewPath, renew(revoked.Token, "b", "2"), nil, 401, "UNAUTHENTICATED", 0},
		{"a deleted site's token", protocol.SiteRegisterPath, reg(goneTok.Token, "a"), nil, 401, "UNAUTHENTICATED", 0},
		{"no holder", protocol.SiteRegisterPath, reg(tok.Token, ""), nil, 400, "INVALID_INPUT", 0},
		{"a holder with spaces", protocol.SiteRegisterPath, reg(tok.Token, "a b"), nil, 400, "INVALID_INPUT", 0},
		{"no epoch", protocol.SiteRenewPath, reg(tok.Token, "b"), nil, 400, "INVALID_INPUT", 0},
		{"an unknown field", protocol.SiteRegisterPath, `{"token":"x","holder":"a","x":1}`, nil, 400, "INVALID_INPUT", 0},
	}
	for _, st := range steps {
		if st.before != nil {
			st.before()
		}
		status, body := postAgent(t, base, st.path, st.body)
		if status != st.status || (st.code != "" && !strings.Contains(body, `"`+st.code+`"`)) {
			t.Fatalf("%s: = %d %s, want %d %s", st.name, status, body, st.status, st.code)
		}
		for _, secret := range []string{tok.Token, revoked.Token, goneTok.Token} {
			if strings.Contains(body, secret) {
				t.Fatalf("%s: the answer holds a token: %s", st.name, body)
			}
		}
		if st.code == "CONFLICT" && (strings.Contains(body, `"a"`) || strings.Contains(body, `"b"`)) {
			t.Fatalf("%s: the refusal names a holder: %s", st.name, body)
		}
		if status != 200 {
			continue
		}
		var out protocol.SiteResult
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatal(err)
		}
		if out.SiteID != s.ID || out.TaskQueue != "site-"+s.ID || out.Temporal.Address != "127.0.0.1:7233" ||
			out.Temporal.Namespace != "better-compute" || out.Lease.Name != lease || out.Lease.Epoch != st.epoch ||
			out.Lease.TTLMs != 60000 || out.Lease.ExpiresAt <= time.Now().Add(-time.Minute).UnixMilli() {
			t.Fatalf("%s: = %+v, want epoch %d", st.name, out, st.epoch)
		}
	}
	// The agents are recorded (each also a site node: agentsite_node_test.go), and no row holds a token.
	var dump string
	if err := e.store.Pool.QueryRow(ctx, `SELECT string_agg(row_to_json(t)::text, ' ' ORDER BY holder) FROM site_agents t WHERE site_id = $1`, s.ID).Scan(&dump); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(dump, `"holder":"a"`) || !strings.Contains(dump, `"holder":"b"`) || !strings.Contains(dump, tok.ID) ||
		strings.Contains(dump, strings.TrimPrefix(tok.Token, sitedomain.TokenPrefix)) {
		t.Fatalf("site_agents = %s", dump)
	}

	// Without Temporal configured, registering is UNAVAILABLE.
	if status, body := postAgent(t, siteAgentServer(t, e, false), protocol.SiteRegisterPath, reg(tok.Token, "c")); status != 503 || !strings.Contains(body, `"UNAVAILABLE"`) {
		t.Fatalf("register without Temporal = %d %s", status, body)
	}
}

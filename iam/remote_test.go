package iam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam/policies"
)

// remoteEnv is an IAM host (HostHandler over a CachingPort over the
// embedded IAM, on a real PostgreSQL) behind httptest, and a RemotePort to it.
type remoteEnv struct {
	*embTestEnv
	host   *CachingPort
	srv    *httptest.Server
	remote Port
}

func newRemoteEnv(t testing.TB, cfg HostConfig) *remoteEnv {
	t.Helper()
	env := &remoteEnv{embTestEnv: newEmbTestEnv(t)}
	if cfg.Port == nil {
		env.host = NewCachingPort(env.iam, CacheOptions{})
		cfg.Port = env.host.Port()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h, err := HostHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	env.srv = httptest.NewServer(h)
	t.Cleanup(env.srv.Close)
	env.remote, err = NewRemotePort(RemoteConfig{BaseURL: env.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// acme: the example policies, alice a user of pool_1, bob nobody's user;
// rsv_ok may be reserved, rsv_big not (9 GPUs), rsv_absent does not exist.
func (env *remoteEnv) acme() (alice, bob CreatedToken) {
	env.t.Helper()
	env.tenant("acme")
	for _, ex := range policies.All() {
		env.policy("acme", ex.Name, ex.Cedar)
	}
	a := env.identity("acme", KindPerson, "alice", false)
	b := env.identity("acme", KindPerson, "bob", false)
	env.relate(a, "user", "compute-pool", "pool_1")
	env.resolver.put(embReservation("rsv_ok", a.ID,
		map[string]any{"gpuModel": "H100", "gpuCount": float64(8), "durationHours": float64(72)}))
	env.resolver.put(embReservation("rsv_big", a.ID,
		map[string]any{"gpuModel": "H100", "gpuCount": float64(9), "durationHours": float64(72)}))
	return env.token(a, SessionUser, false), env.token(b, SessionUser, false)
}

func bearer(tok CreatedToken) Credential {
	return Credential{Authorization: "Bearer " + tok.Token, SourceIP: "10.1.2.3", RequestID: "req-auth",
		Origin: "https://console.example", UserAgent: "test-agent/1"}
}

func reserve(c *Caller, id, requestID string) Request {
	return Request{Caller: c, TenantID: "acme", Action: "compute:reservations:create",
		Resource: Resource{Type: "compute-reservation", ID: id}, RequestID: requestID}
}

// sameCaller compares two Callers, less the remote port's kept credential.
func sameCaller(a, b *Caller) bool {
	x, y := *a, *b
	x.credential, y.credential = nil, nil
	return x == y
}

func TestRemoteMatchesEmbedded(t *testing.T) {
	env := newRemoteEnv(t, HostConfig{})
	ctx := env.ctx
	aliceTok, bobTok := env.acme()

	// Authentication, with every credential form of the embedded tests.
	unknown := "bc_" + strings.Repeat("a", 52)
	creds := map[string]Credential{
		"bearer":                         bearer(aliceTok),
		"cookie value":                   {Cookie: aliceTok.Token, SourceIP: "10.9.9.9"},
		"cookie header":                  {Cookie: "theme=dark; " + SessionCookie + "=" + aliceTok.Token},
		"another scheme, then cookie":    {Authorization: "Basic Zm9vOmJhcg==", Cookie: aliceTok.Token},
		"a bad bearer, no cookie":        {Authorization: "Bearer " + unknown, Cookie: aliceTok.Token},
		"unknown token":                  {Authorization: "Bearer " + unknown},
		"malformed token":                {Authorization: "Bearer nope"},
		"a control character":            {Authorization: "Bearer bc_\x01"},
		"cookie header without bc_sess.": {Cookie: "theme=dark"},
		"nothing":                        {SourceIP: "10.1.2.3"},
	}
	for name, cred := range creds {
		want, wantErr := env.iam.Authenticate(ctx, cred)
		got, gotErr := env.remote.Authenticate(ctx, cred)
		if embCode(gotErr) != embCode(wantErr) {
			t.Fatalf("%s: remote Authenticate error %v; embedded %v", name, gotErr, wantErr)
		}
		if wantErr == nil && !sameCaller(got, want) {
			t.Fatalf("%s: remote Caller %+v; embedded %+v", name, *got, *want)
		}
		if wantErr != nil && embCode(wantErr) != core.CodeUnauthn {
			t.Fatalf("%s: embedded %v", name, wantErr)
		}
	}

	cred := bearer(aliceTok)
	eAlice, err := env.iam.Authenticate(ctx, cred)
	if err != nil {
		t.Fatal(err)
	}
	rAlice, err := env.remote.Authenticate(ctx, cred)
	if err != nil {
		t.Fatal(err)
	}
	if rAlice.SourceIP != "10.1.2.3" {
		t.Fatalf("SourceIP %q", rAlice.SourceIP)
	}
	eBob, _ := env.iam.Authenticate(ctx, bearer(bobTok))
	rBob, _ := env.remote.Authenticate(ctx, bearer(bobTok))

	// Authorize and Require: allow, deny, tenant mismatch, unknown action,
	// NOT_FOUND.
	other := func(c *Caller, id string) Request {
		r := reserve(c, id, "req-x")
		r.TenantID = "tnt-other"
		return r
	}
	unknownAction := func(c *Caller, id string) Request {
		r := reserve(c, id, "req-y")
		r.Action = "compute:nope:nope"
		return r
	}
	cases := []struct {
		name string
		req  func(*Caller) Request
	}{
		{"allow", func(c *Caller) Request { return reserve(c, "rsv_ok", "req-1") }},
		{"deny", func(c *Caller) Request { return reserve(c, "rsv_big", "req-2") }},
		{"tenant mismatch", func(c *Caller) Request { return other(c, "rsv_ok") }},
		{"unknown action", func(c *Caller) Request { return unknownAction(c, "rsv_ok") }},
		{"not found", func(c *Caller) Request { return reserve(c, "rsv_absent", "req-3") }},
		{"no tenant", func(c *Caller) Request { r := reserve(c, "rsv_ok", ""); r.TenantID = ""; return r }},
		{"bad context", func(c *Caller) Request {
			r := reserve(c, "rsv_ok", "")
			r.Context = map[string]any{"when": struct{ X int }{1}}
			return r
		}},
	}
	for _, tc := range cases {
		for _, who := range []struct {
			name string
			e, r *Caller
		}{{"alice", eAlice, rAlice}, {"bob", eBob, rBob}} {
			name := tc.name + "/" + who.name
			wd, werr := env.iam.Authorize(ctx, tc.req(who.e))
			gd, gerr := env.remote.Authorize(ctx, tc.req(who.r))
			if embCode(gerr) != embCode(werr) || gd != wd {
				t.Fatalf("%s: remote Authorize %+v, %v; embedded %+v, %v", name, gd, gerr, wd, werr)
			}
			werr = env.iam.Require(ctx, tc.req(who.e))
			gerr = env.remote.Require(ctx, tc.req(who.r))
			if embCode(gerr) != embCode(werr) {
				t.Fatalf("%s: remote Require %v; embedded %v", name, gerr, werr)
			}
			if werr != nil && embCode(werr) == core.CodeAccessDenied && gerr.Error() != werr.Error() {
				t.Fatalf("%s: remote denial %q; embedded %q (denials are opaque)", name, gerr, werr)
			}
		}
	}
	if d, err := env.remote.Authorize(ctx, reserve(rAlice, "rsv_ok", "")); err != nil || !d.Allowed {
		t.Fatalf("alice rsv_ok: %+v, %v", d, err)
	}
	if err := env.remote.Require(ctx, reserve(rAlice, "rsv_big", "")); !errors.Is(err, core.ErrAccessDenied) {
		t.Fatalf("alice rsv_big: %v", err)
	}
	if _, err := env.remote.Authorize(ctx, reserve(rAlice, "rsv_absent", "")); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("rsv_absent: %v", err)
	}

	// The request id of a decision reaches IAM's audit chain.
	if err := env.remote.Require(ctx, reserve(rAlice, "rsv_big", "req-audited")); err == nil {
		t.Fatal("allowed")
	}
	ds := env.decisions("acme")
	if last := ds[len(ds)-1]; last.RequestID != "req-audited" || last.ResourceID != "rsv_big" {
		t.Fatalf("last audited decision %+v", last)
	}

	// AuthorizeMany: in order, across callers, and NOT_FOUND aborts the batch.
	batch := func(a, b *Caller, ids ...string) []Request {
		var out []Request
		for i, id := range ids {
			c := a
			if i%2 == 1 {
				c = b
			}
			out = append(out, reserve(c, id, fmt.Sprintf("req-b%d", i)))
		}
		return out
	}
	for _, ids := range [][]string{
		{"rsv_ok", "rsv_ok", "rsv_big", "rsv_big", "rsv_ok"},
		{"rsv_ok", "rsv_ok", "rsv_absent", "rsv_ok"},
		{},
	} {
		wd, werr := env.iam.AuthorizeMany(ctx, batch(eAlice, eBob, ids...))
		gd, gerr := env.remote.AuthorizeMany(ctx, batch(rAlice, rBob, ids...))
		if embCode(gerr) != embCode(werr) || !slices.Equal(gd, wd) {
			t.Fatalf("%v: remote AuthorizeMany %+v, %v; embedded %+v, %v", ids, gd, gerr, wd, werr)
		}
		if slices.Contains(ids, "rsv_absent") && !errors.Is(gerr, core.ErrNotFound) {
			t.Fatalf("%v: %v, want NOT_FOUND", ids, gerr)
		}
	}
	big := make([]Request, MaxBatch+1)
	for i := range big {
		big[i] = reserve(rAlice, "rsv_ok", "")
	}
	if _, err := env.remote.AuthorizeMany(ctx, big); !errors.Is(err, core.ErrInvalidInput) {
		t.Fatalf("%d requests: %v", len(big), err)
	}

	// A Caller the remote port did not make has no credential to forward.
	if _, err := env.remote.Authorize(ctx, reserve(eAlice, "rsv_ok", "")); !errors.Is(err, core.ErrUnauthn) {
		t.Fatalf("an embedded Caller through the remote port: %v", err)
	}
	if err := env.remote.Require(ctx, Request{TenantID: "acme"}); !errors.Is(err, core.ErrUnauthn) {
		t.Fatalf("no Caller: %v", err)
	}
	if _, err := env.remote.AuthorizeMany(ctx, []Request{reserve(rAlice, "rsv_ok", ""), reserve(nil, "rsv_ok", "")}); !errors.Is(err, core.ErrUnauthn) {
		t.Fatalf("a batch with no Caller: %v", err)
	}

	// A revoked session: the host authenticates again (from its cache) and
	// the decision itself sees the revocation, as the embedded port does.
	if _, err := env.admin.RevokeToken(ctx, SessionRef{TenantID: "acme", SessionID: aliceTok.Session.ID}); err != nil {
		t.Fatal(err)
	}
	// (Require: the host's read-allow cache would answer Authorize for 10 s
	// unless IAM events drop it, FollowEvents, as on any CachingPort.)
	werr := env.iam.Require(ctx, reserve(eAlice, "rsv_ok", ""))
	gerr := env.remote.Require(ctx, reserve(rAlice, "rsv_ok", ""))
	if !errors.Is(gerr, core.ErrAccessDenied) || embCode(werr) != embCode(gerr) {
		t.Fatalf("revoked: remote %v; embedded %v", gerr, werr)
	}
	if ds := env.decisions("acme"); ds[len(ds)-1].Reason != ReasonPrincipalInactive {
		t.Fatalf("last audited decision %+v", ds[len(ds)-1])
	}
	if _, err := env.remote.Authenticate(ctx, bearer(aliceTok)); err != nil {
		// The host's authentication cache still holds alice (30 s), as
		// the API's own would; the decision above denies regardless.
		t.Fatalf("re-authenticating from the host's cache: %v", err)
	}
	// Once the host's cache hears of the revocation (FollowEvents), the
	// host no longer authenticates the forwarded credential at all.
	env.host.ApplyEvent("session:" + aliceTok.Session.ID)
	if _, err := env.remote.Authorize(ctx, reserve(rAlice, "rsv_ok", "")); !errors.Is(err, core.ErrUnauthn) {
		t.Fatalf("revoked, after the host's cache dropped it: %v", err)
	}
	if _, err := env.remote.Authenticate(ctx, bearer(aliceTok)); !errors.Is(err, core.ErrUnauthn) {
		t.Fatalf("revoked token after the host's cache dropped it: %v", err)
	}
}

// TestRemoteSourceIPPolicy: a policy on context.sourceIp is decided on
// Credential.SourceIP (the Caller's SourceIP) only.
func TestRemoteSourceIPPolicy(t *testing.T) {
	env := newRemoteEnv(t, HostConfig{})
	ctx := env.ctx
	env.tenant("acme")
	env.policy("acme", "office-only", `permit (principal, action, resource) when { context.sourceIp.isInRange(ip("10.0.0.0/8")) };`)
	alice := env.identity("acme", KindPerson, "alice", false)
	tok := env.token(alice, SessionUser, false)
	env.resolver.put(embReservation("rsv_1", alice.ID, nil))

	for _, tc := range []struct {
		ip    string
		allow bool
	}{{"10.1.2.3", true}, {"192.168.1.1", false}, {"", false}, {"10.0.0.1, 192.168.1.1", false}, {"::ffff:10.0.0.1", false}} {
		cred := Credential{Authorization: "Bearer " + tok.Token, SourceIP: tc.ip}
		ec, err := env.iam.Authenticate(ctx, cred)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := env.remote.Authenticate(ctx, cred)
		if err != nil {
			t.Fatal(err)
		}
		// Require: the host's CachingPort never caches a mutation's
		// decision (a read allow is cached per session, resource and action,
		// whatever the address: see the report).
		werr := env.iam.Require(ctx, reserve(ec, "rsv_1", ""))
		gerr := env.remote.Require(ctx, reserve(rc, "rsv_1", ""))
		if embCode(gerr) != embCode(werr) {
			t.Fatalf("source %q: remote %v; embedded %v", tc.ip, gerr, werr)
		}
		if (gerr == nil) != tc.allow && tc.ip != "::ffff:10.0.0.1" {
			t.Fatalf("source %q: %v, want allowed %v", tc.ip, gerr, tc.allow)
		}
	}

	// One Caller, another request's address: the decision follows the
	// Caller's SourceIP, not the address it authenticated from.
	rc, err := env.remote.Authenticate(ctx, Credential{Authorization: "Bearer " + tok.Token, SourceIP: "10.1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	moved := *rc
	moved.SourceIP = "203.0.113.9"
	if err := env.remote.Require(ctx, reserve(&moved, "rsv_1", "")); !errors.Is(err, core.ErrAccessDenied) {
		t.Fatalf("moved caller: %v", err)
	}
	if err := env.remote.Require(ctx, reserve(rc, "rsv_1", "")); err != nil {
		t.Fatalf("the caller from its own address: %v", err)
	}

	// The host reads X-Forwarded-For only when it is one address: a list
	// (a proxy appended to it) or two headers give no address.
	post := func(xff ...string) bool {
		body := `{"tenantId":"acme","action":"compute:reservations:create","resource":{"type":"compute-reservation","id":"rsv_1"}}`
		req, _ := http.NewRequest(http.MethodPost, env.srv.URL+HostPathRequire, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok.Token)
		for _, v := range xff {
			req.Header.Add("X-Forwarded-For", v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusForbidden {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp.StatusCode == http.StatusOK
	}
	if !post("10.0.0.1") {
		t.Fatal("one address in range: denied")
	}
	if post("10.0.0.1, 192.168.1.1") || post("10.0.0.1", "10.0.0.2") || post("nope") || post() {
		t.Fatal("a forwarded list decided with an address")
	}
}

// recordingHost answers the protocol with canned answers and records the
// headers and bodies of the requests it gets.
type recordingHost struct {
	mu    sync.Mutex
	reqs  []recorded
	srv   *httptest.Server
	reply func(w http.ResponseWriter, r *http.Request) // optional: replaces the canned answers
}

type recorded struct {
	path   string
	header http.Header
	body   string
}

func newRecordingHost(t *testing.T) *recordingHost {
	h := &recordingHost{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.reqs = append(h.reqs, recorded{path: r.URL.Path, header: r.Header.Clone(), body: string(body)})
		reply := h.reply
		h.mu.Unlock()
		if reply != nil {
			reply(w, r)
			return
		}
		switch r.URL.Path {
		case HostPathAuthenticate:
			hostWriteJSON(w, 200, Caller{TenantID: "acme", IdentityID: "idn_1", IdentityKind: KindPerson,
				SessionID: "ses_1", SessionKind: SessionUser})
		case HostPathAuthorize:
			hostWriteJSON(w, 200, Decision{Allowed: true, Reason: ReasonAllow})
		case HostPathRequire, HostPathRefresh:
			hostWriteJSON(w, 200, wireOK{OK: true})
		case HostPathAuthorizeMany:
			var in wireBatch
			_ = json.Unmarshal(body, &in)
			ds := make([]Decision, len(in.Requests))
			hostWriteJSON(w, 200, wireDecisions{Decisions: ds})
		}
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *recordingHost) last(t *testing.T) recorded {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.reqs) == 0 {
		t.Fatal("the host got no request")
	}
	return h.reqs[len(h.reqs)-1]
}

func (h *recordingHost) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.reqs)
}

// transportHeaders are the headers net/http adds on its own.
var transportHeaders = []string{"Accept-Encoding", "Content-Length", "Content-Type"}

// expectHeaders checks that got holds exactly want (and what the transport
// adds).
func expectHeaders(t *testing.T, what string, got http.Header, want map[string]string) {
	t.Helper()
	for k := range got {
		if _, ok := want[k]; !ok && !slices.Contains(transportHeaders, k) {
			t.Errorf("%s: the host got %s: %q", what, k, got.Values(k))
		}
	}
	for k, v := range want {
		if vs := got.Values(k); len(vs) != 1 || vs[0] != v {
			t.Errorf("%s: %s = %q, want %q", what, k, vs, v)
		}
	}
}

func TestRemoteForwardsOnlyCredentialHeaders(t *testing.T) {
	ctx := context.Background()
	host := newRecordingHost(t)
	port, err := NewRemotePort(RemoteConfig{BaseURL: host.srv.URL})
	if err != nil {
		t.Fatal(err)
	}

	// A bearer: no cookie; the source address as the one X-Forwarded-For.
	full := Credential{Authorization: "Bearer bc_tok", Cookie: "bc_cookie", SourceIP: "198.51.100.7",
		RequestID: "req-1", Origin: "https://console.example", UserAgent: "agent/1"}
	c, err := port.Authenticate(ctx, full)
	if err != nil {
		t.Fatal(err)
	}
	got := host.last(t)
	if got.path != HostPathAuthenticate || got.body != "" {
		t.Fatalf("authenticate: %s %q", got.path, got.body)
	}
	expectHeaders(t, "bearer", got.header, map[string]string{"Authorization": "Bearer bc_tok",
		"Origin": "https://console.example", "User-Agent": "agent/1", "X-Request-Id": "req-1",
		"X-Forwarded-For": "198.51.100.7"})
	if c.SourceIP != "198.51.100.7" || c.IdentityID != "idn_1" {
		t.Fatalf("caller %+v", *c)
	}

	// A decision forwards the Caller's credential, its SourceIP and the
	// request's id; the body carries the request and no identity.
	c.SourceIP = "2001:db8::1"
	if _, err := port.Authorize(ctx, Request{Caller: c, TenantID: "acme", Action: "compute:pools:read",
		Resource: Resource{Type: "compute-pool", ID: "pool_1"}, Context: map[string]any{"n": 3}, RequestID: "req-2"}); err != nil {
		t.Fatal(err)
	}
	got = host.last(t)
	expectHeaders(t, "decision", got.header, map[string]string{"Authorization": "Bearer bc_tok",
		"Origin": "https://console.example", "User-Agent": "agent/1", "X-Request-Id": "req-2",
		"X-Forwarded-For": "2001:db8::1"})
	var body map[string]any
	if err := json.Unmarshal([]byte(got.body), &body); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range body {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"action", "context", "requestId", "resource", "tenantId"}) {
		t.Fatalf("decision body %s", got.body)
	}

	// A cookie only: just bc_session, whatever else the Cookie header held;
	// no source address: no X-Forwarded-For; no User-Agent: none (not Go's).
	if _, err := port.Authenticate(ctx, Credential{Cookie: "theme=dark; bc_session=bc_cookie; other=1"}); err != nil {
		t.Fatal(err)
	}
	expectHeaders(t, "cookie", host.last(t).header, map[string]string{"Cookie": "bc_session=bc_cookie"})
	if _, err := port.Authenticate(ctx, Credential{Authorization: "Basic Zm9v", Cookie: "bc_cookie"}); err != nil {
		t.Fatal(err)
	}
	expectHeaders(t, "another scheme", host.last(t).header, map[string]string{"Authorization": "Basic Zm9v", "Cookie": "bc_session=bc_cookie"})

	// A source address that is not an IP address is not sent.
	if _, err := port.Authenticate(ctx, Credential{Authorization: "Bearer bc_tok", SourceIP: "10.0.0.1, 192.0.2.1"}); err != nil {
		t.Fatal(err)
	}
	expectHeaders(t, "bad address", host.last(t).header, map[string]string{"Authorization": "Bearer bc_tok"})

	// No credential, or none that can travel: refused without a call.
	n := host.count()
	for _, cred := range []Credential{{}, {SourceIP: "10.0.0.1"}, {Cookie: "theme=dark"}, {Authorization: "Bearer x\ny"}} {
		if _, err := port.Authenticate(ctx, cred); !errors.Is(err, core.ErrUnauthn) {
			t.Fatalf("%+v: %v", cred, err)
		}
	}
	if host.count() != n {
		t.Fatal("a call without a credential reached the host")
	}

	// An API server in front: the client's own forwarding headers are on
	// its request, which the port never sees. The API builds the Credential
	// from the socket's peer (as api/server.go does).
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer := r.RemoteAddr[:strings.LastIndexByte(r.RemoteAddr, ':')]
		cred := Credential{Authorization: r.Header.Get("Authorization"), SourceIP: strings.Trim(peer, "[]"),
			RequestID: r.Header.Get("X-Request-Id"), Origin: r.Header.Get("Origin"), UserAgent: r.Header.Get("User-Agent")}
		if _, err := port.Authenticate(r.Context(), cred); err != nil {
			http.Error(w, err.Error(), 500)
		}
	}))
	defer front.Close()
	req, _ := http.NewRequest(http.MethodPost, front.URL, nil)
	req.Header.Set("Authorization", "Bearer bc_tok")
	req.Header.Set("User-Agent", "client/1")
	req.Header.Set("X-Forwarded-For", "10.0.0.1")
	req.Header.Set("X-Real-IP", "10.0.0.2")
	req.Header.Set("Forwarded", "for=10.0.0.3")
	req.Header.Set("X-Bc-Signature", "t=1,v1=00")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("front: %d", resp.StatusCode)
	}
	expectHeaders(t, "through an API server", host.last(t).header, map[string]string{"Authorization": "Bearer bc_tok",
		"User-Agent": "client/1", "X-Forwarded-For": "127.0.0.1"})

	// Through the API's CachingPort: the credential survives its copies,
	// on a miss and on a hit, and each copy carries its own request's
	// address.
	cp := NewCachingPort(port, CacheOptions{})
	for i, ip := range []string{"192.0.2.1", "192.0.2.2"} {
		c, err := cp.Authenticate(ctx, Credential{Authorization: "Bearer bc_cached", SourceIP: ip})
		if err != nil {
			t.Fatal(err)
		}
		if err := cp.Require(ctx, Request{Caller: c, TenantID: "acme", Action: "compute:pools:manage",
			Resource: Resource{Type: "compute-pool", ID: "pool_1"}, RequestID: fmt.Sprintf("req-c%d", i)}); err != nil {
			t.Fatal(err)
		}
		expectHeaders(t, "through the cache", host.last(t).header, map[string]string{"Authorization": "Bearer bc_cached",
			"X-Forwarded-For": ip, "X-Request-Id": fmt.Sprintf("req-c%d", i)})
	}
	if s := cp.Stats(); s.Authentications.Hits != 1 {
		t.Fatalf("cache stats %+v", s)
	}

	// A batch of two callers: one call each, each with its own credential.
	a, _ := port.Authenticate(ctx, Credential{Authorization: "Bearer bc_a"})
	b, _ := port.Authenticate(ctx, Credential{Authorization: "Bearer bc_b"})
	n = host.count()
	r := func(c *Caller) Request {
		return Request{Caller: c, TenantID: "acme", Action: "compute:pools:read", Resource: Resource{Type: "compute-pool", ID: "p"}}
	}
	if ds, err := port.AuthorizeMany(ctx, []Request{r(a), r(b), r(a)}); err != nil || len(ds) != 3 {
		t.Fatalf("%v, %v", ds, err)
	}
	host.mu.Lock()
	calls := host.reqs[n:]
	host.mu.Unlock()
	if len(calls) != 2 || calls[0].header.Get("Authorization") != "Bearer bc_a" || calls[1].header.Get("Authorization") != "Bearer bc_b" ||
		strings.Count(calls[0].body, "tenantId") != 2 || strings.Count(calls[1].body, "tenantId") != 1 {
		t.Fatalf("batch calls %+v", calls)
	}
}

// TestRemoteErrors: the host's errors keep their code; anything that is not
// the protocol fails closed as UNAVAILABLE.
func TestRemoteErrors(t *testing.T) {
	ctx := context.Background()
	host := newRecordingHost(t)
	port, err := NewRemotePort(RemoteConfig{BaseURL: host.srv.URL + "/"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := port.Authenticate(ctx, Credential{Authorization: "Bearer bc_tok"})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Caller: c, TenantID: "acme", Action: "compute:pools:read", Resource: Resource{Type: "compute-pool", ID: "p"}}
	for _, tc := range []struct {
		name    string
		status  int
		body    string
		want    core.Code
		details bool
	}{
		{"conflict with details", 409, `{"error":{"code":"CONFLICT","message":"busy","details":{"field":"x"}}}`, core.CodeConflict, true},
		{"not found", 404, `{"error":{"code":"NOT_FOUND","message":"compute-pool/p not found"}}`, core.CodeNotFound, false},
		{"denied", 403, `{"error":{"code":"ACCESS_DENIED","message":"access denied"}}`, core.CodeAccessDenied, false},
		{"unauthenticated", 401, `{"error":{"code":"UNAUTHENTICATED","message":"the credential is not valid"}}`, core.CodeUnauthn, false},
		{"a code that does not match its status", 404, `{"error":{"code":"ACCESS_DENIED","message":"x"}}`, core.CodeUnavailable, false},
		{"an unknown code", 400, `{"error":{"code":"NOPE","message":"x"}}`, core.CodeUnavailable, false},
		{"a 404 page", 404, `<html>not found</html>`, core.CodeUnavailable, false},
		{"internal", 500, `{"error":{"code":"INTERNAL_ERROR","message":"internal error"}}`, core.CodeUnavailable, false},
		{"unavailable", 503, `{"error":{"code":"UNAVAILABLE","message":"db down"}}`, core.CodeUnavailable, false},
		{"a gateway", 502, `bad gateway`, core.CodeUnavailable, false},
		{"a redirect", 307, ``, core.CodeUnavailable, false},
		{"garbage", 200, `{"allowed":`, core.CodeUnavailable, false},
	} {
		host.mu.Lock()
		host.reply = func(w http.ResponseWriter, r *http.Request) {
			if tc.status == 307 {
				w.Header().Set("Location", "http://192.0.2.1/elsewhere")
			}
			w.WriteHeader(tc.status)
			_, _ = io.WriteString(w, tc.body)
		}
		host.mu.Unlock()
		_, err := port.Authorize(ctx, req)
		e := core.AsError(err)
		if err == nil || e.Code != tc.want || (tc.details && e.Details["field"] != "x") {
			t.Fatalf("%s: %v (%+v)", tc.name, err, e)
		}
		if err := port.Require(ctx, req); core.AsError(err).Code != tc.want && tc.status != 200 {
			t.Fatalf("%s: Require %v", tc.name, err)
		}
	}
	host.mu.Lock()
	host.reply = func(w http.ResponseWriter, r *http.Request) {
		hostWriteJSON(w, 200, wireDecisions{Decisions: []Decision{{}}})
	}
	host.mu.Unlock()
	if _, err := port.AuthorizeMany(ctx, []Request{req, req}); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("a short batch answer: %v", err)
	}
	host.mu.Lock()
	host.reply = func(w http.ResponseWriter, r *http.Request) { hostWriteJSON(w, 200, Caller{}) }
	host.mu.Unlock()
	if _, err := port.Authenticate(ctx, Credential{Authorization: "Bearer bc_tok"}); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("an empty caller: %v", err)
	}

	// A host that is gone.
	host.srv.Close()
	if _, err := port.Authorize(ctx, req); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("closed host: %v", err)
	}
	if _, err := port.Authenticate(ctx, Credential{Authorization: "Bearer bc_tok"}); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("closed host: %v", err)
	}
}

func TestRemoteConfig(t *testing.T) {
	secret := []byte(strings.Repeat("s", MinRefreshSecret))
	lsn := func(context.Context) (LSN, error) { return 1, nil }
	for _, cfg := range []RemoteConfig{
		{},
		{BaseURL: "iam.internal:8443"},
		{BaseURL: "ftp://iam.internal"},
		{BaseURL: "http://iam.internal?x=1"},
		{BaseURL: "http://iam.internal", Refresh: &RemoteRefresh{Secret: secret[:MinRefreshSecret-1], PrimaryLSN: lsn}},
		{BaseURL: "http://iam.internal", Refresh: &RemoteRefresh{Secret: secret}},
		{BaseURL: "http://iam.internal", Refresh: &RemoteRefresh{URL: "nope", Secret: secret, PrimaryLSN: lsn}},
	} {
		if _, err := NewRemotePort(cfg); !errors.Is(err, core.ErrInvalidConfig) {
			t.Fatalf("%+v: %v", cfg, err)
		}
	}

	// Refresher only with Refresh, also through the API's cache.
	plain, err := NewRemotePort(RemoteConfig{BaseURL: "http://iam.internal"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := plain.(Refresher); ok {
		t.Fatal("a remote port without Refresh implements Refresher")
	}
	if _, ok := NewCachingPort(plain, CacheOptions{}).Port().(Refresher); ok {
		t.Fatal("a cached remote port without Refresh implements Refresher")
	}
	refreshing, err := NewRemotePort(RemoteConfig{BaseURL: "http://iam.internal",
		Refresh: &RemoteRefresh{Secret: secret, PrimaryLSN: lsn}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := refreshing.(Refresher); !ok {
		t.Fatal("a remote port with Refresh does not implement Refresher")
	}
	if _, ok := NewCachingPort(refreshing, CacheOptions{}).Port().(Refresher); !ok {
		t.Fatal("a cached remote port with Refresh does not implement Refresher")
	}
}

// benchAuthCachedPort caches authentications (CachingPort) and sends every
// decision to the embedded IAM: a host whose decisions are all uncached.
type benchAuthCachedPort struct {
	Port
	auth *CachingPort
}

func (p benchAuthCachedPort) Authenticate(ctx context.Context, cred Credential) (*Caller, error) {
	return p.auth.Authenticate(ctx, cred)
}

// BenchmarkRemoteAuthorize is one uncached Authorize through the remote
// port, a loopback HTTP call and the host (its authentication of the
// forwarded credential cached), against the same Authorize on the embedded
// port (BenchmarkUncachedDecision).
func BenchmarkRemoteAuthorize(b *testing.B) {
	env, c := embBenchEnv(b)
	tok := env.token(Identity{ID: c.IdentityID, TenantID: "acme"}, SessionUser, false)
	h, err := HostHandler(HostConfig{Port: benchAuthCachedPort{Port: env.iam, auth: NewCachingPort(env.iam, CacheOptions{})},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	remote, err := NewRemotePort(RemoteConfig{BaseURL: srv.URL})
	if err != nil {
		b.Fatal(err)
	}
	rc, err := remote.Authenticate(env.ctx, Credential{Authorization: "Bearer " + tok.Token, SourceIP: "10.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	run := func(b *testing.B, port Port, c *Caller, id string, allow bool) {
		req := Request{Caller: c, TenantID: "acme", Action: "compute:reservations:create",
			Resource: Resource{Type: "compute-reservation", ID: id}, RequestID: "req-bench"}
		if d, err := port.Authorize(env.ctx, req); err != nil || d.Allowed != allow { // warms the policy cache
			b.Fatalf("%+v, %v", d, err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			d, err := port.Authorize(env.ctx, req)
			if err != nil || d.Allowed != allow {
				b.Fatalf("%+v, %v", d, err)
			}
		}
	}
	b.Run("embedded/allow", func(b *testing.B) { run(b, env.iam, c, "rsv_00", true) })
	b.Run("remote/allow", func(b *testing.B) { run(b, remote, rc, "rsv_00", true) })
	b.Run("embedded/deny-audited", func(b *testing.B) { run(b, env.iam, c, "rsv_big", false) })
	b.Run("remote/deny-audited", func(b *testing.B) { run(b, remote, rc, "rsv_big", false) })
}

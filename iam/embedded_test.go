package iam

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/cedar-policy/cedar-go/types"

	"github.com/better-compute/better-compute/core"
)

func TestEmbeddedAuthenticate(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	alice := env.identity("acme", KindPerson, "alice", false)
	valid := env.token(alice, SessionUser, true)
	revoked := env.token(alice, SessionUser, false)
	if _, err := env.admin.RevokeToken(env.ctx, SessionRef{TenantID: "acme", SessionID: revoked.Session.ID}); err != nil {
		t.Fatal(err)
	}
	short, err := env.admin.CreateToken(env.ctx, CreateTokenInput{TenantID: "acme", IdentityID: alice.ID,
		SessionKind: SessionUser, TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	bob := env.identity("acme", KindPerson, "bob", false)
	disabled := env.token(bob, SessionUser, false)
	if _, err := env.admin.DisableIdentity(env.ctx, IdentityRef{TenantID: "acme", IdentityID: bob.ID}); err != nil {
		t.Fatal(err)
	}
	unknown, err := newToken()
	if err != nil {
		t.Fatal(err)
	}
	later := env.newEmbedded(EmbeddedConfig{Now: func() time.Time { return env.clock.Now().Add(2 * time.Minute) }})

	tests := []struct {
		name    string
		iam     *Embedded
		cred    Credential
		session string // "" means UNAUTHENTICATED
	}{
		{"bearer", env.iam, Credential{Authorization: "Bearer " + valid.Token}, valid.Session.ID},
		{"bearer scheme in lower case", env.iam, Credential{Authorization: "bearer  " + valid.Token}, valid.Session.ID},
		{"cookie value", env.iam, Credential{Cookie: valid.Token}, valid.Session.ID},
		{"cookie header", env.iam, Credential{Cookie: "theme=dark; " + SessionCookie + "=" + valid.Token}, valid.Session.ID},
		{"another scheme falls back to the cookie", env.iam, Credential{Authorization: "Basic Zm9vOmJhcg==", Cookie: valid.Token}, valid.Session.ID},
		{"a bad bearer does not fall back to the cookie", env.iam, Credential{Authorization: "Bearer " + unknown, Cookie: valid.Token}, ""},
		{"short-lived, still valid", env.iam, Credential{Authorization: "Bearer " + short.Token}, short.Session.ID},
		{"expired", later, Credential{Authorization: "Bearer " + short.Token}, ""},
		{"revoked", env.iam, Credential{Authorization: "Bearer " + revoked.Token}, ""},
		{"unknown", env.iam, Credential{Authorization: "Bearer " + unknown}, ""},
		{"disabled identity", env.iam, Credential{Authorization: "Bearer " + disabled.Token}, ""},
		{"malformed", env.iam, Credential{Authorization: "Bearer bc_short"}, ""},
		{"upper-case token", env.iam, Credential{Authorization: "Bearer " + strings.ToUpper(valid.Token)}, ""},
		{"cookie header without the session cookie", env.iam, Credential{Cookie: "theme=dark"}, ""},
		{"nothing", env.iam, Credential{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cred.SourceIP = "10.1.2.3"
			c, err := tt.iam.Authenticate(env.ctx, tt.cred)
			if tt.session == "" {
				if embCode(err) != core.CodeUnauthn || c != nil {
					t.Fatalf("Authenticate = %+v, %v; want UNAUTHENTICATED", c, err)
				}
				if msg := core.AsError(err).Message; msg != "the credential is not valid" {
					t.Fatalf("the message tells which check failed: %q", msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.SessionID != tt.session || c.TenantID != "acme" || c.IdentityID != alice.ID ||
				c.IdentityKind != KindPerson || c.SessionKind != SessionUser || c.SourceIP != "10.1.2.3" {
				t.Fatalf("caller = %+v", c)
			}
		})
	}
	c, err := env.iam.Authenticate(env.ctx, Credential{Authorization: "Bearer " + valid.Token})
	if err != nil || !c.MFA || c.RootAuthority {
		t.Fatalf("MFA session: %+v, %v", c, err)
	}
}

func TestEmbeddedAuthenticateAgentSession(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	alice := env.identity("acme", KindPerson, "alice", false)
	bot := env.identity("acme", KindAgent, "bot", false)
	tok, err := env.admin.CreateToken(env.ctx, CreateTokenInput{TenantID: "acme", IdentityID: bot.ID,
		SessionKind: SessionAgent, DelegatedBy: alice.ID})
	if err != nil {
		t.Fatal(err)
	}
	c, err := env.iam.Authenticate(env.ctx, Credential{Authorization: "Bearer " + tok.Token})
	if err != nil {
		t.Fatal(err)
	}
	if c.AgentID != bot.ID || c.DelegatedBy != alice.ID || c.SessionKind != SessionAgent || c.IdentityKind != KindAgent {
		t.Fatalf("agent caller = %+v", c)
	}
}

// pool is a compute-pool row of a tenant, for the resolver.
func embPool(tenant, id string, attrs map[string]any) Resolved {
	return Resolved{TenantID: tenant, Type: "compute-pool", ID: id, Attributes: attrs}
}

func TestEmbeddedTenantMismatchAuditedOnCallerTenantOnly(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.tenant("beta")
	env.policy("beta", "all", permitAll)
	env.resolver.put(embPool("beta", "pool_1", nil))
	_, alice := env.person("acme", "alice")
	betaBefore := env.audit("beta")

	for _, id := range []string{"pool_1", "pool_does_not_exist"} {
		req := Request{Caller: alice, TenantID: "beta", Action: "compute:pools:read",
			Resource: Resource{Type: "compute-pool", ID: id}, RequestID: "req-" + id}
		d, err := env.iam.Authorize(env.ctx, req)
		if err != nil || d.Allowed || d.Reason != ReasonTenantMismatch {
			t.Fatalf("%s: Authorize = %+v, %v; want a TENANT_MISMATCH denial (the same for absent ids)", id, d, err)
		}
		if err := env.iam.Require(env.ctx, req); embCode(err) != core.CodeAccessDenied {
			t.Fatalf("%s: Require = %v", id, err)
		}
	}
	if n := env.resolver.callCount(); n != 0 {
		t.Fatalf("the resolver ran %d times for a foreign tenant", n)
	}
	got := env.decisions("acme")
	if len(got) != 4 {
		t.Fatalf("acme's chain has %d decisions, want 4: %+v", len(got), got)
	}
	e := got[0]
	if e.TenantID != "acme" || e.TargetTenantID != "beta" || e.Reason != ReasonTenantMismatch || e.Allowed ||
		e.IdentityID != alice.IdentityID || e.SessionID != alice.SessionID || e.Action != "compute:pools:read" ||
		e.ResourceType != "compute-pool" || e.ResourceID != "pool_1" || e.RequestID != "req-pool_1" {
		t.Fatalf("entry = %+v", e)
	}
	if after := env.audit("beta"); len(after) != len(betaBefore) {
		t.Fatalf("the target tenant's chain changed: %d entries, was %d", len(after), len(betaBefore))
	}
	if v := env.verify("acme"); !v.OK {
		t.Fatalf("acme's chain: %+v", v)
	}
}

func TestEmbeddedRootOverride(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	// acme's policies permit nothing: only the override can allow.
	rootAdmin := env.identity("root", KindPerson, "admin", true)
	rootPlain := env.identity("root", KindPerson, "plain", false)
	rootSvc := env.identity("root", KindService, "svc", true)
	full := env.caller(rootAdmin, SessionUser, true)

	with := func(f func(c *Caller)) *Caller {
		c := *full
		f(&c)
		return &c
	}
	tests := []struct {
		name   string
		caller *Caller
		allow  bool
	}{
		{"root person, root authority, user session, MFA", full, true},
		{"no MFA", env.caller(rootAdmin, SessionUser, false), false},
		{"not a user session", env.caller(rootAdmin, SessionService, false), false},
		{"no root authority", env.caller(rootPlain, SessionUser, true), false},
		{"not a person", with(func(c *Caller) { c.IdentityKind = KindService }), false},
		{"a service with root authority", env.caller(rootSvc, SessionService, false), false},
		{"not of the root tenant", with(func(c *Caller) { c.TenantID = "beta" }), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			acmeBefore, callerBefore := len(env.decisions("acme")), len(env.decisions(tt.caller.TenantID))
			d, err := env.iam.Authorize(env.ctx, Request{Caller: tt.caller, TenantID: "acme",
				Action: "compute:pools:read", Resource: Resource{Type: "compute-pool", ID: "pool_1"}})
			if err != nil {
				t.Fatal(err)
			}
			if tt.allow {
				if !d.Allowed || d.Reason != ReasonRootOverride {
					t.Fatalf("decision = %+v, want ROOT_OVERRIDE", d)
				}
				onAcme, onRoot := env.decisions("acme"), env.decisions("root")
				if len(onAcme) != acmeBefore+1 || len(onRoot) != callerBefore+1 {
					t.Fatalf("the override is not audited on both chains: acme %d→%d, root %d→%d",
						acmeBefore, len(onAcme), callerBefore, len(onRoot))
				}
				for _, e := range []AuditEntry{onAcme[len(onAcme)-1], onRoot[len(onRoot)-1]} {
					if !e.Allowed || e.Reason != ReasonRootOverride || e.TargetTenantID != "acme" || e.IdentityID != rootAdmin.ID {
						t.Fatalf("override entry = %+v", e)
					}
				}
				if onAcme[len(onAcme)-1].Details["callerTenantId"] != "root" {
					t.Fatalf("the target's entry does not name the caller's tenant: %+v", onAcme[len(onAcme)-1])
				}
				return
			}
			if d.Allowed || d.Reason != ReasonTenantMismatch {
				t.Fatalf("decision = %+v, want TENANT_MISMATCH", d)
			}
			if n := len(env.decisions("acme")); n != acmeBefore {
				t.Fatalf("a refused override touched the target's chain")
			}
		})
	}
	for _, tenant := range []string{"root", "acme"} {
		if v := env.verify(tenant); !v.OK {
			t.Fatalf("%s: %+v", tenant, v)
		}
	}
}

func TestEmbeddedRootOverrideStillChecksActionAndResource(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	admin := env.identity("root", KindPerson, "admin", true)
	c := env.caller(admin, SessionUser, true)
	d := env.authorize(Request{Caller: c, TenantID: "acme", Action: "compute:bogus:read",
		Resource: Resource{Type: "compute-pool", ID: "pool_1"}})
	if d.Allowed || d.Reason != ReasonUnknownAction {
		t.Fatalf("decision = %+v", d)
	}
	if len(env.decisions("acme")) != 1 || len(env.decisions("root")) != 1 {
		t.Fatalf("an override's denial is audited on both chains")
	}
	_, err := env.iam.Authorize(env.ctx, Request{Caller: c, TenantID: "acme", Action: "compute:pools:read",
		Resource: Resource{Type: "compute-pool", ID: "pool_missing"}})
	if embCode(err) != core.CodeNotFound {
		t.Fatalf("Authorize = %v, want NOT_FOUND", err)
	}
}

func TestEmbeddedForbidWinsOverPermit(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", map[string]any{"class": "secret"}))
	env.resolver.put(embPool("acme", "pool_2", map[string]any{"class": "standard"}))
	env.policy("acme", "allow", permitAll)
	env.policy("acme", "no-secret", `@id("no-secret")
forbid (principal, action, resource) when { resource has class && resource.class == "secret" };`)
	_, alice := env.person("acme", "alice")
	for id, allow := range map[string]bool{"pool_1": false, "pool_2": true} {
		d := env.authorize(Request{Caller: alice, TenantID: "acme", Action: "compute:pools:read",
			Resource: Resource{Type: "compute-pool", ID: id}})
		if d.Allowed != allow {
			t.Fatalf("%s: %+v", id, d)
		}
	}
	got := env.decisions("acme")
	if len(got) != 1 || got[0].Reason != ReasonDeny || got[0].Details["forbiddenBy"] != "no-secret#0" {
		t.Fatalf("audit = %+v", got)
	}
}

func TestEmbeddedNoPermitDenies(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	_, alice := env.person("acme", "alice")
	d := env.authorize(Request{Caller: alice, TenantID: "acme", Action: "compute:pools:read",
		Resource: Resource{Type: "compute-pool", ID: "pool_1"}})
	if d.Allowed || d.Reason != ReasonDeny {
		t.Fatalf("no policies: %+v", d)
	}
}

func TestEmbeddedRelationsReachThePolicy(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	env.resolver.put(Resolved{TenantID: "acme", Type: "compute-node", ID: "node_1", ParentType: "compute-pool", ParentID: "pool_1"})
	env.policy("acme", "relations", `
permit (principal, action == Action::"compute:pools:read", resource)
  when { context.relations.contains("viewer") };
permit (principal, action == Action::"compute:nodes:read", resource)
  when { context.parentRelations.contains("operator") };
permit (principal, action == Action::"compute:nodes:cordon", resource)
  when { resource.parentRelations.contains("admin") && resource in Resource::"compute-pool/pool_1" };
`)
	alice, aliceC := env.person("acme", "alice")
	_, bobC := env.person("acme", "bob")
	decide := func(c *Caller, action, typ, id string) bool {
		return env.authorize(Request{Caller: c, TenantID: "acme", Action: action, Resource: Resource{Type: typ, ID: id}}).Allowed
	}
	cases := func() [3]bool {
		return [3]bool{
			decide(aliceC, "compute:pools:read", "compute-pool", "pool_1"),
			decide(aliceC, "compute:nodes:read", "compute-node", "node_1"),
			decide(aliceC, "compute:nodes:cordon", "compute-node", "node_1"),
		}
	}
	if got := cases(); got != [3]bool{} {
		t.Fatalf("before any relation: %v", got)
	}
	env.relate(alice, "viewer", "compute-pool", "pool_1")
	env.relate(alice, "operator", "compute-pool", "pool_1")
	if got := cases(); got != [3]bool{true, true, false} {
		t.Fatalf("viewer and operator on the pool: %v", got)
	}
	env.relate(alice, "admin", "compute-pool", "pool_1")
	if got := cases(); got != [3]bool{true, true, true} {
		t.Fatalf("admin on the pool too: %v", got)
	}
	if decide(bobC, "compute:pools:read", "compute-pool", "pool_1") {
		t.Fatalf("alice's relations reached bob's decision")
	}
	if err := env.admin.RemoveRelation(env.ctx, Relation{TenantID: "acme", SubjectID: alice.ID, Relation: "viewer",
		ResourceType: "compute-pool", ResourceID: "pool_1"}); err != nil {
		t.Fatal(err)
	}
	if got := cases(); got != [3]bool{false, true, true} {
		t.Fatalf("after removing viewer: %v", got)
	}
}

func TestEmbeddedSourceIPOnlyFromTheCredential(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	env.policy("acme", "office", `permit (principal, action, resource)
  when { context has sourceIp && context.sourceIp.isInRange(ip("10.0.0.0/8")) };`)
	idn := env.identity("acme", KindPerson, "alice", false)
	tok := env.token(idn, SessionUser, false)
	callerFrom := func(ip string) *Caller {
		c, err := env.iam.Authenticate(env.ctx, Credential{Authorization: "Bearer " + tok.Token, SourceIP: ip})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	spoof, err := types.ParseIPAddr("10.9.9.9")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		sourceIP string
		context  map[string]any
		allow    bool
	}{
		{"inside the range", "10.1.2.3", nil, true},
		{"outside the range", "192.168.1.1", nil, false},
		{"IPv6", "2001:db8::1", nil, false},
		{"no source address", "", nil, false},
		{"not an address", "not-an-ip", nil, false},
		{"context cannot supply it", "", map[string]any{"sourceIp": "10.0.0.1"}, false},
		{"context cannot supply a Cedar ipaddr", "", map[string]any{"sourceIp": spoof}, false},
		{"context cannot override it", "192.168.1.1", map[string]any{"sourceIp": spoof}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := env.authorize(Request{Caller: callerFrom(tt.sourceIP), TenantID: "acme", Action: "compute:pools:read",
				Resource: Resource{Type: "compute-pool", ID: "pool_1"}, Context: tt.context})
			if d.Allowed != tt.allow {
				t.Fatalf("decision = %+v, want allowed %v", d, tt.allow)
			}
		})
	}
}

func TestEmbeddedContextReachesThePolicy(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	env.policy("acme", "ctx", `permit (principal, action, resource)
  when { context.sessionKind == "user" && !context.mfa && context has reason && context.reason == "maintenance" &&
         context.count <= 3 && context.tags.contains("a") && context.meta.deep == true };`)
	_, alice := env.person("acme", "alice")
	req := func(ctx map[string]any) Request {
		return Request{Caller: alice, TenantID: "acme", Action: "compute:pools:read",
			Resource: Resource{Type: "compute-pool", ID: "pool_1"}, Context: ctx}
	}
	good := map[string]any{"reason": "maintenance", "count": 3, "tags": []string{"a", "b"}, "meta": map[string]any{"deep": true}}
	if d := env.authorize(req(good)); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	bad := map[string]any{"reason": "maintenance", "count": 3.5, "tags": []any{"a"}, "meta": map[string]any{"deep": true}}
	if d := env.authorize(req(bad)); d.Allowed {
		t.Fatalf("3.5 rounds up to 4: %+v", d)
	}
	spoofed := map[string]any{"reason": "maintenance", "count": 1, "tags": []string{"a"}, "meta": map[string]any{"deep": true},
		"sessionKind": "service", "mfa": true}
	if d := env.authorize(req(spoofed)); !d.Allowed {
		t.Fatalf("the request context overrode sessionKind or mfa: %+v", d)
	}
	_, err := env.iam.Authorize(env.ctx, req(map[string]any{"bad": struct{}{}}))
	if embCode(err) != core.CodeInvalidInput {
		t.Fatalf("a context value without a Cedar form: %v", err)
	}
}

func TestEmbeddedDeclaredAttributesOnly(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.policy("acme", "attrs", `
permit (principal, action == Action::"compute:pools:read", resource)
  when { resource has gpuModel && resource.gpuModel == "H100" && resource.gpuMemoryGb == 80 };
permit (principal, action == Action::"compute:pools:manage", resource)
  when { resource has secret };
permit (principal, action == Action::"compute:pools:share", resource)
  when { resource.tenantId == "acme" && resource.id == "pool_1" && resource.type == "compute-pool" };
`)
	env.resolver.put(embPool("acme", "pool_1", map[string]any{
		"gpuModel": "H100", "gpuMemoryGb": float64(80), "secret": "x",
		// a declared attribute may not shadow an implicit one
		"tenantId": "other"}))
	env.resolver.put(embPool("acme", "pool_bad", map[string]any{"gpuModel": "H100", "gpuMemoryGb": "80"}))
	env.resolver.put(embPool("acme", "pool_nan", map[string]any{"gpuModel": "H100", "gpuMemoryGb": math.NaN()}))
	env.resolver.put(embPool("acme", "pool_nil", map[string]any{"gpuModel": nil, "gpuMemoryGb": 80}))
	_, alice := env.person("acme", "alice")
	tests := []struct {
		action, id string
		allow      bool
		reason     string
	}{
		{"compute:pools:read", "pool_1", true, ReasonAllow},
		{"compute:pools:manage", "pool_1", false, ReasonDeny}, // secret is not declared: dropped
		{"compute:pools:share", "pool_1", true, ReasonAllow},
		{"compute:pools:read", "pool_bad", false, ReasonResolveFailed}, // a string where a number is declared
		{"compute:pools:read", "pool_nan", false, ReasonResolveFailed},
		{"compute:pools:read", "pool_nil", false, ReasonDeny}, // nil is absent
	}
	for _, tt := range tests {
		d := env.authorize(Request{Caller: alice, TenantID: "acme", Action: tt.action, Resource: Resource{Type: "compute-pool", ID: tt.id}})
		if d.Allowed != tt.allow || d.Reason != tt.reason {
			t.Errorf("%s on %s: %+v, want %v %s", tt.action, tt.id, d, tt.allow, tt.reason)
		}
	}
}

func TestEmbeddedNotFoundIsNotAuditedAndAbortsABatch(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	env.policy("acme", "read", `permit (principal, action == Action::"compute:pools:read", resource);`)
	_, alice := env.person("acme", "alice")
	req := func(action, id string) Request {
		return Request{Caller: alice, TenantID: "acme", Action: action, Resource: Resource{Type: "compute-pool", ID: id}}
	}
	_, err := env.iam.Authorize(env.ctx, req("compute:pools:read", "pool_missing"))
	if embCode(err) != core.CodeNotFound || !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("Authorize = %v, want NOT_FOUND", err)
	}
	if err := env.iam.Require(env.ctx, req("compute:pools:read", "pool_missing")); embCode(err) != core.CodeNotFound {
		t.Fatalf("Require = %v, want NOT_FOUND", err)
	}
	ds, err := env.iam.AuthorizeMany(env.ctx, []Request{
		req("compute:pools:read", "pool_1"),
		req("compute:pools:manage", "pool_1"), // a denial, which the abort keeps out of the chain
		req("compute:pools:read", "pool_missing"),
		req("compute:pools:read", "pool_1"),
	})
	if embCode(err) != core.CodeNotFound || ds != nil {
		t.Fatalf("AuthorizeMany = %v, %v; want NOT_FOUND and no answers", ds, err)
	}
	if got := env.decisions("acme"); len(got) != 0 {
		t.Fatalf("NOT_FOUND was audited: %+v", got)
	}
}

func TestEmbeddedResolverAnswers(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.policy("acme", "all", permitAll)
	env.resolver.put(embPool("acme", "pool_ok", nil))
	env.resolver.echo["compute-pool/pool_other_id"] = &Resolved{TenantID: "acme", Type: "compute-pool", ID: "pool_x"}
	env.resolver.echo["compute-pool/pool_other_tenant"] = &Resolved{TenantID: "beta", Type: "compute-pool", ID: "pool_other_tenant"}
	env.resolver.echo["compute-pool/pool_other_type"] = &Resolved{TenantID: "acme", Type: "compute-node", ID: "pool_other_type"}
	env.resolver.fails["compute-pool/pool_timeout"] = context.DeadlineExceeded
	env.resolver.fails["compute-pool/pool_unloaded"] = ErrNotLoaded
	env.resolver.fails["compute-pool/pool_required"] = ErrResolverRequired
	_, alice := env.person("acme", "alice")
	tests := []struct {
		id     string
		allow  bool
		reason string
	}{
		{"pool_ok", true, ReasonAllow},
		{"pool_other_id", false, ReasonResourceMismatch},
		{"pool_other_tenant", false, ReasonResourceMismatch},
		{"pool_other_type", false, ReasonResourceMismatch},
		{"pool_timeout", false, ReasonResolveFailed},
		{"pool_unloaded", false, ReasonResolveFailed},
		{"pool_required", false, ReasonResolverRequired},
	}
	for _, tt := range tests {
		d := env.authorize(Request{Caller: alice, TenantID: "acme", Action: "compute:pools:read",
			Resource: Resource{Type: "compute-pool", ID: tt.id}})
		if d.Allowed != tt.allow || d.Reason != tt.reason {
			t.Errorf("%s: %+v, want %s", tt.id, d, tt.reason)
		}
	}
	got := env.decisions("acme")
	if len(got) != len(tests)-1 {
		t.Fatalf("%d denials audited, want %d", len(got), len(tests)-1)
	}
	if got[0].Reason != ReasonResourceMismatch || got[0].Details["resolvedId"] != "pool_x" {
		t.Fatalf("mismatch entry = %+v", got[0])
	}
}

func TestEmbeddedUnknownAction(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.policy("acme", "all", permitAll)
	env.resolver.put(embPool("acme", "pool_1", nil))
	env.resolver.put(Resolved{TenantID: "acme", Type: "compute-bogus", ID: "x_1"})
	_, alice := env.person("acme", "alice")
	tests := []struct{ action, typ, id string }{
		{"compute:pools:frobnicate", "compute-pool", "pool_1"}, // not in the catalog
		{"compute:nodes:exec", "compute-pool", "pool_1"},       // in the catalog, not carried by the type
		{"compute:pools:read", "compute-bogus", "x_1"},         // the prefix, but no such type
		{"", "compute-pool", "pool_1"},
	}
	for _, tt := range tests {
		d := env.authorize(Request{Caller: alice, TenantID: "acme", Action: tt.action, Resource: Resource{Type: tt.typ, ID: tt.id}})
		if d.Allowed || d.Reason != ReasonUnknownAction {
			t.Errorf("%s on %s: %+v", tt.action, tt.typ, d)
		}
	}
	if n := env.resolver.callCount(); n != 0 {
		t.Fatalf("the resolver ran %d times for unknown actions", n)
	}
	if got := env.decisions("acme"); len(got) != len(tests) || got[0].Reason != ReasonUnknownAction {
		t.Fatalf("audit = %+v", got)
	}
}

func TestEmbeddedHostTypes(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.policy("acme", "host", `permit (principal, action == Action::"iam:users:read", resource)
  when { resource.type == "iam-user" && resource.level == 3 && resource.tags.contains("x") };`)
	_, alice := env.person("acme", "alice")
	req := Request{Caller: alice, TenantID: "acme", Action: "iam:users:read", Resource: Resource{Type: "iam-user", ID: "u1"}}
	if d := env.authorize(req); d.Allowed || d.Reason != ReasonResolverRequired {
		t.Fatalf("without a host fallback: %+v", d)
	}
	host := newEmbTestResolver()
	host.put(Resolved{TenantID: "acme", Type: "iam-user", ID: "u1", Attributes: map[string]any{"level": 3, "tags": []any{"x"}}})
	withHost := env.newEmbedded(EmbeddedConfig{HostFallback: host})
	d, err := withHost.Authorize(env.ctx, req)
	if err != nil || !d.Allowed {
		t.Fatalf("with a host fallback: %+v, %v", d, err)
	}
	if env.resolver.callCount() != 0 || host.callCount() != 1 {
		t.Fatalf("resolver calls: catalog %d, host %d", env.resolver.callCount(), host.callCount())
	}
}

func TestEmbeddedAuthorizeManyOrderAndCap(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.tenant("beta")
	env.policy("acme", "even", `permit (principal, action == Action::"compute:pools:read", resource)
  when { resource has class && resource.class == "even" };`)
	_, alice := env.person("acme", "alice")
	var reqs []Request
	var want []Decision
	for i := range MaxBatch {
		id := fmt.Sprintf("pool_%02d", i)
		class := "odd"
		if i%2 == 0 {
			class = "even"
		}
		env.resolver.put(embPool("acme", id, map[string]any{"class": class}))
		tenant, reason, allowed := "acme", ReasonDeny, i%2 == 0
		if allowed {
			reason = ReasonAllow
		}
		if i%7 == 3 {
			tenant, reason, allowed = "beta", ReasonTenantMismatch, false
		}
		reqs = append(reqs, Request{Caller: alice, TenantID: tenant, Action: "compute:pools:read",
			Resource: Resource{Type: "compute-pool", ID: id}})
		want = append(want, Decision{Allowed: allowed, Reason: reason})
	}
	got, err := env.iam.AuthorizeMany(env.ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d answers for %d requests", len(got), len(want))
	}
	denials := 0
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("answer %d = %+v, want %+v", i, got[i], want[i])
		}
		if !want[i].Allowed {
			denials++
		}
	}
	if n := len(env.decisions("acme")); n != denials {
		t.Fatalf("%d denials audited, want %d", n, denials)
	}
	if v := env.verify("acme"); !v.OK {
		t.Fatalf("%+v", v)
	}

	_, err = env.iam.AuthorizeMany(env.ctx, append(reqs, reqs[0]))
	if embCode(err) != core.CodeInvalidInput {
		t.Fatalf("%d requests: %v, want INVALID_INPUT", MaxBatch+1, err)
	}
	if ds, err := env.iam.AuthorizeMany(env.ctx, nil); err != nil || len(ds) != 0 {
		t.Fatalf("an empty batch: %v, %v", ds, err)
	}
}

func TestEmbeddedRequireIsOpaque(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	env.policy("acme", "read", `permit (principal, action == Action::"compute:pools:read", resource);`)
	_, alice := env.person("acme", "alice")
	req := Request{Caller: alice, TenantID: "acme", Action: "compute:pools:read", Resource: Resource{Type: "compute-pool", ID: "pool_1"}}
	if err := env.iam.Require(env.ctx, req); err != nil {
		t.Fatal(err)
	}
	for _, r := range []Request{
		{Caller: alice, TenantID: "acme", Action: "compute:pools:manage", Resource: req.Resource},
		{Caller: alice, TenantID: "beta", Action: "compute:pools:read", Resource: req.Resource},
		{Caller: alice, TenantID: "acme", Action: "compute:nope:read", Resource: req.Resource},
	} {
		err := env.iam.Require(env.ctx, r)
		e := core.AsError(err)
		if e.Code != core.CodeAccessDenied || e.Message != "access denied" || e.Details != nil {
			t.Fatalf("Require(%s in %s) = %#v", r.Action, r.TenantID, e)
		}
	}
	if _, err := env.iam.Authorize(env.ctx, Request{TenantID: "acme", Action: req.Action, Resource: req.Resource}); embCode(err) != core.CodeUnauthn {
		t.Fatalf("no caller: %v", err)
	}
	if _, err := env.iam.Authorize(env.ctx, Request{Caller: alice, Action: req.Action, Resource: req.Resource}); embCode(err) != core.CodeInvalidInput {
		t.Fatalf("no tenant: %v", err)
	}
}

func TestEmbeddedRevokedOrDisabledCallerDenies(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	env.policy("acme", "all", permitAll)
	alice, c := env.person("acme", "alice")
	req := Request{Caller: c, TenantID: "acme", Action: "compute:pools:read", Resource: Resource{Type: "compute-pool", ID: "pool_1"}}
	if d := env.authorize(req); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	// A Caller that outlives its session (the authentication cache) denies.
	if _, err := env.admin.RevokeToken(env.ctx, SessionRef{TenantID: "acme", SessionID: c.SessionID}); err != nil {
		t.Fatal(err)
	}
	if d := env.authorize(req); d.Allowed || d.Reason != ReasonPrincipalInactive {
		t.Fatalf("revoked session: %+v", d)
	}
	c2 := env.caller(alice, SessionUser, false)
	req.Caller = c2
	if d := env.authorize(req); !d.Allowed {
		t.Fatalf("new session: %+v", d)
	}
	if _, err := env.admin.DisableIdentity(env.ctx, IdentityRef{TenantID: "acme", IdentityID: alice.ID}); err != nil {
		t.Fatal(err)
	}
	if d := env.authorize(req); d.Allowed || d.Reason != ReasonPrincipalInactive {
		t.Fatalf("disabled identity: %+v", d)
	}
	forged := *c2
	forged.IdentityID = "idn_01jzzzzzzzzzzzzzzzzzzzzzzz"
	req.Caller = &forged
	if d := env.authorize(req); d.Allowed || d.Reason != ReasonPrincipalInactive {
		t.Fatalf("unknown identity: %+v", d)
	}
}

func TestEmbeddedPolicyChangesReachEveryProcess(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	_, alice := env.person("acme", "alice")
	other := env.newEmbedded(EmbeddedConfig{}) // another process: its own policy cache
	req := Request{Caller: alice, TenantID: "acme", Action: "compute:pools:read", Resource: Resource{Type: "compute-pool", ID: "pool_1"}}
	both := func() [2]bool {
		var out [2]bool
		for i, e := range []*Embedded{env.iam, other} {
			d, err := e.Authorize(env.ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = d.Allowed
		}
		return out
	}
	if got := both(); got != [2]bool{} {
		t.Fatalf("no policy: %v", got)
	}
	env.policy("acme", "p", permitAll)
	if got := both(); got != [2]bool{true, true} {
		t.Fatalf("after put: %v", got)
	}
	env.policy("acme", "p", `permit (principal, action == Action::"compute:pools:manage", resource);`)
	if got := both(); got != [2]bool{} {
		t.Fatalf("after replace: %v", got)
	}
	env.policy("acme", "p", permitAll)
	if got := both(); got != [2]bool{true, true} {
		t.Fatalf("after replace back: %v", got)
	}
	if err := env.admin.DeletePolicy(env.ctx, PolicyRef{TenantID: "acme", Name: "p"}); err != nil {
		t.Fatal(err)
	}
	if got := both(); got != [2]bool{} {
		t.Fatalf("after delete: %v", got)
	}
}

func TestEmbeddedStoredPolicyThatNoLongerParsesFailsClosed(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	env.policy("acme", "all", permitAll)
	_, alice := env.person("acme", "alice")
	if _, err := env.db.Pool.Exec(env.ctx, `INSERT INTO iam_policies (id, tenant_id, name, cedar) VALUES ('pol_x', 'acme', 'zz', 'forbid (');
		UPDATE iam_tenants SET policy_version = policy_version + 1 WHERE id = 'acme'`); err != nil {
		t.Fatal(err)
	}
	_, err := env.iam.Authorize(env.ctx, Request{Caller: alice, TenantID: "acme", Action: "compute:pools:read",
		Resource: Resource{Type: "compute-pool", ID: "pool_1"}})
	if embCode(err) != core.CodeInternal {
		t.Fatalf("Authorize = %v, want INTERNAL_ERROR", err)
	}
}

func TestEmbeddedRefresh(t *testing.T) {
	env := newEmbTestEnv(t)
	if err := env.iam.RefreshResource(env.ctx, "acme", Resource{Type: "compute-pool", ID: "p"}); err != nil {
		t.Fatalf("without a refresher: %v", err)
	}
	r := &embTestRefresher{}
	e := env.newEmbedded(EmbeddedConfig{Refresher: r})
	if err := e.RefreshResource(env.ctx, "acme", Resource{Type: "compute-pool", ID: "p"}); err != nil || r.got != "acme|compute-pool/p" {
		t.Fatalf("refresh: %v, %q", err, r.got)
	}
	var _ Refresher = e
}

type embTestRefresher struct{ got string }

func (r *embTestRefresher) RefreshResource(_ context.Context, tenantID string, res Resource) error {
	r.got = tenantID + "|" + res.String()
	return nil
}

func TestNewEmbeddedConfig(t *testing.T) {
	env := newEmbTestEnv(t)
	if _, err := NewEmbedded(EmbeddedConfig{Store: env.db, Catalog: env.cat}); embCode(err) != core.CodeInvalidConfig {
		t.Fatalf("no resolver: %v", err)
	}
	if _, err := NewEmbedded(EmbeddedConfig{Store: env.db, Catalog: env.cat, Resolver: env.resolver, RootTenantID: "bad tenant"}); embCode(err) != core.CodeInvalidConfig {
		t.Fatalf("bad root: %v", err)
	}
	e := env.newEmbedded(EmbeddedConfig{RootTenantID: "platform"})
	if e.RootTenantID() != "platform" || env.iam.RootTenantID() != DefaultRootTenantID {
		t.Fatalf("root tenants: %q, %q", e.RootTenantID(), env.iam.RootTenantID())
	}
}

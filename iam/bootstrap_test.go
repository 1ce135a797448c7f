package iam

import (
	"testing"

	"github.com/better-compute/better-compute/internal/testenv"
)

func TestBootstrapIsIdempotent(t *testing.T) {
	env := newEmbTestEnv(t) // the env made the root tenant already
	first, err := Bootstrap(env.ctx, env.admin, BootstrapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if first.AdminToken == "" || first.UserToken == "" || first.TenantID != "acme" || first.RootTenantID != "root" {
		t.Fatalf("first run = %+v", first)
	}
	if len(first.Created) != 7 { // root exists: admin, its token, root policy, acme, its user, token, policy
		t.Fatalf("first run created %v", first.Created)
	}

	admin, err := env.iam.Authenticate(env.ctx, Credential{Authorization: "Bearer " + first.AdminToken})
	if err != nil || admin.TenantID != "root" || !admin.RootAuthority || !admin.MFA || admin.SessionKind != SessionUser ||
		admin.IdentityKind != KindPerson || admin.IdentityID != first.AdminIdentityID {
		t.Fatalf("the admin token: %+v, %v", admin, err)
	}
	user, err := env.iam.Authenticate(env.ctx, Credential{Authorization: "Bearer " + first.UserToken})
	if err != nil || user.TenantID != "acme" || user.RootAuthority || user.IdentityID != first.UserIdentityID {
		t.Fatalf("the user token: %+v, %v", user, err)
	}

	// Passing the tokens back changes nothing.
	second, err := Bootstrap(env.ctx, env.admin, BootstrapOptions{AdminToken: first.AdminToken, UserToken: first.UserToken})
	if err != nil {
		t.Fatal(err)
	}
	if second.AdminToken != "" || second.UserToken != "" || len(second.Created) != 0 ||
		second.AdminIdentityID != first.AdminIdentityID || second.UserIdentityID != first.UserIdentityID ||
		second.AdminSessionID != first.AdminSessionID || second.UserSessionID != first.UserSessionID {
		t.Fatalf("second run = %+v", second)
	}

	// Lost or revoked tokens are replaced; nothing else is made again.
	if _, err := env.admin.RevokeToken(env.ctx, SessionRef{TenantID: "acme", SessionID: first.UserSessionID}); err != nil {
		t.Fatal(err)
	}
	third, err := Bootstrap(env.ctx, env.admin, BootstrapOptions{UserToken: first.UserToken})
	if err != nil {
		t.Fatal(err)
	}
	if third.AdminToken == "" || third.UserToken == "" || len(third.Created) != 2 || third.AdminIdentityID != first.AdminIdentityID {
		t.Fatalf("third run = %+v", third)
	}

	// The tokens work: the admin everywhere in root and, by override, in acme; the user in acme only.
	env.resolver.put(Resolved{TenantID: "root", Type: "compute-fleet", ID: "global"})
	env.resolver.put(Resolved{TenantID: "acme", Type: "compute-tenant", ID: "acme"})
	env.resolver.put(Resolved{TenantID: "root", Type: "compute-tenant", ID: "root"})
	userC, err := env.iam.Authenticate(env.ctx, Credential{Authorization: "Bearer " + third.UserToken})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		caller *Caller
		tenant string
		action string
		typ    string
		id     string
		allow  bool
	}{
		{admin, "root", "compute:fleet:admin", "compute-fleet", "global", true},
		{admin, "acme", "compute:projects:manage", "compute-tenant", "acme", true},
		{userC, "acme", "compute:projects:manage", "compute-tenant", "acme", true},
		{userC, "root", "compute:fleet:admin", "compute-fleet", "global", false},
		{userC, "root", "compute:projects:read", "compute-tenant", "root", false},
	}
	for _, tt := range tests {
		d := env.authorize(Request{Caller: tt.caller, TenantID: tt.tenant, Action: tt.action, Resource: Resource{Type: tt.typ, ID: tt.id}})
		if d.Allowed != tt.allow {
			t.Errorf("%s %s in %s: %+v", tt.caller.IdentityID, tt.action, tt.tenant, d)
		}
	}
	for _, tenant := range []string{"root", "acme"} {
		if v := env.verify(tenant); !v.OK {
			t.Fatalf("%s: %+v", tenant, v)
		}
	}
}

func TestBootstrapOnAnEmptyDatabase(t *testing.T) {
	db := testenv.Store(t)
	env := newEmbTestEnv(t)
	admin, err := NewAdmin(AdminConfig{Store: db, Catalog: env.cat, RootTenantID: "platform"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Bootstrap(env.ctx, admin, BootstrapOptions{TenantID: "example", UserName: "ann"})
	if err != nil {
		t.Fatal(err)
	}
	if res.RootTenantID != "platform" || res.TenantID != "example" || len(res.Created) != 8 {
		t.Fatalf("%+v", res)
	}
	ps, err := admin.ListPolicies(env.ctx, TenantRef{TenantID: "platform"})
	if err != nil || len(ps) != 1 || ps[0].Cedar != RootAuthorityPolicy("platform") {
		t.Fatalf("root policies: %+v, %v", ps, err)
	}
	if _, err := Bootstrap(env.ctx, admin, BootstrapOptions{TenantID: "platform"}); embCode(err) != "INVALID_INPUT" {
		t.Fatalf("the example tenant as root: %v", err)
	}
}

package iam

import (
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
)

// embField is details.field of an error.
func embField(err error) string {
	f, _ := core.AsError(err).Details["field"].(string)
	return f
}

func TestAdminValidation(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	alice := env.identity("acme", KindPerson, "alice", false)
	svc := env.identity("acme", KindService, "svc", false)
	ctx := env.ctx
	a := env.admin
	long := strings.Repeat("x", 300)
	tests := []struct {
		name  string
		call  func() error
		code  core.Code
		field string
	}{
		{"tenant id", func() error {
			_, err := a.CreateTenant(ctx, CreateTenantInput{ID: "bad tenant", Name: "x"})
			return err
		}, core.CodeInvalidInput, "id"},
		{"tenant id too long", func() error {
			_, err := a.CreateTenant(ctx, CreateTenantInput{ID: strings.Repeat("a", 129), Name: "x"})
			return err
		}, core.CodeInvalidInput, "id"},
		{"tenant name", func() error { _, err := a.CreateTenant(ctx, CreateTenantInput{ID: "t2", Name: " padded"}); return err }, core.CodeInvalidInput, "name"},
		{"tenant name too long", func() error { _, err := a.CreateTenant(ctx, CreateTenantInput{ID: "t2", Name: long}); return err }, core.CodeInvalidInput, "name"},
		{"tenant exists", func() error { _, err := a.CreateTenant(ctx, CreateTenantInput{ID: "acme", Name: "again"}); return err }, core.CodeConflict, "id"},
		{"identity kind", func() error {
			_, err := a.CreateIdentity(ctx, CreateIdentityInput{TenantID: "acme", Kind: "robot", Name: "r"})
			return err
		}, core.CodeInvalidInput, "kind"},
		{"identity name", func() error {
			_, err := a.CreateIdentity(ctx, CreateIdentityInput{TenantID: "acme", Kind: KindPerson, Name: "a\nb"})
			return err
		}, core.CodeInvalidInput, "name"},
		{"identity tenant missing", func() error {
			_, err := a.CreateIdentity(ctx, CreateIdentityInput{TenantID: "nowhere", Kind: KindPerson, Name: "x"})
			return err
		}, core.CodeNotFound, "tenantId"},
		{"identity name taken", func() error {
			_, err := a.CreateIdentity(ctx, CreateIdentityInput{TenantID: "acme", Kind: KindPerson, Name: "alice"})
			return err
		}, core.CodeConflict, "name"},
		{"root authority outside the root tenant", func() error {
			_, err := a.CreateIdentity(ctx, CreateIdentityInput{TenantID: "acme", Kind: KindPerson, Name: "boss", RootAuthority: true})
			return err
		}, core.CodeInvalidInput, "rootAuthority"},
		{"group name", func() error {
			_, err := a.CreateIdentity(ctx, CreateIdentityInput{TenantID: "acme", Kind: KindPerson, Name: "g", Groups: []string{"Bad Group"}})
			return err
		}, core.CodeInvalidInput, "groups"},
		{"groups of a missing identity", func() error {
			_, err := a.SetIdentityGroups(ctx, SetIdentityGroupsInput{TenantID: "acme", IdentityID: core.NewID("idn"), Groups: []string{"a"}})
			return err
		}, core.CodeNotFound, "identityId"},
		{"identity of another tenant", func() error {
			_, err := a.DisableIdentity(ctx, IdentityRef{TenantID: "root", IdentityID: alice.ID})
			return err
		}, core.CodeNotFound, "identityId"},
		{"identity id", func() error {
			_, err := a.DisableIdentity(ctx, IdentityRef{TenantID: "acme", IdentityID: "alice"})
			return err
		}, core.CodeInvalidInput, "identityId"},
		{"session kind", func() error {
			_, err := a.CreateToken(ctx, CreateTokenInput{TenantID: "acme", IdentityID: alice.ID, SessionKind: "web"})
			return err
		}, core.CodeInvalidInput, "sessionKind"},
		{"MFA outside a user session", func() error {
			_, err := a.CreateToken(ctx, CreateTokenInput{TenantID: "acme", IdentityID: svc.ID, SessionKind: SessionService, MFA: true})
			return err
		}, core.CodeInvalidInput, "mfa"},
		{"a user session for a service", func() error {
			_, err := a.CreateToken(ctx, CreateTokenInput{TenantID: "acme", IdentityID: svc.ID, SessionKind: SessionUser})
			return err
		}, core.CodeInvalidInput, "sessionKind"},
		{"ttl too short", func() error {
			_, err := a.CreateToken(ctx, CreateTokenInput{TenantID: "acme", IdentityID: alice.ID, SessionKind: SessionUser, TTLSeconds: 5})
			return err
		}, core.CodeInvalidInput, "ttlSeconds"},
		{"ttl too long", func() error {
			_, err := a.CreateToken(ctx, CreateTokenInput{TenantID: "acme", IdentityID: alice.ID, SessionKind: SessionUser, TTLSeconds: 1 << 40})
			return err
		}, core.CodeInvalidInput, "ttlSeconds"},
		{"delegation outside an agent session", func() error {
			_, err := a.CreateToken(ctx, CreateTokenInput{TenantID: "acme", IdentityID: alice.ID, SessionKind: SessionUser, DelegatedBy: svc.ID})
			return err
		}, core.CodeInvalidInput, "delegatedBy"},
		{"token for a missing identity", func() error {
			_, err := a.CreateToken(ctx, CreateTokenInput{TenantID: "acme", IdentityID: core.NewID("idn"), SessionKind: SessionUser})
			return err
		}, core.CodeNotFound, "identityId"},
		{"revoke a missing session", func() error {
			_, err := a.RevokeToken(ctx, SessionRef{TenantID: "acme", SessionID: core.NewID("ses")})
			return err
		}, core.CodeNotFound, "sessionId"},
		{"session id", func() error { _, err := a.RevokeToken(ctx, SessionRef{TenantID: "acme", SessionID: "x"}); return err }, core.CodeInvalidInput, "sessionId"},
		{"policy name", func() error {
			_, err := a.PutPolicy(ctx, PutPolicyInput{TenantID: "acme", Name: "Bad Name", Cedar: permitAll})
			return err
		}, core.CodeInvalidInput, "name"},
		{"policy syntax", func() error {
			_, err := a.PutPolicy(ctx, PutPolicyInput{TenantID: "acme", Name: "p", Cedar: `permit (principal, action, resource) when {`})
			return err
		}, core.CodeInvalidInput, "cedar"},
		{"an empty policy", func() error {
			_, err := a.PutPolicy(ctx, PutPolicyInput{TenantID: "acme", Name: "p", Cedar: "// nothing\n"})
			return err
		}, core.CodeInvalidInput, "cedar"},
		{"a huge policy", func() error {
			_, err := a.PutPolicy(ctx, PutPolicyInput{TenantID: "acme", Name: "p", Cedar: strings.Repeat(" ", MaxPolicyBytes+1)})
			return err
		}, core.CodeInvalidInput, "cedar"},
		{"policy of a missing tenant", func() error {
			_, err := a.PutPolicy(ctx, PutPolicyInput{TenantID: "nowhere", Name: "p", Cedar: permitAll})
			return err
		}, core.CodeNotFound, "tenantId"},
		{"delete a missing policy", func() error { return a.DeletePolicy(ctx, PolicyRef{TenantID: "acme", Name: "none"}) }, core.CodeNotFound, "name"},
		{"list policies of a missing tenant", func() error { _, err := a.ListPolicies(ctx, TenantRef{TenantID: "nowhere"}); return err }, core.CodeNotFound, "tenantId"},
		{"relation on a type without relations", func() error {
			_, err := a.AddRelation(ctx, Relation{TenantID: "acme", SubjectID: alice.ID, Relation: "user", ResourceType: "compute-reservation", ResourceID: "rsv_1"})
			return err
		}, core.CodeInvalidInput, "resourceType"},
		{"relation the type does not declare", func() error {
			_, err := a.AddRelation(ctx, Relation{TenantID: "acme", SubjectID: alice.ID, Relation: "member", ResourceType: "compute-pool", ResourceID: "pool_1"})
			return err
		}, core.CodeInvalidInput, "relation"},
		{"relation on a type of no catalog", func() error {
			_, err := a.AddRelation(ctx, Relation{TenantID: "acme", SubjectID: alice.ID, Relation: "user", ResourceType: "pool", ResourceID: "pool_1"})
			return err
		}, core.CodeInvalidInput, "resourceType"},
		{"relation resource id", func() error {
			_, err := a.AddRelation(ctx, Relation{TenantID: "acme", SubjectID: alice.ID, Relation: "user", ResourceType: "compute-pool", ResourceID: "a/b"})
			return err
		}, core.CodeInvalidInput, "resourceId"},
		{"relation of a missing subject", func() error {
			_, err := a.AddRelation(ctx, Relation{TenantID: "acme", SubjectID: core.NewID("idn"), Relation: "user", ResourceType: "compute-pool", ResourceID: "pool_1"})
			return err
		}, core.CodeNotFound, "subjectId"},
		{"relation of another tenant's subject", func() error {
			_, err := a.AddRelation(ctx, Relation{TenantID: "root", SubjectID: alice.ID, Relation: "user", ResourceType: "compute-pool", ResourceID: "pool_1"})
			return err
		}, core.CodeNotFound, "subjectId"},
		{"remove a missing relation", func() error {
			return a.RemoveRelation(ctx, Relation{TenantID: "acme", SubjectID: alice.ID, Relation: "user", ResourceType: "compute-pool", ResourceID: "pool_9"})
		}, core.CodeNotFound, "relation"},
		{"list relations by id without type", func() error {
			_, err := a.ListRelations(ctx, ListRelationsInput{TenantID: "acme", ResourceID: "pool_1"})
			return err
		}, core.CodeInvalidInput, "resourceType"},
		{"list limit", func() error {
			_, err := a.ListRelations(ctx, ListRelationsInput{TenantID: "acme", Limit: 5000})
			return err
		}, core.CodeInvalidInput, "limit"},
		{"audit afterSeq", func() error { _, err := a.AuditEntries(ctx, AuditQuery{TenantID: "acme", AfterSeq: -1}); return err }, core.CodeInvalidInput, "afterSeq"},
		{"audit tenant", func() error { _, err := a.VerifyAudit(ctx, TenantRef{TenantID: ""}); return err }, core.CodeInvalidInput, "tenantId"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if embCode(err) != tt.code || embField(err) != tt.field {
				t.Fatalf("error = %v (details %v), want %s on %q", err, core.AsError(err).Details, tt.code, tt.field)
			}
		})
	}
}

func TestAdminTokensAreStoredHashedOnly(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	alice := env.identity("acme", KindPerson, "alice", false)
	tok := env.token(alice, SessionUser, true)
	if !tokenPattern.MatchString(tok.Token) || len(tok.Token) != 55 {
		t.Fatalf("token %q is not bc_ and 52 base32 characters", tok.Token)
	}
	var stored []byte
	var n int
	if err := env.db.Pool.QueryRow(env.ctx, `SELECT token_sha256 FROM iam_sessions WHERE id = $1`, tok.Session.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(tok.Token))
	if string(stored) != string(sum[:]) {
		t.Fatalf("the stored hash is not SHA-256 of the token")
	}
	// The plaintext is nowhere in the database: not in a session, not in the audit chain.
	if err := env.db.Pool.QueryRow(env.ctx, `SELECT
		(SELECT count(*) FROM iam_sessions s WHERE s::text LIKE '%' || $1 || '%') +
		(SELECT count(*) FROM iam_audit_entries a WHERE a::text LIKE '%' || $1 || '%')`, tok.Token[3:]).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("the plaintext token is stored in %d rows", n)
	}
	other := env.token(alice, SessionUser, true)
	if other.Token == tok.Token {
		t.Fatalf("two tokens are equal")
	}
}

func TestAdminLifecycle(t *testing.T) {
	env := newEmbTestEnv(t)
	ctx, a := env.ctx, env.admin
	tn, err := a.CreateTenant(ctx, CreateTenantInput{ID: "acme", Name: "Acme"})
	if err != nil || tn.ID != "acme" || tn.CreatedAt != env.clock.Now().UnixMilli() {
		t.Fatalf("CreateTenant = %+v, %v", tn, err)
	}
	idn, err := a.CreateIdentity(ctx, CreateIdentityInput{TenantID: "acme", Kind: KindPerson, Name: "alice", Groups: []string{"b", "a", "b"}})
	if err != nil || !core.ValidID("idn", idn.ID) || strings.Join(idn.Groups, ",") != "a,b" {
		t.Fatalf("CreateIdentity = %+v, %v", idn, err)
	}
	idn, err = a.SetIdentityGroups(ctx, SetIdentityGroupsInput{TenantID: "acme", IdentityID: idn.ID, Groups: []string{"auditors"}})
	if err != nil || strings.Join(idn.Groups, ",") != "auditors" {
		t.Fatalf("SetIdentityGroups = %+v, %v", idn, err)
	}
	got, err := a.GetIdentity(ctx, IdentityRef{TenantID: "acme", IdentityID: idn.ID})
	if err != nil || got.Name != "alice" || got.Groups[0] != "auditors" {
		t.Fatalf("GetIdentity = %+v, %v", got, err)
	}
	rootAdmin, err := a.CreateIdentity(ctx, CreateIdentityInput{TenantID: "root", Kind: KindPerson, Name: "admin", RootAuthority: true})
	if err != nil || !rootAdmin.RootAuthority {
		t.Fatalf("root authority in the root tenant: %+v, %v", rootAdmin, err)
	}

	p, err := a.PutPolicy(ctx, PutPolicyInput{TenantID: "acme", Name: "one", Cedar: permitAll})
	if err != nil || !strings.HasPrefix(p.ID, "pol_") {
		t.Fatalf("PutPolicy = %+v, %v", p, err)
	}
	env.clock.advance(time.Second)
	p2, err := a.PutPolicy(ctx, PutPolicyInput{TenantID: "acme", Name: "one", Cedar: "forbid (principal, action, resource);"})
	if err != nil || p2.ID != p.ID || p2.UpdatedAt == p2.CreatedAt {
		t.Fatalf("replacing by name: %+v, %v", p2, err)
	}
	tn, err = a.GetTenant(ctx, TenantRef{TenantID: "acme"})
	if err != nil || tn.PolicyVersion != 2 {
		t.Fatalf("policy version after two puts: %+v, %v", tn, err)
	}
	ps, err := a.ListPolicies(ctx, TenantRef{TenantID: "acme"})
	if err != nil || len(ps) != 1 || !strings.HasPrefix(ps[0].Cedar, "forbid") {
		t.Fatalf("ListPolicies = %+v, %v", ps, err)
	}

	for _, r := range []Relation{
		{TenantID: "acme", SubjectID: idn.ID, Relation: "user", ResourceType: "compute-pool", ResourceID: "pool_1"},
		{TenantID: "acme", SubjectID: idn.ID, Relation: "operator", ResourceType: "compute-node", ResourceID: "node_1"},
		{TenantID: "acme", SubjectID: idn.ID, Relation: "admin", ResourceType: "compute-project", ResourceID: "prj_1"},
	} {
		if _, err := a.AddRelation(ctx, r); err != nil {
			t.Fatalf("AddRelation(%+v) = %v", r, err)
		}
	}
	_, err = a.AddRelation(ctx, Relation{TenantID: "acme", SubjectID: idn.ID, Relation: "user", ResourceType: "compute-pool", ResourceID: "pool_1"})
	if !errors.Is(err, core.ErrConflict) {
		t.Fatalf("a duplicate relation: %v", err)
	}
	rs, err := a.ListRelations(ctx, ListRelationsInput{TenantID: "acme", SubjectID: idn.ID})
	if err != nil || len(rs) != 3 {
		t.Fatalf("ListRelations = %+v, %v", rs, err)
	}
	rs, err = a.ListRelations(ctx, ListRelationsInput{TenantID: "acme", ResourceType: "compute-pool", ResourceID: "pool_1"})
	if err != nil || len(rs) != 1 || rs[0].Relation != "user" {
		t.Fatalf("ListRelations on a pool = %+v, %v", rs, err)
	}

	tok := env.token(idn, SessionUser, false)
	s1, err := a.RevokeToken(ctx, SessionRef{TenantID: "acme", SessionID: tok.Session.ID})
	if err != nil || s1.RevokedAt == 0 {
		t.Fatalf("RevokeToken = %+v, %v", s1, err)
	}
	env.clock.advance(5 * time.Second)
	s2, err := a.RevokeToken(ctx, SessionRef{TenantID: "acme", SessionID: tok.Session.ID})
	if err != nil || s2.RevokedAt != s1.RevokedAt {
		t.Fatalf("revoking again keeps the first revocation: %+v, %v", s2, err)
	}
	d, err := a.DisableIdentity(ctx, IdentityRef{TenantID: "acme", IdentityID: idn.ID})
	if err != nil || d.DisabledAt == 0 {
		t.Fatalf("DisableIdentity = %+v, %v", d, err)
	}
	if _, err := a.CreateToken(ctx, CreateTokenInput{TenantID: "acme", IdentityID: idn.ID, SessionKind: SessionUser}); !errors.Is(err, core.ErrInvalidState) {
		t.Fatalf("a token for a disabled identity: %v", err)
	}

	// Every change is on acme's chain, as an admin entry, and it verifies.
	var methods []string
	for _, e := range env.audit("acme") {
		if e.Kind != AuditKindAdmin || !e.Allowed || e.Details["actor"] != "system" {
			t.Fatalf("admin entry = %+v", e)
		}
		methods = append(methods, strings.TrimPrefix(e.Action, "iam:admin:"))
	}
	want := "createTenant,createIdentity,setIdentityGroups,putPolicy,putPolicy,addRelation,addRelation,addRelation," +
		"createToken,revokeToken,revokeToken,disableIdentity"
	if strings.Join(methods, ",") != want {
		t.Fatalf("audited admin changes:\n got %s\nwant %s", strings.Join(methods, ","), want)
	}
	if v := env.verify("acme"); !v.OK {
		t.Fatalf("%+v", v)
	}
}

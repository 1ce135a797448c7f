package iam

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
)

// embTestResolver is a map-backed Resolver: resources by tenant, type and
// id, failures by type/id, and a count of calls.
type embTestResolver struct {
	mu    sync.Mutex
	rows  map[string]*Resolved // tenant|type/id
	fails map[string]error     // type/id
	echo  map[string]*Resolved // type/id: answer this instead (a bad echo)
	calls int
}

func newEmbTestResolver() *embTestResolver {
	return &embTestResolver{rows: map[string]*Resolved{}, fails: map[string]error{}, echo: map[string]*Resolved{}}
}

func (r *embTestResolver) put(res Resolved) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cp := res
	r.rows[res.TenantID+"|"+res.Type+"/"+res.ID] = &cp
}

func (r *embTestResolver) Resolve(_ context.Context, tenantID string, res Resource) (*Resolved, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if err, ok := r.fails[res.String()]; ok {
		return nil, err
	}
	if e, ok := r.echo[res.String()]; ok {
		cp := *e
		return &cp, nil
	}
	row, ok := r.rows[tenantID+"|"+res.String()]
	if !ok {
		return nil, core.Errorf(core.CodeNotFound, "%s not found", res)
	}
	cp := *row
	return &cp, nil
}

func (r *embTestResolver) callCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// embTestClock is a clock tests move by hand.
type embTestClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *embTestClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *embTestClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// embTestEnv is an embedded IAM and its admin service on a fresh database.
type embTestEnv struct {
	t        testing.TB
	ctx      context.Context
	db       *store.Store
	cat      *core.Catalog
	clock    *embTestClock
	resolver *embTestResolver
	admin    *Admin
	iam      *Embedded
}

func newEmbTestEnv(t testing.TB) *embTestEnv {
	t.Helper()
	db := testenv.Store(t)
	cat, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	env := &embTestEnv{t: t, ctx: context.Background(), db: db, cat: cat,
		clock: &embTestClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}, resolver: newEmbTestResolver()}
	env.admin, err = NewAdmin(AdminConfig{Store: db, Catalog: cat, Now: env.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	env.iam = env.newEmbedded(EmbeddedConfig{})
	env.tenant(DefaultRootTenantID)
	return env
}

// newEmbedded builds another Embedded on the same database (another
// process, as far as caches go); cfg's zero fields take the env's.
func (env *embTestEnv) newEmbedded(cfg EmbeddedConfig) *Embedded {
	env.t.Helper()
	if cfg.Store == nil {
		cfg.Store = env.db
	}
	if cfg.Catalog == nil {
		cfg.Catalog = env.cat
	}
	if cfg.Resolver == nil {
		cfg.Resolver = env.resolver
	}
	if cfg.Now == nil {
		cfg.Now = env.clock.Now
	}
	e, err := NewEmbedded(cfg)
	if err != nil {
		env.t.Fatal(err)
	}
	return e
}

func (env *embTestEnv) tenant(id string) {
	env.t.Helper()
	if _, err := env.admin.CreateTenant(env.ctx, CreateTenantInput{ID: id, Name: "Tenant " + id}); err != nil {
		env.t.Fatal(err)
	}
}

func (env *embTestEnv) identity(tenant, kind, name string, root bool, groups ...string) Identity {
	env.t.Helper()
	idn, err := env.admin.CreateIdentity(env.ctx, CreateIdentityInput{TenantID: tenant, Kind: kind, Name: name,
		RootAuthority: root, Groups: groups})
	if err != nil {
		env.t.Fatal(err)
	}
	return idn
}

func (env *embTestEnv) token(idn Identity, sessionKind string, mfa bool) CreatedToken {
	env.t.Helper()
	tok, err := env.admin.CreateToken(env.ctx, CreateTokenInput{TenantID: idn.TenantID, IdentityID: idn.ID,
		SessionKind: sessionKind, MFA: mfa})
	if err != nil {
		env.t.Fatal(err)
	}
	return tok
}

// caller authenticates a fresh token of idn.
func (env *embTestEnv) caller(idn Identity, sessionKind string, mfa bool) *Caller {
	env.t.Helper()
	tok := env.token(idn, sessionKind, mfa)
	c, err := env.iam.Authenticate(env.ctx, Credential{Authorization: "Bearer " + tok.Token})
	if err != nil {
		env.t.Fatal(err)
	}
	return c
}

// person is a person of the tenant with a user-session caller.
func (env *embTestEnv) person(tenant, name string, groups ...string) (Identity, *Caller) {
	env.t.Helper()
	idn := env.identity(tenant, KindPerson, name, false, groups...)
	return idn, env.caller(idn, SessionUser, false)
}

func (env *embTestEnv) policy(tenant, name, text string) {
	env.t.Helper()
	if _, err := env.admin.PutPolicy(env.ctx, PutPolicyInput{TenantID: tenant, Name: name, Cedar: text}); err != nil {
		env.t.Fatal(err)
	}
}

func (env *embTestEnv) relate(idn Identity, relation, typ, id string) {
	env.t.Helper()
	if _, err := env.admin.AddRelation(env.ctx, Relation{TenantID: idn.TenantID, SubjectID: idn.ID,
		Relation: relation, ResourceType: typ, ResourceID: id}); err != nil {
		env.t.Fatal(err)
	}
}

// audit reads a tenant's whole chain.
func (env *embTestEnv) audit(tenant string) []AuditEntry {
	env.t.Helper()
	es, err := env.admin.AuditEntries(env.ctx, AuditQuery{TenantID: tenant, Limit: MaxAdminPageSize})
	if err != nil {
		env.t.Fatal(err)
	}
	return es
}

// decisions reads a tenant's chain without the admin entries.
func (env *embTestEnv) decisions(tenant string) []AuditEntry {
	env.t.Helper()
	var out []AuditEntry
	for _, e := range env.audit(tenant) {
		if e.Kind == AuditKindDecision {
			out = append(out, e)
		}
	}
	return out
}

func (env *embTestEnv) verify(tenant string) AuditVerification {
	env.t.Helper()
	v, err := env.admin.VerifyAudit(env.ctx, TenantRef{TenantID: tenant})
	if err != nil {
		env.t.Fatal(err)
	}
	return v
}

// authorize decides and fails the test on an error.
func (env *embTestEnv) authorize(req Request) Decision {
	env.t.Helper()
	d, err := env.iam.Authorize(env.ctx, req)
	if err != nil {
		env.t.Fatalf("Authorize(%s %s): %v", req.Action, req.Resource, err)
	}
	return d
}

func embCode(err error) core.Code {
	var e *core.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// permitAll is a tenant policy that permits everything, for tests about
// what happens before the policies.
const permitAll = `permit (principal, action, resource);`

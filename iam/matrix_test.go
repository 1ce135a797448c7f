package iam_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
)

const (
	matrixRoot   = "root"
	matrixTenant = "acme"
)

// TestAuthorizationMatrix decides every (action, resource type) pair of the
// method registry against the real embedded IAM, over the real projection
// and resolver — directly, and a second time through the remote port over
// real HTTP to an IAM host: each pair is allowed only when a policy grants
// exactly it. The pairs come from the registry, not from a list in this file.
func TestAuthorizationMatrix(t *testing.T) {
	ctx := context.Background()
	st := testenv.Store(t)
	catalog, err := core.DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	registry, err := core.TableRegistry()
	if err != nil {
		t.Fatal(err)
	}
	projection := iam.NewProjection(st, iam.ProjectionOptions{Catalog: catalog,
		// The spec's 20 ms miss bound fails closed on a machine busy running
		// every test package at once; these tests assert NOT_FOUND.
		MissTimeout: 5 * time.Second})
	if err := projection.Load(ctx); err != nil {
		t.Fatal(err)
	}
	resolver, err := iam.NewProjectionResolver(iam.ProjectionResolverConfig{Projection: projection, Catalog: catalog, RootTenant: matrixRoot})
	if err != nil {
		t.Fatal(err)
	}
	embedded, err := iam.NewEmbedded(iam.EmbeddedConfig{Store: st, Catalog: catalog, Resolver: resolver, RootTenantID: matrixRoot})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := iam.NewAdmin(iam.AdminConfig{Store: st, Catalog: catalog, RootTenantID: matrixRoot})
	if err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{matrixRoot, matrixTenant} {
		if _, err := admin.CreateTenant(ctx, iam.CreateTenantInput{ID: tenant, Name: tenant}); err != nil {
			t.Fatal(err)
		}
	}

	host, err := iam.HostHandler(iam.HostConfig{Port: embedded})
	if err != nil {
		t.Fatal(err)
	}
	hostSrv := httptest.NewServer(host)
	t.Cleanup(hostSrv.Close)
	remote, err := iam.NewRemotePort(iam.RemoteConfig{BaseURL: hostSrv.URL})
	if err != nil {
		t.Fatal(err)
	}
	pairs := registry.DecisionPairs()
	if len(pairs) < 60 {
		t.Fatalf("the registry yields only %d pairs", len(pairs))
	}
	for _, mode := range []struct {
		name string
		port iam.Port
	}{{"embedded", embedded}, {"remote", remote}} {
		t.Run(mode.name, func(t *testing.T) { runMatrix(t, ctx, mode.port, st, catalog, admin, pairs) })
	}
}

func runMatrix(t *testing.T, ctx context.Context, port iam.Port, st *store.Store, catalog *core.Catalog, admin *iam.Admin, pairs []core.ActionOnType) {
	for _, pair := range pairs {
		t.Run(pair.Action+" on "+pair.Type, func(t *testing.T) {
			typ, ok := catalog.Type(pair.Type)
			if !ok {
				t.Fatalf("type %s is not in the catalog", pair.Type)
			}
			tenant, res := matrixResource(t, ctx, st, catalog, typ)
			caller := matrixCaller(t, ctx, port, admin, tenant)
			req := iam.Request{Caller: caller, TenantID: tenant, Action: pair.Action, Resource: res}
			decide := func() bool {
				t.Helper()
				d, err := port.Authorize(ctx, req)
				if err != nil {
					t.Fatalf("Authorize: %v", err)
				}
				return d.Allowed
			}
			if decide() {
				t.Fatal("allowed with no policy")
			}
			grant := func(name, action string, r iam.Resource) {
				t.Helper()
				cedar := fmt.Sprintf(`permit (principal == Identity::%q, action == Action::%q, resource == Resource::%q);`,
					caller.IdentityID, action, r.String())
				if _, err := admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: tenant, Name: name, Cedar: cedar}); err != nil {
					t.Fatalf("policy: %v", err)
				}
			}
			// Another action on this very resource grants nothing here.
			grant(caller.IdentityID+"-other", otherAction(catalog, pair.Action, typ), res)
			if decide() {
				t.Fatal("allowed by a grant of another action")
			}
			grant(caller.IdentityID, pair.Action, res)
			if !decide() {
				t.Fatal("denied although granted")
			}
			if err := port.Require(ctx, req); err != nil {
				t.Fatalf("Require after the grant: %v", err)
			}
		})
	}
}

// matrixResource makes a resolvable resource of typ and says in which tenant
// it is decided.
func matrixResource(t *testing.T, ctx context.Context, st *store.Store, catalog *core.Catalog, typ core.ResourceType) (string, iam.Resource) {
	t.Helper()
	switch typ.Name {
	case "fleet":
		return matrixRoot, iam.Resource{Type: typ.FullName, ID: core.FleetID}
	case "tenant":
		return matrixTenant, iam.Resource{Type: typ.FullName, ID: matrixTenant}
	}
	row := store.AuthzResource{Type: typ.FullName, ID: core.NewID("res"), TenantID: matrixTenant}
	if typ.Parent != "" {
		row.ParentType, row.ParentID = catalog.FullName(typ.Parent), core.NewID("parent")
	}
	if err := st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return store.PutAuthzResource(ctx, tx, row) }); err != nil {
		t.Fatal(err)
	}
	return matrixTenant, iam.Resource{Type: row.Type, ID: row.ID}
}

func matrixCaller(t *testing.T, ctx context.Context, port iam.Port, admin *iam.Admin, tenant string) *iam.Caller {
	t.Helper()
	idn, err := admin.CreateIdentity(ctx, iam.CreateIdentityInput{TenantID: tenant, Kind: iam.KindPerson, Name: "p-" + core.NewID("n")[2:12]})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CreateToken(ctx, iam.CreateTokenInput{TenantID: tenant, IdentityID: idn.ID, SessionKind: iam.SessionUser})
	if err != nil {
		t.Fatal(err)
	}
	caller, err := port.Authenticate(ctx, iam.Credential{Authorization: "Bearer " + tok.Token})
	if err != nil {
		t.Fatal(err)
	}
	return caller
}

// otherAction is an action the type carries other than action (or, for a
// type carrying one action, an action of another type).
func otherAction(c *core.Catalog, action string, typ core.ResourceType) string {
	for _, a := range typ.Actions {
		if a != action {
			return a
		}
	}
	for _, a := range c.Actions() {
		if a.Name != action {
			return a.Name
		}
	}
	return action
}

package api_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/better-compute/better-compute/api/cloudresources"
	"github.com/better-compute/better-compute/api/pools"
	pa "github.com/better-compute/better-compute/api/provideraccounts"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/iam/policies"
)

// cloudResources.kinds answers the manifests of a provider pool's
// provider, a preview available only with previews on the account and
// the module's default quota of 20; a pool that is not a provider pool is
// UNSUPPORTED, and one the tenant cannot see NOT_FOUND.
func TestCloudResourcesKinds(t *testing.T) {
	e := newProvidersEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	ref := e.putSecret("acme", "do-token", doToken)
	s := e.site(e.boot.UserToken, "acme", "do-nyc", "custom")
	for _, previews := range []bool{false, true} {
		a, err := pa.Create.Call(ctx, c, pa.CreateInput{TenantID: "acme", Provider: "digitalocean", Name: map[bool]string{false: "do", true: "do-previews"}[previews],
			CredentialRef: ref, Regions: []string{"nyc3"}, Previews: previews})
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: s.ID, Name: a.Name, Class: "provider",
			GPUModel: "H100", GPUMemoryGb: 80, ProviderAccountID: a.ID})
		if err != nil {
			t.Fatal(err)
		}
		got, err := cloudresources.Kinds.Call(ctx, c, cloudresources.KindsInput{TenantID: "acme", PoolID: pool.ID})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]cloudresources.Kind{}
		for _, k := range got.Kinds {
			seen[k.Kind] = k
		}
		pg, ok := seen["do.database.pg"]
		if got.Provider != "digitalocean" || !ok || pg.Family != "data" || !pg.Available || pg.Quota != 20 || len(pg.Spec) == 0 {
			t.Fatalf("previews %v: kinds = %+v", previews, got)
		}
		for _, k := range got.Kinds {
			if k.Preview && k.Available != previews {
				t.Errorf("previews %v: preview kind %s available %v", previews, k.Kind, k.Available)
			}
		}
	}
	vps := e.site(e.boot.UserToken, "acme", "fra-vps", "custom")
	host, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: vps.ID, Name: "vps", Class: "vps-host",
		GPUModel: "H100", GPUMemoryGb: 80})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cloudresources.Kinds.Call(ctx, c, cloudresources.KindsInput{TenantID: "acme", PoolID: host.ID}); core.AsError(err).Code != core.CodeUnsupported ||
		core.AsError(err).Details["reason"] != "notProviderPool" {
		t.Fatalf("a vps-host pool = %v", err)
	}
	if _, err := cloudresources.Kinds.Call(ctx, c, cloudresources.KindsInput{TenantID: "acme", PoolID: core.NewID("pool")}); core.AsError(err).Code != core.CodeNotFound {
		t.Fatalf("an unknown pool = %v", err)
	}
}

// The shipped data-cloud-resources example policy decides on real drafts:
// with it a tenant creates a managed database (family data) and is
// refused an App Platform app (family platform), and the refused draft
// leaves nothing listed.
func TestCloudResourcesDataPolicyOnRealDrafts(t *testing.T) {
	e := newProvidersEnv(t)
	ctx := context.Background()
	data, ok := policies.Get("data-cloud-resources")
	if !ok {
		t.Fatal("the data-family example policy is not shipped")
	}
	if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "acme", Name: "data-only", Cedar: data}); err != nil {
		t.Fatal(err)
	}
	c := e.client(e.boot.UserToken)
	ref := e.putSecret("acme", "do-token", doToken)
	s := e.site(e.boot.UserToken, "acme", "do-nyc", "custom")
	a, err := pa.Create.Call(ctx, c, pa.CreateInput{TenantID: "acme", Provider: "digitalocean", Name: "do", CredentialRef: ref})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: s.ID, Name: "do", Class: "provider",
		GPUModel: "H100", GPUMemoryGb: 80, ProviderAccountID: a.ID})
	if err != nil {
		t.Fatal(err)
	}
	db, err := cloudresources.Create.Call(ctx, c, cloudresources.CreateInput{TenantID: "acme", PoolID: pool.ID, Kind: "do.database.pg",
		Name: "orders", Spec: json.RawMessage(`{"region":"nyc3","size":"db-s-1vcpu-1gb"}`), IdempotencyKey: "db"})
	if err != nil || db.State != "pending" || db.Family != "data" {
		t.Fatalf("a database under the data policy = %+v, %v", db, err)
	}
	_, err = cloudresources.Create.Call(ctx, c, cloudresources.CreateInput{TenantID: "acme", PoolID: pool.ID, Kind: "do.app",
		Name: "web", Spec: json.RawMessage(`{"region":"nyc"}`), IdempotencyKey: "app"})
	if core.AsError(err).Code != core.CodeAccessDenied {
		t.Fatalf("an app under the data policy = %v", err)
	}
	// description is better-compute's alone: set, then cleared by null;
	// every update bumps version.
	desc := "the orders database"
	up, err := cloudresources.Update.Call(ctx, c, cloudresources.UpdateInput{TenantID: "acme", ResourceID: db.ID, Description: &desc})
	if err != nil || up.Description != desc || up.Version != db.Version+1 || up.State != "pending" {
		t.Fatalf("a description update = %+v, %v", up, err)
	}
	var cleared cloudresources.Resource
	if err := c.Call(ctx, "cloudResources.update", map[string]any{"tenantId": "acme", "resourceId": db.ID, "description": nil}, &cleared); err != nil ||
		cleared.Description != "" || cleared.Version != up.Version+1 {
		t.Fatalf("description null = %+v, %v", cleared, err)
	}
	l, err := cloudresources.List.Call(ctx, c, cloudresources.ListInput{TenantID: "acme", IncludeDeleted: true})
	if err != nil || len(l.Items) != 1 || l.Items[0].ID != db.ID {
		t.Fatalf("list after a refusal = %+v, %v", l, err)
	}
}

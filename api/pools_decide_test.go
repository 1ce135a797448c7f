package api_test

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
)

// pools.create decides as sites.create does: on compute-fleet for a pool on
// a shared or dedicated site (the platform's hardware), on compute-tenant
// for one on a custom site. An operator allowed to create pools in the
// tenant but not on the fleet is refused on the shared site and not on the
// custom one; the audit row names the resource each was decided on.
func TestPoolsCreateDecidesOnTheSitesKind(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	root := api.DefaultRootTenant
	if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: root, Name: "tenant-pools", Cedar: `permit (
  principal in Group::"pool-ops",
  action == Action::"compute:pools:create",
  resource is Resource
) when { resource.type == "compute-tenant" && resource.tenantId == principal.tenantId };`}); err != nil {
		t.Fatal(err)
	}
	ops := e.person(root, "ops", []string{"pool-ops"})
	shared := e.site(e.boot.AdminToken, root, "shared-1", "shared")
	dedicated := e.site(e.boot.AdminToken, root, "dedicated-1", "dedicated")
	custom := e.site(e.boot.AdminToken, root, "custom-1", "custom")
	acmeSite := e.site(e.boot.UserToken, "acme", "acme-1", "custom")

	create := func(token, tenant, siteID, name string) (pools.Pool, error) {
		return pools.Create.Call(ctx, e.client(token), pools.CreateInput{
			TenantID: tenant, SiteID: siteID, Name: name, Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80})
	}
	for _, s := range []string{shared.ID, dedicated.ID} {
		if _, err := create(ops, root, s, "on-"+s[len(s)-6:]); codeOf(err) != core.CodeAccessDenied {
			t.Fatalf("a tenant-only operator's pool on a platform site: %v, want ACCESS_DENIED", err)
		}
	}
	decidedOn := func(p pools.Pool) string {
		t.Helper()
		var typ, id string
		if err := e.store.Pool.QueryRow(ctx, `SELECT resource_type, resource_id FROM audit_events
			WHERE method = 'pools.create' AND tenant_id = $1 ORDER BY at DESC, id DESC LIMIT 1`, p.TenantID).Scan(&typ, &id); err != nil {
			t.Fatal(err)
		}
		return typ + "/" + id
	}
	p, err := create(ops, root, custom.ID, "on-custom")
	if err != nil {
		t.Fatalf("a tenant-only operator's pool on the root tenant's custom site: %v", err)
	}
	if got := decidedOn(p); got != "compute-tenant/"+root {
		t.Fatalf("a pool on a custom site was decided on %s, want compute-tenant/%s", got, root)
	}
	p, err = create(e.boot.AdminToken, root, shared.ID, "on-shared")
	if err != nil {
		t.Fatalf("root's pool on a shared site: %v", err)
	}
	if got := decidedOn(p); got != "compute-fleet/"+core.FleetID {
		t.Fatalf("a pool on a shared site was decided on %s, want compute-fleet/%s", got, core.FleetID)
	}
	// A platform site is not in a tenant's view: a pool on it is the root
	// tenant's to create.
	if _, err := create(e.boot.UserToken, "acme", shared.ID, "acme-on-shared"); codeOf(err) != core.CodeNotFound {
		t.Fatalf("acme's pool on a shared site: %v, want NOT_FOUND", err)
	}
	p, err = create(e.boot.UserToken, "acme", acmeSite.ID, "on-acme")
	if err != nil {
		t.Fatalf("acme's pool on its custom site: %v", err)
	}
	if got := decidedOn(p); got != "compute-tenant/acme" {
		t.Fatalf("acme's pool on its custom site was decided on %s, want compute-tenant/acme", got)
	}
}

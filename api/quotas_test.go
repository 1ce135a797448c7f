package api_test

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/core"
)

// Quotas are the offers' quotas: quotas.get reads what a tenant was
// offered; quotas.set is the fleet's (root tenant only).
func TestQuotas(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, g, root := e.client(e.boot.UserToken), e.client(e.globex), e.client(e.boot.AdminToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.pool(e.boot.UserToken, "acme", s.ID, "h100")
	other := e.pool(e.boot.UserToken, "acme", s.ID, "spare")
	if _, err := pools.Offer.Call(ctx, a, pools.OfferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex", Quota: map[string]int64{"gpu": 8}}); err != nil {
		t.Fatal(err)
	}
	q, err := pools.QuotasGet.Call(ctx, g, pools.QuotasGetInput{TenantID: "globex", PoolID: ""})
	if err != nil || len(q.Items) != 1 || q.Items[0].PoolID != p.ID || q.Items[0].Quota["gpu"] != 8 || q.Items[0].Quota["vcpu"] != 0 {
		t.Fatalf("globex quotas = %+v, %v", q, err)
	}
	if q, err := pools.QuotasGet.Call(ctx, g, pools.QuotasGetInput{TenantID: "globex", PoolID: p.ID}); err != nil || len(q.Items) != 1 {
		t.Fatalf("globex quota on the pool = %+v, %v", q, err)
	}
	// A pool outside the view is NOT_FOUND; the tenant's own pool has no offer.
	if _, err := pools.QuotasGet.Call(ctx, g, pools.QuotasGetInput{TenantID: "globex", PoolID: other.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("quota on a pool not offered = %v, want NOT_FOUND", err)
	}
	if q, err := pools.QuotasGet.Call(ctx, a, pools.QuotasGetInput{TenantID: "acme", PoolID: p.ID}); err != nil || len(q.Items) != 0 {
		t.Fatalf("acme's quota on its own pool = %+v, %v", q, err)
	}
	// quotas.set is decided on compute-fleet, in the root tenant.
	if _, err := pools.QuotasSet.Call(ctx, a, pools.QuotasSetInput{TenantID: "acme", PoolID: p.ID, Quota: map[string]int64{"gpu": 1}}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("acme user quotas.set = %v, want ACCESS_DENIED", err)
	}
	if _, err := pools.QuotasSet.Call(ctx, g, pools.QuotasSetInput{TenantID: "globex", PoolID: p.ID, Quota: map[string]int64{"gpu": 100}}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex raising its own quota = %v, want ACCESS_DENIED", err)
	}
	o, err := pools.QuotasSet.Call(ctx, root, pools.QuotasSetInput{TenantID: "globex", PoolID: p.ID, Quota: map[string]int64{"gpu": 4, "memoryGiB": 512}})
	if err != nil || o.TenantID != "globex" || o.Quota["gpu"] != 4 || o.Quota["memoryGiB"] != 512 {
		t.Fatalf("root quotas.set = %+v, %v", o, err)
	}
	// One source of truth: the offer carries the new quota.
	if got, err := pools.Get.Call(ctx, g, pools.PoolInput{TenantID: "globex", PoolID: p.ID}); err != nil || got.Offer == nil || got.Offer.Quota["gpu"] != 4 {
		t.Fatalf("globex pool after quotas.set = %+v, %v", got, err)
	}
	if _, err := pools.QuotasSet.Call(ctx, root, pools.QuotasSetInput{TenantID: "globex", PoolID: other.ID, Quota: map[string]int64{"gpu": 1}}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("quotas.set on a pool not offered = %v, want NOT_FOUND", err)
	}
	if _, err := pools.QuotasSet.Call(ctx, root, pools.QuotasSetInput{TenantID: "globex", PoolID: core.NewID("pool"), Quota: pools.Quota{}}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("quotas.set on a missing pool = %v, want NOT_FOUND", err)
	}
	// Unoffer: the quota goes with the offer.
	if _, err := pools.Unoffer.Call(ctx, a, pools.UnofferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex"}); err != nil {
		t.Fatal(err)
	}
	if q, err := pools.QuotasGet.Call(ctx, g, pools.QuotasGetInput{TenantID: "globex", PoolID: ""}); err != nil || len(q.Items) != 0 {
		t.Fatalf("globex quotas after unoffer = %+v, %v", q, err)
	}
	if _, err := pools.QuotasSet.Call(ctx, root, pools.QuotasSetInput{TenantID: "globex", PoolID: p.ID, Quota: map[string]int64{"gpu": 1}}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("quotas.set after unoffer = %v, want NOT_FOUND", err)
	}
	// Archived pools refuse quota changes.
	if _, err := pools.Offer.Call(ctx, a, pools.OfferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Archive.Call(ctx, a, pools.PoolInput{TenantID: "acme", PoolID: p.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := pools.QuotasSet.Call(ctx, root, pools.QuotasSetInput{TenantID: "globex", PoolID: p.ID, Quota: map[string]int64{"gpu": 1}}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("quotas.set on an archived pool = %v, want INVALID_STATE", err)
	}
}

func TestQuotasInvalidInput(t *testing.T) {
	e := newEnv(t)
	pool := core.NewID("pool")
	e.wantInvalid(e.boot.UserToken, "quotas.get", map[string]string{
		`{"tenantId":"acme","poolId":"prj_x"}`: "poolId",
		`{"tenantId":"acme","resource":"gpu"}`: "resource",
	})
	e.wantInvalid(e.boot.AdminToken, "quotas.set", map[string]string{
		`{"tenantId":"acme","poolId":"` + pool + `"}`:                         "quota",
		`{"tenantId":"acme","quota":{}}`:                                      "poolId",
		`{"tenantId":"acme","poolId":"` + pool + `","quota":[]}`:              "quota",
		`{"tenantId":"acme","poolId":"` + pool + `","quota":{},"priority":1}`: "priority",
	})
	// Quota values are checked by the handler, after the decision.
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.pool(e.boot.UserToken, "acme", s.ID, "h100")
	e.wantInvalid(e.boot.AdminToken, "quotas.set", map[string]string{
		`{"tenantId":"globex","poolId":"` + p.ID + `","quota":{"gpu":-2}}`:  "quota.gpu",
		`{"tenantId":"globex","poolId":"` + p.ID + `","quota":{"gpu":"8"}}`: "quota.gpu",
	})
}

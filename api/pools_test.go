package api_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/api/pools"
	pa "github.com/better-compute/better-compute/api/provideraccounts"
	"github.com/better-compute/better-compute/api/sites"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// pool makes an H100 metal-host pool in tenant on site.
func (e *env) pool(token, tenant, siteID, name string) pools.Pool {
	e.t.Helper()
	p, err := pools.Create.Call(context.Background(), e.client(token), pools.CreateInput{
		TenantID: tenant, SiteID: siteID, Name: name, Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80})
	if err != nil {
		e.t.Fatalf("pools.create %s/%s: %v", tenant, name, err)
	}
	return p
}

func TestPoolsLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: s.ID, Name: "train", Class: "metal-host",
		GPUModel: "H100", GPUMemoryGb: 80, Sharing: "timeslice",
		Policy: policyOf(t, `{"acceptance":["burn-in"],"overcommit":{"vcpu":2},"lostAfter":"5m","admission":{"budgetCheck":true},
			"maxPending":10,"hardwareProfile":"hp-1","sharing":{"replicas":4},"tenantRoot":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	if !core.ValidID("pool", p.ID) || p.TenantID != "acme" || p.SiteID != s.ID || p.Region != "eu-central" || p.Agent != "bcd" ||
		p.Sharing != "timeslice" || p.Policy.DisruptionBudget == nil || *p.Policy.DisruptionBudget != 0.05 ||
		p.Policy.Sharing.Replicas != 4 || p.Policy.LostAfter != "5m" || !p.Policy.TenantRoot || p.Offer != nil {
		t.Fatalf("created %+v", p)
	}
	row, err := store.GetAuthzResource(ctx, e.store.Pool, "compute-pool", p.ID)
	want := map[string]any{"region": "eu-central", "class": "metal-host", "gpuModel": "H100", "gpuMemoryGb": float64(80), "sharing": "timeslice"}
	if err != nil || row.TenantID != "acme" || len(row.SharedWith) != 0 || len(row.Attributes) != len(want) {
		t.Fatalf("authz row = %+v, %v", row, err)
	}
	for k, v := range want {
		if row.Attributes[k] != v {
			t.Fatalf("authz attribute %s = %v, want %v", k, row.Attributes[k], v)
		}
	}
	// Defaults: exclusive sharing; a provider pool's agent is none.
	// A provider pool names an account of its own tenant: another's, or
	// none, is NOT_FOUND.
	if _, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: s.ID, Name: "cloud", Class: "provider",
		GPUModel: "L40S", GPUMemoryGb: 48, ProviderAccountID: core.NewID("pacct")}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("a provider pool on a missing account = %v, want NOT_FOUND", err)
	}
	account, err := pa.Create.Call(ctx, c, pa.CreateInput{TenantID: "acme", Provider: "digitalocean", Name: "do",
		CredentialRef: e.putSecret("acme", "do-token", doToken)})
	if err != nil {
		t.Fatal(err)
	}
	prov, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: s.ID, Name: "cloud", Class: "provider",
		GPUModel: "L40S", GPUMemoryGb: 48, ProviderAccountID: account.ID})
	if err != nil || prov.Sharing != "exclusive" || prov.Agent != "none" || prov.ProviderAccountID == "" {
		t.Fatalf("provider pool = %+v, %v", prov, err)
	}
	if _, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: s.ID, Name: "train", Class: "vps-host", GPUModel: "A100", GPUMemoryGb: 40}); codeOf(err) != core.CodeConflict {
		t.Fatalf("duplicate name = %v, want CONFLICT", err)
	}
	if got, err := pools.Get.Call(ctx, c, pools.PoolInput{TenantID: "acme", PoolID: p.ID}); err != nil || got.ID != p.ID || got.Policy.Sharing.Replicas != 4 {
		t.Fatalf("get = %+v, %v", got, err)
	}
	if list, err := pools.List.Call(ctx, c, pools.ListInput{TenantID: "acme"}); err != nil || len(list.Items) != 2 {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if list, err := pools.List.Call(ctx, c, pools.ListInput{TenantID: "acme", Class: "provider"}); err != nil || len(list.Items) != 1 || list.Items[0].ID != prov.ID {
		t.Fatalf("list of provider pools = %+v, %v", list, err)
	}
	// Update: the policy is replaced whole and checked against the sharing.
	name, mig := "train-2", "mig"
	if _, err := pools.Update.Call(ctx, c, pools.UpdateInput{TenantID: "acme", PoolID: p.ID, Sharing: &mig}); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("mig with sharing.replicas kept = %v, want INVALID_INPUT", err)
	}
	up, err := pools.Update.Call(ctx, c, pools.UpdateInput{TenantID: "acme", PoolID: p.ID, Name: &name, Sharing: &mig,
		Policy: policyOf(t, `{"migLayout":"all-1g.10gb","disruptionBudget":0.2}`)})
	if err != nil || up.Name != "train-2" || up.Sharing != "mig" || up.Policy.MigLayout != "all-1g.10gb" || *up.Policy.DisruptionBudget != 0.2 || up.Policy.Sharing != nil {
		t.Fatalf("update = %+v, %v", up, err)
	}
	if row, _ := store.GetAuthzResource(ctx, e.store.Pool, "compute-pool", p.ID); row.Attributes["sharing"] != "mig" {
		t.Fatalf("authz row after update = %+v", row)
	}
	if _, err := pools.Update.Call(ctx, c, pools.UpdateInput{TenantID: "acme", PoolID: prov.ID, Name: &name}); codeOf(err) != core.CodeConflict {
		t.Fatalf("rename onto a taken name = %v, want CONFLICT", err)
	}
	// The pool's region is its site's: a new site region reaches its row.
	west := "eu-west"
	if _, err := sites.Update.Call(ctx, c, sites.UpdateInput{TenantID: "acme", SiteID: s.ID, Region: &west}); err != nil {
		t.Fatal(err)
	}
	if row, _ := store.GetAuthzResource(ctx, e.store.Pool, "compute-pool", p.ID); row.Attributes["region"] != "eu-west" {
		t.Fatalf("pool's authz row after the site moved = %+v", row)
	}
	if got, err := pools.Get.Call(ctx, c, pools.PoolInput{TenantID: "acme", PoolID: p.ID}); err != nil || got.Region != "eu-west" {
		t.Fatalf("pool after the site moved = %+v, %v", got, err)
	}
	// A site with live pools cannot be deleted.
	if _, err := sites.Delete.Call(ctx, c, sites.SiteInput{TenantID: "acme", SiteID: s.ID}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("delete of a site with pools = %v, want INVALID_STATE", err)
	}
	arch, err := pools.Archive.Call(ctx, c, pools.PoolInput{TenantID: "acme", PoolID: p.ID})
	if err != nil || arch.ArchivedAt == nil {
		t.Fatalf("archive = %+v, %v", arch, err)
	}
	if _, err := pools.Archive.Call(ctx, c, pools.PoolInput{TenantID: "acme", PoolID: p.ID}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("second archive = %v, want INVALID_STATE", err)
	}
	if _, err := pools.Update.Call(ctx, c, pools.UpdateInput{TenantID: "acme", PoolID: p.ID, Name: &name}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("update of an archived pool = %v, want INVALID_STATE", err)
	}
	if _, err := pools.Offer.Call(ctx, c, pools.OfferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex"}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("offer of an archived pool = %v, want INVALID_STATE", err)
	}
	if list, err := pools.List.Call(ctx, c, pools.ListInput{TenantID: "acme"}); err != nil || len(list.Items) != 1 || list.Items[0].ID != prov.ID {
		t.Fatalf("list after archive = %+v, %v", list, err)
	}
	// A deleted site takes no pools.
	if _, err := pools.Archive.Call(ctx, c, pools.PoolInput{TenantID: "acme", PoolID: prov.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := sites.Delete.Call(ctx, c, sites.SiteInput{TenantID: "acme", SiteID: s.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: s.ID, Name: "late", Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("pool on a deleted site = %v, want INVALID_STATE", err)
	}
}

func TestPoolsInvalidInput(t *testing.T) {
	e := newEnv(t)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	base := `"tenantId":"acme","siteId":"` + s.ID + `","name":"p","gpuMemoryGb":80`
	e.wantInvalid(e.boot.UserToken, "pools.create", map[string]string{
		`{` + base + `,"class":"gpu","gpuModel":"H100"}`:                                                                  "class",
		`{` + base + `,"class":"metal-host","gpuModel":"h100"}`:                                                           "gpuModel",
		`{` + base + `,"class":"metal-host"}`:                                                                             "gpuModel",
		`{` + base + `,"class":"metal-host","gpuModel":"H999"}`:                                                           "gpuModel",
		`{` + base + `,"class":"metal-host","gpuModel":"H100","bogus":1}`:                                                 "bogus",
		`{` + base + `,"class":"metal-host","gpuModel":"H100","sharing":"shared"}`:                                        "sharing",
		`{` + base + `,"class":"metal-host","gpuModel":"H100","policy":[]}`:                                               "policy",
		`{` + base + `,"class":"metal-host","gpuModel":"H100","policy":{"bogus":1}}`:                                      "policy.bogus",
		`{` + base + `,"class":"metal-host","gpuModel":"H100","policy":{"admission":{"x":true}}}`:                         "policy.admission.x",
		`{` + base + `,"class":"metal-host","gpuModel":"H100","policy":{"disruptionBudget":1.5}}`:                         "policy.disruptionBudget",
		`{` + base + `,"class":"metal-host","gpuModel":"H100","policy":{"lostAfter":"soon"}}`:                             "policy.lostAfter",
		`{` + base + `,"class":"metal-host","gpuModel":"H100","policy":{"migLayout":"all-1g"}}`:                           "policy.migLayout",
		`{` + base + `,"class":"metal-host","gpuModel":"H100","policy":{"sharing":{"replicas":4}}}`:                       "policy.sharing.replicas",
		`{` + base + `,"class":"metal-host","gpuModel":"H100","policy":{"overcommit":{"vcpu":0.5}}}`:                      "policy.overcommit",
		`{` + base + `,"class":"provider","gpuModel":"H100"}`:                                                             "providerAccountId",
		`{` + base + `,"class":"metal-host","gpuModel":"H100","providerAccountId":"` + core.NewID("pacct") + `"}`:         "providerAccountId",
		`{"tenantId":"acme","siteId":"` + s.ID + `","name":"p","class":"metal-host","gpuModel":"H100","gpuMemoryGb":0}`:   "gpuMemoryGb",
		`{"tenantId":"acme","siteId":"` + s.ID + `","name":"p","class":"metal-host","gpuModel":"H100","gpuMemoryGb":1.5}`: "gpuMemoryGb",
	})
	pool := core.NewID("pool")
	e.wantInvalid(e.boot.UserToken, "pools.get", map[string]string{`{"tenantId":"acme","poolId":"site_x"}`: "poolId"})
	e.wantInvalid(e.boot.UserToken, "pools.list", map[string]string{`{"tenantId":"acme","class":"x"}`: "class", `{"tenantId":"acme","offset":1}`: "offset", `{"tenantId":"acme","limit":0}`: "limit"})
	e.wantInvalid(e.boot.UserToken, "pools.update", map[string]string{
		`{"tenantId":"acme","poolId":"` + pool + `","class":"provider"}`: "class", // class never changes
		`{"tenantId":"acme","poolId":"` + pool + `","gpuModel":"A100"}`:  "gpuModel",
	})
	e.wantInvalid(e.boot.UserToken, "pools.archive", map[string]string{`{"tenantId":"acme"}`: "poolId"})
	// What only the handler checks is checked after the decision on the
	// pool, so it needs a pool that exists.
	real := e.pool(e.boot.UserToken, "acme", s.ID, "real").ID
	e.wantInvalid(e.boot.UserToken, "pools.offer", map[string]string{
		`{"tenantId":"acme","poolId":"` + real + `","toTenantId":"acme"}`:                       "toTenantId",
		`{"tenantId":"acme","poolId":"` + real + `","toTenantId":"globex","quota":{"gpu":-1}}`:  "quota.gpu",
		`{"tenantId":"acme","poolId":"` + real + `","toTenantId":"globex","quota":{"gpu":1.5}}`: "quota.gpu",
		`{"tenantId":"acme","poolId":"` + real + `","toTenantId":"globex","quota":{"GPU!":1}}`:  "quota.GPU!",
		`{"tenantId":"acme","poolId":"` + pool + `"}`:                                           "toTenantId",
		`{"tenantId":"acme","poolId":"` + pool + `","toTenantId":"a b"}`:                        "toTenantId",
		`{"tenantId":"acme","poolId":"` + pool + `","toTenantId":"globex","priority":"high"}`:   "priority",
	})
	e.wantInvalid(e.boot.UserToken, "pools.update", map[string]string{
		`{"tenantId":"acme","poolId":"` + real + `","gpuMemoryGb":0}`:                                   "gpuMemoryGb",
		`{"tenantId":"acme","poolId":"` + real + `","policy":{"tenantroot":true}}`:                      "policy.tenantroot",
		`{"tenantId":"acme","poolId":"` + real + `","providerAccountId":"` + core.NewID("pacct") + `"}`: "providerAccountId",
	})
	e.wantInvalid(e.boot.UserToken, "pools.unoffer", map[string]string{`{"tenantId":"acme","poolId":"` + pool + `"}`: "toTenantId"})
}

func TestPoolsNotFound(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	gs := e.site(e.globex, "globex", "nyc-1", "custom")
	// Another tenant's site is not in acme's view.
	if _, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "acme", SiteID: gs.ID, Name: "p", Class: "metal-host", GPUModel: "H100", GPUMemoryGb: 80}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("pool on globex's site = %v, want NOT_FOUND", err)
	}
	gp := e.pool(e.globex, "globex", gs.ID, "gp")
	missing := core.NewID("pool")
	name := "x"
	for _, id := range []string{missing, gp.ID} {
		if _, err := pools.Get.Call(ctx, c, pools.PoolInput{TenantID: "acme", PoolID: id}); codeOf(err) != core.CodeNotFound {
			t.Errorf("get %s = %v, want NOT_FOUND", id, err)
		}
		if _, err := pools.Update.Call(ctx, c, pools.UpdateInput{TenantID: "acme", PoolID: id, Name: &name}); codeOf(err) != core.CodeNotFound {
			t.Errorf("update %s = %v, want NOT_FOUND", id, err)
		}
		if _, err := pools.Archive.Call(ctx, c, pools.PoolInput{TenantID: "acme", PoolID: id}); codeOf(err) != core.CodeNotFound {
			t.Errorf("archive %s = %v, want NOT_FOUND", id, err)
		}
		if _, err := pools.Offer.Call(ctx, c, pools.OfferInput{TenantID: "acme", PoolID: id, ToTenantID: "initech"}); codeOf(err) != core.CodeNotFound {
			t.Errorf("offer %s = %v, want NOT_FOUND", id, err)
		}
		if _, err := pools.Unoffer.Call(ctx, c, pools.UnofferInput{TenantID: "acme", PoolID: id, ToTenantID: "initech"}); codeOf(err) != core.CodeNotFound {
			t.Errorf("unoffer %s = %v, want NOT_FOUND", id, err)
		}
	}
	if list, err := pools.List.Call(ctx, c, pools.ListInput{TenantID: "acme"}); err != nil || len(list.Items) != 0 {
		t.Fatalf("acme's list = %+v, %v", list, err)
	}
}

// An offer puts acme's pool in globex's view (get, list, the projection's
// sharedWith), without letting globex change it; unoffer takes it away.
func TestPoolsOfferAndUnoffer(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, g := e.client(e.boot.UserToken), e.client(e.globex)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.pool(e.boot.UserToken, "acme", s.ID, "shared-h100")
	// Resolve the pool once, so the projection holds its row before the offer.
	if _, err := pools.Get.Call(ctx, a, pools.PoolInput{TenantID: "acme", PoolID: p.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Get.Call(ctx, g, pools.PoolInput{TenantID: "globex", PoolID: p.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex get before the offer = %v, want NOT_FOUND", err)
	}
	prio := 5
	o, err := pools.Offer.Call(ctx, a, pools.OfferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex",
		Quota: map[string]int64{"gpu": 8, "vcpu": 64}, Priority: &prio, IncludeDescendants: true})
	if err != nil || o.PoolID != p.ID || o.TenantID != "globex" || o.Quota["gpu"] != 8 || o.Priority == nil || *o.Priority != 5 || !o.IncludeDescendants {
		t.Fatalf("offer = %+v, %v", o, err)
	}
	if row, err := store.GetAuthzResource(ctx, e.store.Pool, "compute-pool", p.ID); err != nil || !slices.Equal(row.SharedWith, []string{"globex"}) {
		t.Fatalf("authz row after the offer = %+v, %v", row, err)
	}
	got, err := pools.Get.Call(ctx, g, pools.PoolInput{TenantID: "globex", PoolID: p.ID})
	if err != nil || got.ID != p.ID || got.TenantID != "acme" || got.Offer == nil || got.Offer.Quota["gpu"] != 8 {
		t.Fatalf("globex get = %+v, %v", got, err)
	}
	list, err := pools.List.Call(ctx, g, pools.ListInput{TenantID: "globex"})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != p.ID {
		t.Fatalf("globex list = %+v, %v", list, err)
	}
	// Offered is not owned: globex cannot change it.
	name := "mine"
	if _, err := pools.Update.Call(ctx, g, pools.UpdateInput{TenantID: "globex", PoolID: p.ID, Name: &name}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex update = %v, want NOT_FOUND", err)
	}
	if _, err := pools.Archive.Call(ctx, g, pools.PoolInput{TenantID: "globex", PoolID: p.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex archive = %v, want NOT_FOUND", err)
	}
	if _, err := pools.Offer.Call(ctx, g, pools.OfferInput{TenantID: "globex", PoolID: p.ID, ToTenantID: "initech"}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex re-offer = %v, want NOT_FOUND", err)
	}
	// Offering again replaces the offer (one row per pool and tenant).
	if o, err := pools.Offer.Call(ctx, a, pools.OfferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex", Quota: map[string]int64{"gpu": 2}}); err != nil ||
		o.Quota["gpu"] != 2 || o.Quota["vcpu"] != 0 || o.Priority != nil || o.IncludeDescendants {
		t.Fatalf("second offer = %+v, %v", o, err)
	}
	var offers int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM pool_offers WHERE pool_id = $1`, p.ID).Scan(&offers); err != nil || offers != 1 {
		t.Fatalf("%d offers, %v", offers, err)
	}
	if un, err := pools.Unoffer.Call(ctx, a, pools.UnofferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex"}); err != nil || un.TenantID != "globex" {
		t.Fatalf("unoffer = %+v, %v", un, err)
	}
	if _, err := pools.Get.Call(ctx, g, pools.PoolInput{TenantID: "globex", PoolID: p.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex get after unoffer = %v, want NOT_FOUND", err)
	}
	if list, err := pools.List.Call(ctx, g, pools.ListInput{TenantID: "globex"}); err != nil || len(list.Items) != 0 {
		t.Fatalf("globex list after unoffer = %+v, %v", list, err)
	}
	if row, err := store.GetAuthzResource(ctx, e.store.Pool, "compute-pool", p.ID); err != nil || len(row.SharedWith) != 0 {
		t.Fatalf("authz row after unoffer = %+v, %v", row, err)
	}
	if _, err := pools.Unoffer.Call(ctx, a, pools.UnofferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex"}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("second unoffer = %v, want NOT_FOUND", err)
	}
	// acme still has it.
	if list, err := pools.List.Call(ctx, a, pools.ListInput{TenantID: "acme"}); err != nil || len(list.Items) != 1 {
		t.Fatalf("acme list = %+v, %v", list, err)
	}
}

// policyOf reads a pool policy written as JSON ("" is none).
func policyOf(t testing.TB, raw string) *pools.Policy {
	t.Helper()
	if raw == "" {
		return nil
	}
	var p pools.Policy
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		t.Fatalf("policy %s: %v", raw, err)
	}
	return &p
}

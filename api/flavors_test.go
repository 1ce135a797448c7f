package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api/flavors"
	"github.com/better-compute/better-compute/api/pools"
	pa "github.com/better-compute/better-compute/api/provideraccounts"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	flavorstore "github.com/better-compute/better-compute/store/flavors"
)

// classPool makes a pool of class in acme on site (provider pools name
// account).
func (e *env) classPool(siteID, name, class, sharing, policy, account string) pools.Pool {
	e.t.Helper()
	in := pools.CreateInput{TenantID: "acme", SiteID: siteID, Name: name, Class: class, GPUModel: "H100", GPUMemoryGb: 80,
		Sharing: sharing, ProviderAccountID: account}
	if policy != "" {
		in.Policy = policyOf(e.t, policy)
	}
	p, err := pools.Create.Call(context.Background(), e.client(e.boot.UserToken), in)
	if err != nil {
		e.t.Fatalf("pools.create %s: %v", name, err)
	}
	return p
}

func TestFlavorsLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	vps := e.classPool(s.ID, "vps", "vps-host", "", "", "")
	sliced := e.classPool(s.ID, "sliced", "vps-host", "timeslice", `{"sharing":{"replicas":4}}`, "")
	metal := e.classPool(s.ID, "metal", "metal-host", "", "", "")
	account, err := pa.Create.Call(ctx, c, pa.CreateInput{TenantID: "acme", Provider: "digitalocean", Name: "do",
		CredentialRef: e.putSecret("acme", "do-token", doToken)})
	if err != nil {
		t.Fatal(err)
	}
	prov := e.classPool(s.ID, "droplets", "provider", "", "", account.ID)

	body := func(pool, rest string) string { return `{"tenantId":"acme","poolId":"` + pool + `",` + rest + `}` }
	// The schema's bounds.
	e.wantInvalid(e.boot.UserToken, "flavors.create", map[string]string{
		body(vps.ID, `"name":"x","vcpu":0,"memoryGiB":1,"runtime":"container"`):    "vcpu",
		body(vps.ID, `"name":"x","vcpu":257,"memoryGiB":1,"runtime":"container"`):  "vcpu",
		body(vps.ID, `"name":"x","vcpu":1,"memoryGiB":0.03,"runtime":"container"`): "memoryGiB",
		body(vps.ID, `"name":"x","vcpu":1,"memoryGiB":5000,"runtime":"container"`): "memoryGiB",
		body(vps.ID, `"name":"x","vcpu":1,"memoryGiB":1,"gpus":17,"runtime":"vm"`): "gpus",
		body(vps.ID, `"name":"x","vcpu":1,"memoryGiB":1,"runtime":"lxc"`):          "runtime",
		body(vps.ID, `"name":"X","vcpu":1,"memoryGiB":1,"runtime":"vm"`):           "name",
		body(vps.ID, `"vcpu":1,"memoryGiB":1,"runtime":"vm"`):                      "name",
	})
	// The pool's class.
	for _, tc := range []struct {
		name, body, field, reason string
	}{
		{"a metal pool", body(metal.ID, `"name":"x","vcpu":1,"memoryGiB":1,"runtime":"container"`), "poolId", "poolClass"},
		{"no runtime on vps-host", body(vps.ID, `"name":"x","vcpu":1,"memoryGiB":1`), "runtime", "required"},
		{"a size on vps-host", body(vps.ID, `"name":"x","vcpu":1,"memoryGiB":1,"runtime":"vm","providerSize":"s-1vcpu-1gb"`), "providerSize", "poolClass"},
		{"no size on a provider pool", body(prov.ID, `"name":"x","vcpu":1,"memoryGiB":1`), "providerSize", "required"},
		{"a runtime on a provider pool", body(prov.ID, `"name":"x","vcpu":1,"memoryGiB":1,"runtime":"vm","providerSize":"s-1vcpu-1gb"`), "runtime", "poolClass"},
		{"memory that is no whole MiB", body(vps.ID, `"name":"x","vcpu":1,"memoryGiB":1.0001,"runtime":"vm"`), "memoryGiB", "multipleOf"},
	} {
		status, out := e.call(e.boot.UserToken, "flavors.create", tc.body)
		if status != 400 || !strings.Contains(out, `"field":"`+tc.field+`"`) || !strings.Contains(out, `"reason":"`+tc.reason+`"`) {
			t.Errorf("%s: %d %s; want INVALID_INPUT %s/%s", tc.name, status, out, tc.field, tc.reason)
		}
	}
	var n int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM flavors`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused creates wrote %d flavors (%v)", n, err)
	}

	// Shapes, and the GPU class each pool's sharing books.
	for _, tc := range []struct {
		pool     pools.Pool
		in       flavors.CreateInput
		gpuClass string
		mib      int64
	}{
		{vps, flavors.CreateInput{Name: "small", VCPU: 1, MemoryGiB: 0.0625, Runtime: "container"}, "", 64},
		{vps, flavors.CreateInput{Name: "gpu", VCPU: 8, MemoryGiB: 64, DiskGiB: 100, GPUs: 1, Runtime: "vm"}, "gpu", 64 << 10},
		{sliced, flavors.CreateInput{Name: "slice", VCPU: 2, MemoryGiB: 1.5, GPUs: 1, Runtime: "container"}, "gpu.slot", 1536},
		{prov, flavors.CreateInput{Name: "s1", VCPU: 1, MemoryGiB: 1, DiskGiB: 25, ProviderSize: "s-1vcpu-1gb"}, "", 1024},
	} {
		in := tc.in
		in.TenantID, in.PoolID = "acme", tc.pool.ID
		f, err := flavors.Create.Call(ctx, c, in)
		if err != nil {
			t.Fatalf("create %s: %v", in.Name, err)
		}
		if !core.ValidID("flv", f.ID) || f.PoolID != tc.pool.ID || f.TenantID != "acme" || f.GPUClass != tc.gpuClass || f.MemoryMiB != tc.mib ||
			f.MemoryGiB != in.MemoryGiB || f.VCPU != in.VCPU || f.Runtime != in.Runtime || f.ProviderSize != in.ProviderSize || f.CreatedAt == 0 {
			t.Errorf("created %+v from %+v", f, in)
		}
	}
	if _, err := flavors.Create.Call(ctx, c, flavors.CreateInput{TenantID: "acme", PoolID: vps.ID, Name: "small", VCPU: 2, MemoryGiB: 2,
		Runtime: "vm"}); codeOf(err) != core.CodeConflict {
		t.Fatalf("a taken name = %v, want CONFLICT", err)
	}
	// The same name in another pool is another flavor.
	if _, err := flavors.Create.Call(ctx, c, flavors.CreateInput{TenantID: "acme", PoolID: sliced.ID, Name: "small", VCPU: 1, MemoryGiB: 1,
		Runtime: "vm"}); err != nil {
		t.Fatalf("the name in another pool: %v", err)
	}

	// list pages oldest first.
	page, err := flavors.List.Call(ctx, c, flavors.ListInput{TenantID: "acme", PoolID: vps.ID})
	if err != nil || len(page.Items) != 2 || page.Items[0].Name != "small" || page.Items[1].Name != "gpu" || page.NextCursor != "" {
		t.Fatalf("list = %+v, %v", page, err)
	}
	small, gpu := page.Items[0], page.Items[1]
	first, err := flavors.List.Call(ctx, c, flavors.ListInput{TenantID: "acme", PoolID: vps.ID, ListInput: rpcList(1, "")})
	if err != nil || len(first.Items) != 1 || first.NextCursor == "" {
		t.Fatalf("first page = %+v, %v", first, err)
	}
	second, err := flavors.List.Call(ctx, c, flavors.ListInput{TenantID: "acme", PoolID: vps.ID, ListInput: rpcList(1, first.NextCursor)})
	if err != nil || len(second.Items) != 1 || second.Items[0].ID != gpu.ID || second.NextCursor != "" {
		t.Fatalf("second page = %+v, %v", second, err)
	}

	// update: name and shape; the runtime is not an update's field.
	name, vcpu, mem := "tiny", 2, 0.5
	up, err := flavors.Update.Call(ctx, c, flavors.UpdateInput{TenantID: "acme", PoolID: vps.ID, FlavorID: small.ID, Name: &name, VCPU: &vcpu, MemoryGiB: &mem})
	if err != nil || up.Name != "tiny" || up.VCPU != 2 || up.MemoryMiB != 512 || up.Runtime != "container" || up.UpdatedAt < small.UpdatedAt {
		t.Fatalf("update = %+v, %v", up, err)
	}
	taken := "gpu"
	if _, err := flavors.Update.Call(ctx, c, flavors.UpdateInput{TenantID: "acme", PoolID: vps.ID, FlavorID: small.ID, Name: &taken}); codeOf(err) != core.CodeConflict {
		t.Fatalf("update to a taken name = %v, want CONFLICT", err)
	}
	e.wantInvalid(e.boot.UserToken, "flavors.update", map[string]string{
		`{"tenantId":"acme","poolId":"` + vps.ID + `","flavorId":"` + small.ID + `","runtime":"vm"}`:       "runtime",
		`{"tenantId":"acme","poolId":"` + vps.ID + `","flavorId":"` + small.ID + `","providerSize":"s-1"}`: "providerSize",
	})
	// A flavor is reached through its own pool only.
	if _, err := flavors.Update.Call(ctx, c, flavors.UpdateInput{TenantID: "acme", PoolID: sliced.ID, FlavorID: small.ID, Name: &name}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("update through another pool = %v, want NOT_FOUND", err)
	}

	// delete is soft: the row stays for instances, reads leave it out.
	gone, err := flavors.Delete.Call(ctx, c, flavors.FlavorInput{TenantID: "acme", PoolID: vps.ID, FlavorID: gpu.ID})
	if err != nil || gone.DeletedAt == 0 {
		t.Fatalf("delete = %+v, %v", gone, err)
	}
	if list, err := flavors.List.Call(ctx, c, flavors.ListInput{TenantID: "acme", PoolID: vps.ID}); err != nil || len(list.Items) != 1 {
		t.Fatalf("list after delete = %+v, %v", list, err)
	}
	if _, err := flavors.Delete.Call(ctx, c, flavors.FlavorInput{TenantID: "acme", PoolID: vps.ID, FlavorID: gpu.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("a second delete = %v, want NOT_FOUND", err)
	}
	if err := e.store.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		_, err := flavorstore.Get(ctx, tx, vps.ID, gpu.ID)
		return err
	}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("Get of a deleted flavor = %v, want NOT_FOUND", err)
	}
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM flavors WHERE id = $1`, gpu.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the deleted flavor's row: %d, %v", n, err)
	}
	// Its name is free again.
	if _, err := flavors.Create.Call(ctx, c, flavors.CreateInput{TenantID: "acme", PoolID: vps.ID, Name: "gpu", VCPU: 4, MemoryGiB: 8,
		Runtime: "vm"}); err != nil {
		t.Fatalf("the deleted flavor's name: %v", err)
	}

	// An archived pool takes no new flavors.
	if _, err := pools.Archive.Call(ctx, c, pools.PoolInput{TenantID: "acme", PoolID: sliced.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := flavors.Create.Call(ctx, c, flavors.CreateInput{TenantID: "acme", PoolID: sliced.ID, Name: "late", VCPU: 1, MemoryGiB: 1,
		Runtime: "vm"}); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("create in an archived pool = %v, want INVALID_STATE", err)
	}
}

// Another tenant's pool is NOT_FOUND exactly like a missing one; once the
// pool is offered to it, the tenant lists its flavors, and still manages
// none.
func TestFlavorsAcrossTenants(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	vps := e.classPool(s.ID, "vps", "vps-host", "", "", "")
	f, err := flavors.Create.Call(ctx, c, flavors.CreateInput{TenantID: "acme", PoolID: vps.ID, Name: "small", VCPU: 1, MemoryGiB: 1, Runtime: "container"})
	if err != nil {
		t.Fatal(err)
	}
	missing := core.NewID("pool")
	calls := map[string]string{
		"list":   `{"tenantId":"globex","poolId":"%s"}`,
		"create": `{"tenantId":"globex","poolId":"%s","name":"mine","vcpu":1,"memoryGiB":1,"runtime":"vm"}`,
		"update": `{"tenantId":"globex","poolId":"%s","flavorId":"` + f.ID + `","name":"mine"}`,
		"delete": `{"tenantId":"globex","poolId":"%s","flavorId":"` + f.ID + `"}`,
	}
	for method, tmpl := range calls {
		var bodies []string
		for _, id := range []string{vps.ID, missing} {
			status, out := e.call(e.globex, "flavors."+method, fmt.Sprintf(tmpl, id))
			if status != 404 {
				t.Errorf("globex %s in %s = %d %s, want 404", method, id, status, out)
			}
			bodies = append(bodies, strings.ReplaceAll(out, id, "ID"))
		}
		if bodies[0] != bodies[1] {
			t.Errorf("globex %s: acme's pool answers %s, a missing one %s", method, bodies[0], bodies[1])
		}
	}

	if _, err := pools.Offer.Call(ctx, c, pools.OfferInput{TenantID: "acme", PoolID: vps.ID, ToTenantID: "globex"}); err != nil {
		t.Fatal(err)
	}
	g := e.client(e.globex)
	list, err := flavors.List.Call(ctx, g, flavors.ListInput{TenantID: "globex", PoolID: vps.ID})
	if err != nil || len(list.Items) != 1 || list.Items[0].ID != f.ID || list.Items[0].TenantID != "acme" {
		t.Fatalf("globex lists the offered pool's flavors: %+v, %v", list, err)
	}
	for method, tmpl := range calls {
		if method == "list" {
			continue
		}
		status, out := e.call(e.globex, "flavors."+method, fmt.Sprintf(tmpl, vps.ID))
		if status != 404 && status != 403 {
			t.Errorf("globex %s in the offered pool = %d %s, want NOT_FOUND or ACCESS_DENIED", method, status, out)
		}
	}
	if got, err := flavors.List.Call(ctx, c, flavors.ListInput{TenantID: "acme", PoolID: vps.ID}); err != nil || len(got.Items) != 1 || got.Items[0].Name != "small" {
		t.Fatalf("acme's flavors after globex's calls: %+v, %v", got, err)
	}
}

func rpcList(limit int, cursor string) rpc.ListInput {
	return rpc.ListInput{Limit: limit, Cursor: cursor}
}

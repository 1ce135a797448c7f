package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/digitalocean/godo"
	"github.com/jackc/pgx/v5"
	"go.temporal.io/sdk/client"

	activities "github.com/better-compute/better-compute/activities/cloudresources"
	crs "github.com/better-compute/better-compute/api/cloudresources"
	"github.com/better-compute/better-compute/api/flavors"
	"github.com/better-compute/better-compute/api/instances"
	"github.com/better-compute/better-compute/api/pools"
	pa "github.com/better-compute/better-compute/api/provideraccounts"
	"github.com/better-compute/better-compute/core"
	rules "github.com/better-compute/better-compute/core/cloudresources"
	drivers "github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/drivers/providers/dofake"
	"github.com/better-compute/better-compute/internal/testutil"
)

// TestCloudResourceRules checks each rule of cloud-resources-api.md that
// names a code (and details.reason) against the dev stack and the fake
// DigitalOcean: acme on the platform's pool offered to it (a shared
// account), the root tenant on its own account.
func TestCloudResourceRules(t *testing.T) {
	c := startCloudStack(t, rules.Quotas{PerKind: map[string]int{"do.functions.namespace": 1}})
	ctx := context.Background()
	acctID := c.s.VPS().AccountID
	call := func(tenant string, in crs.CreateInput) (crs.Resource, error) {
		in.TenantID = tenant
		if in.PoolID == "" {
			in.PoolID = c.pool
		}
		if in.IdempotencyKey == "" {
			in.IdempotencyKey = fmt.Sprintf("rules-%s-%d", in.Name, time.Now().UnixNano())
		}
		return crs.Create.Call(ctx, c.client(tenant), in)
	}
	pg := func(name string, spec string) crs.CreateInput {
		return crs.CreateInput{Kind: "do.database.pg", Name: name, Spec: json.RawMessage(spec)}
	}
	const okSpec = `{"region":"nyc3","size":"db-s-1vcpu-1gb"}`

	// create's refusals before anything is written.
	_, err := call(demoTenant, crs.CreateInput{PoolID: core.NewID("pool"), Kind: "do.database.pg", Name: "x", Spec: json.RawMessage(okSpec)})
	mustCode(t, "an unknown pool", err, core.CodeNotFound, "")
	_, err = call(demoTenant, crs.CreateInput{Kind: "do.spaces.bucket", Name: "x", Spec: json.RawMessage(`{}`)})
	mustCode(t, "a kind not served", err, core.CodeUnsupported, "kind")
	inference := crs.CreateInput{Kind: "do.inference.dedicated", Name: "llm", Spec: json.RawMessage(
		`{"region":"tor1","model_slug":"llama","model_provider":"hugging_face","accelerator_slug":"gpu-h100x8-640gb","replicas":1}`)}
	_, err = call(demoTenant, inference)
	mustCode(t, "a preview without previews", err, core.CodeUnsupported, "preview")
	_, err = call(demoTenant, pg("x", `{"region":"nyc3"}`))
	if ce := mustCode(t, "a spec without size", err, core.CodeInvalidInput, ""); ce.Details["field"] != "spec.size" {
		t.Fatalf("the field = %v", ce.Details)
	}
	_, err = call(demoTenant, pg("x", `{"region":"sfo3","size":"db-s-1vcpu-1gb"}`))
	mustCode(t, "a region the account does not configure", err, core.CodeInvalidInput, "region")
	vpcSpec := `{"region":"nyc3","size":"db-s-1vcpu-1gb","private_network_uuid":"0b9b5f3c-3a3c-4b7e-9c44-5e0f1b2a3c4d"}`
	_, err = call(demoTenant, pg("x", vpcSpec))
	if ce := mustCode(t, "a VPC on a shared account", err, core.CodeInvalidInput, "accountWide"); fmt.Sprint(ce.Details["fields"]) != "[spec.private_network_uuid]" {
		t.Fatalf("accountWide fields = %v", ce.Details["fields"])
	}
	netID := "net_" + core.NewID("x")[2:28]
	_, err = call(demoTenant, pg("x", `{"region":"nyc3","size":"db-s-1vcpu-1gb","network":"`+netID+`"}`))
	if ce := mustCode(t, "a network that is not live", err, core.CodeInvalidInput, "network"); fmt.Sprint(ce.Details["networks"]) != "["+netID+"]" {
		t.Fatalf("networks = %v", ce.Details["networks"])
	}
	_, err = call(demoTenant, crs.CreateInput{Kind: "do.database.pg.user", Name: "u", Spec: json.RawMessage(`{"name":"u"}`)})
	mustCode(t, "a child without its parent", err, core.CodeInvalidInput, "required")

	// The root tenant's own account may reach account-wide objects.
	own, err := call(rootTenant, pg("own-vpc", vpcSpec))
	if err != nil {
		t.Fatalf("an own account's VPC: %v", err)
	}

	// A cluster of acme's, then the rules that need one.
	cluster, err := call(demoTenant, pg("rules", okSpec))
	if err != nil {
		t.Fatal(err)
	}
	_, err = call(demoTenant, pg("rules", okSpec))
	mustCode(t, "a second cluster named rules", err, core.CodeConflict, "")
	instID := "inst_" + core.NewID("x")[2:28]
	_, err = call(demoTenant, crs.CreateInput{Kind: "do.database.pg.firewall", Name: "fw", ParentID: cluster.ID,
		Spec: json.RawMessage(`{"instances":["` + instID + `"]}`)})
	if ce := mustCode(t, "an instance that is not live", err, core.CodeInvalidInput, "instance"); fmt.Sprint(ce.Details["instances"]) != "["+instID+"]" {
		t.Fatalf("instances = %v", ce.Details["instances"])
	}
	_, err = call(demoTenant, crs.CreateInput{Kind: "do.database.pg.firewall", Name: "fw", ParentID: cluster.ID,
		Spec: json.RawMessage(`{"rules":[{"type":"tag","value":"prod"}]}`)})
	mustCode(t, "a Droplet tag as a trusted source on a shared account", err, core.CodeInvalidInput, "accountWide")
	c.await(t, demoTenant, cluster.ID, "ready")

	// A firewall trusting acme's droplet: the instance becomes a droplet
	// rule at the provider.
	fl, err := flavors.List.Call(ctx, c.demo, flavors.ListInput{TenantID: demoTenant, PoolID: c.pool})
	if err != nil || len(fl.Items) == 0 {
		t.Fatalf("the provider pool's flavors: %+v, %v", fl, err)
	}
	droplet, err := instances.Create.Call(ctx, c.demo, instances.CreateInput{TenantID: demoTenant, IdempotencyKey: "fw-droplet",
		PoolID: c.pool, FlavorID: fl.Items[0].ID, ProviderImage: providerImage, Name: "fw-droplet"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, resourceWait, "the droplet has a server", func() bool {
		in, err := instances.Get.Call(ctx, c.demo, instances.InstanceInput{TenantID: demoTenant, InstanceID: droplet.ID})
		droplet = in
		return err == nil && in.ProviderServerID != ""
	})
	fw, err := call(demoTenant, crs.CreateInput{Kind: "do.database.pg.firewall", Name: "fw", ParentID: cluster.ID,
		Spec: json.RawMessage(`{"rules":[{"type":"ip_addr","value":"192.0.2.1"}],"instances":["` + droplet.ID + `"]}`)})
	if err != nil {
		t.Fatal(err)
	}
	c.await(t, demoTenant, fw.ID, "ready")
	rulesAt, _, err := c.fakeClient(t).Databases.GetFirewallRules(ctx, c.get(t, demoTenant, cluster.ID).ProviderID)
	if err != nil || !slices.ContainsFunc(rulesAt, func(r godo.DatabaseFirewallRule) bool {
		return r.Type == "droplet" && r.Value == droplet.ProviderServerID
	}) {
		t.Fatalf("the provider's firewall = %+v, %v", rulesAt, err)
	}

	// A terminated workflow strands nothing: the reconciler's schedule
	// starts it again, and it converges what changed meanwhile.
	if err := c.s.Client().TerminateWorkflow(ctx, cluster.ID, "", "e2e: a lost workflow"); err != nil {
		t.Fatal(err)
	}
	if _, err := crs.Update.Call(ctx, c.demo, crs.UpdateInput{TenantID: demoTenant, ResourceID: cluster.ID,
		Spec: json.RawMessage(`{"size":"db-s-1vcpu-2gb"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := c.s.Client().ScheduleClient().GetHandle(ctx, activities.ReconcileScheduleID).Trigger(ctx, client.ScheduleTriggerOptions{}); err != nil {
		t.Fatal(err)
	}
	c.await(t, demoTenant, cluster.ID, "ready")
	if got := c.get(t, demoTenant, cluster.ID); got.AppliedVersion != got.Version {
		t.Fatalf("after the restart: version %d applied %d", got.Version, got.AppliedVersion)
	}

	// Another tenant's resource: the decision refuses before the lookup.
	_, err = crs.Get.Call(ctx, c.demo, crs.ResourceInput{TenantID: demoTenant, ResourceID: own.ID})
	// (IAM answers ACCESS_DENIED, or NOT_FOUND while its projection has
	// not loaded the row: either way nothing of it is read.)
	if code := core.AsError(err).Code; code != core.CodeAccessDenied && code != core.CodeNotFound {
		t.Fatalf("acme reading root's resource = %v", err)
	}

	// maxPerKind: one Functions namespace here.
	ns, err := call(demoTenant, crs.CreateInput{Kind: "do.functions.namespace", Name: "fns", Spec: json.RawMessage(`{"region":"nyc3"}`)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = call(demoTenant, crs.CreateInput{Kind: "do.functions.namespace", Name: "fns2", Spec: json.RawMessage(`{"region":"nyc3"}`)})
	if ce := mustCode(t, "a second namespace", err, core.CodeQuotaExceeded, ""); fmt.Sprint(ce.Details["limit"]) != "1" {
		t.Fatalf("limit = %v", ce.Details["limit"])
	}
	c.await(t, demoTenant, ns.ID, "ready")
	_, err = crs.Release.Call(ctx, c.demo, crs.ResourceInput{TenantID: demoTenant, ResourceID: ns.ID})
	mustCode(t, "releasing a namespace", err, core.CodeUnsupported, "release")

	// release: a child, a parent with live children.
	user, err := call(demoTenant, crs.CreateInput{Kind: "do.database.pg.user", Name: "rules-app", ParentID: cluster.ID, Spec: json.RawMessage(`{"name":"app"}`)})
	if err != nil {
		t.Fatal(err)
	}
	c.await(t, demoTenant, user.ID, "ready")
	_, err = crs.Release.Call(ctx, c.demo, crs.ResourceInput{TenantID: demoTenant, ResourceID: user.ID})
	mustCode(t, "releasing a child", err, core.CodeInvalidState, "parent")
	_, err = crs.Release.Call(ctx, c.demo, crs.ResourceInput{TenantID: demoTenant, ResourceID: cluster.ID})
	mustCode(t, "releasing a parent with children", err, core.CodeInvalidState, "children")

	// The capacity an inference endpoint books: GPUs per replica times the
	// larger of replicas and maxReplicas, against the offer's 16 GPUs.
	// The fake offers its GPUs in tor1.
	previews, regions := true, []string{"nyc3", "tor1"}
	if _, err := pa.Update.Call(ctx, c.admin, pa.UpdateInput{TenantID: rootTenant, ProviderAccountID: acctID, Previews: &previews, Regions: &regions}); err != nil {
		t.Fatal(err)
	}
	big := inference
	big.Name, big.Spec = "llm-big", json.RawMessage(`{"region":"tor1","model_slug":"llama","model_provider":"hugging_face","accelerator_slug":"gpu-h100x8-640gb","replicas":1,"maxReplicas":3}`)
	_, err = call(demoTenant, big)
	if ce := mustCode(t, "24 GPUs on a 16 GPU offer", err, core.CodeQuotaExceeded, ""); fmt.Sprint(ce.Details["limit"]) != "16" {
		t.Fatalf("the booking's refusal = %v", ce.Details)
	}
	two := inference
	two.Spec = json.RawMessage(`{"region":"tor1","model_slug":"llama","model_provider":"hugging_face","accelerator_slug":"gpu-h100x8-640gb","replicas":2}`)
	endpoint, err := call(demoTenant, two)
	if err != nil || endpoint.Booked == nil || endpoint.Booked.Amount != 16 {
		t.Fatalf("a 16 GPU endpoint = %+v, %v", endpoint, err)
	}
	_, err = crs.Update.Call(ctx, c.demo, crs.UpdateInput{TenantID: demoTenant, ResourceID: endpoint.ID, Spec: json.RawMessage(`{"replicas":3}`)})
	mustCode(t, "growing past the quota", err, core.CodeQuotaExceeded, "")
	// A shrink is returned once the provider runs it: then 8 GPUs are free.
	c.await(t, demoTenant, endpoint.ID, "ready")
	if _, err := crs.Update.Call(ctx, c.demo, crs.UpdateInput{TenantID: demoTenant, ResourceID: endpoint.ID, Spec: json.RawMessage(`{"replicas":1}`)}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, resourceWait, "the shrink returned", func() bool {
		r := c.get(t, demoTenant, endpoint.ID)
		return r.State == "ready" && r.Booked != nil && r.Booked.Amount == 8
	})
	small := inference
	small.Name = "llm-small"
	if _, err := call(demoTenant, small); err != nil {
		t.Fatalf("8 GPUs after the shrink: %v", err)
	}
	_, err = crs.Adopt.Call(ctx, c.admin, crs.AdoptInput{TenantID: rootTenant, PoolID: c.pool, Kind: "do.inference.dedicated",
		ProviderID: "anything", Name: "llm", IdempotencyKey: "adopt-llm"})
	mustCode(t, "adopting what books quota", err, core.CodeUnsupported, "quotaBooked")

	// The offer's terms and the tenant's budget, after the decision.
	if _, err := pools.Offer.Call(ctx, c.admin, pools.OfferInput{TenantID: rootTenant, PoolID: c.pool, ToTenantID: demoTenant,
		Quota: pools.Quota{"gpu": 16}, ExcludedRegions: []string{"nyc3"}}); err != nil {
		t.Fatal(err)
	}
	_, err = call(demoTenant, pg("excluded", okSpec))
	mustCode(t, "an excluded region", err, core.CodeInvalidInput, "regionExcluded")
	if _, err := pools.Offer.Call(ctx, c.admin, pools.OfferInput{TenantID: rootTenant, PoolID: c.pool, ToTenantID: demoTenant,
		Quota: pools.Quota{"gpu": 16}, Suspended: true}); err != nil {
		t.Fatal(err)
	}
	_, err = call(demoTenant, pg("suspended", okSpec))
	mustCode(t, "a suspended offer", err, core.CodeInvalidState, "offerSuspended")
	if _, err := pools.Offer.Call(ctx, c.admin, pools.OfferInput{TenantID: rootTenant, PoolID: c.pool, ToTenantID: demoTenant,
		Quota: pools.Quota{"gpu": 16}}); err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(ctx, c.s.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	if _, err := db.Exec(ctx, `INSERT INTO tenant_budgets (tenant_id, meter, monthly_cap, updated_by) VALUES ($1, $2, 0, 'e2e')`,
		demoTenant, rules.MeterHours); err != nil {
		t.Fatal(err)
	}
	_, err = call(demoTenant, pg("over-budget", okSpec))
	mustCode(t, "a spent budget", err, core.CodeQuotaExceeded, "budget")
	if _, err := db.Exec(ctx, `DELETE FROM tenant_budgets`); err != nil {
		t.Fatal(err)
	}

	// update and delete on a resource being deleted (the provider's
	// deletes fail meanwhile, so it stays deleting).
	if err := c.fake.Inject(dofake.Fault{Method: "DELETE", Path: "/v2/databases/*", Kind: dofake.FaultStatus, Status: 500, Count: dofake.Always}); err != nil {
		t.Fatal(err)
	}
	del, err := crs.Delete.Call(ctx, c.demo, crs.ResourceInput{TenantID: demoTenant, ResourceID: cluster.ID})
	if err != nil || del.State != "deleting" {
		t.Fatalf("delete = %+v, %v", del, err)
	}
	again, err := crs.Delete.Call(ctx, c.demo, crs.ResourceInput{TenantID: demoTenant, ResourceID: cluster.ID})
	if err != nil || again.Version != del.Version || again.State == "deleted" && del.State != "deleted" && again.UpdatedAt < del.UpdatedAt {
		t.Fatalf("a second delete = %+v, %v", again, err)
	}
	_, err = crs.Update.Call(ctx, c.demo, crs.UpdateInput{TenantID: demoTenant, ResourceID: cluster.ID, Spec: json.RawMessage(`{"size":"db-s-1vcpu-2gb"}`)})
	mustCode(t, "updating a resource being deleted", err, core.CodeInvalidState, "deleted")
	c.fake.ClearFaults()

	// adopt's refusals on the root tenant's own account.
	_, err = crs.Adopt.Call(ctx, c.admin, crs.AdoptInput{TenantID: rootTenant, PoolID: c.pool, Kind: "do.database.pg",
		ProviderID: "5f0c0b9e-0000-4000-8000-000000000000", Name: "nothing", IdempotencyKey: "adopt-nothing"})
	mustCode(t, "adopting what does not exist", err, core.CodeNotFound, "")
	_, err = crs.Adopt.Call(ctx, c.admin, crs.AdoptInput{TenantID: rootTenant, PoolID: c.pool, Kind: "do.database.pg.user",
		ProviderID: "x", Name: "child", IdempotencyKey: "adopt-child"})
	mustCode(t, "adopting a child kind", err, core.CodeUnsupported, "parent")
	_, err = crs.Adopt.Call(ctx, c.demo, crs.AdoptInput{TenantID: demoTenant, PoolID: c.pool, Kind: "do.database.pg",
		ProviderID: "x", Name: "mine", IdempotencyKey: "adopt-hosted"})
	mustCode(t, "adopting on a platform pool", err, core.CodeAccessDenied, "notAccountOwner")
	other, _, err := c.fakeClient(t).Databases.Create(ctx, &godo.DatabaseCreateRequest{Name: "elsewhere", EngineSlug: "pg", Version: "16",
		SizeSlug: "db-s-1vcpu-1gb", Region: "nyc3", NumNodes: 1, Tags: []string{"better-compute-managed", "better-compute-resource:crs_elsewhere"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = crs.Adopt.Call(ctx, c.admin, crs.AdoptInput{TenantID: rootTenant, PoolID: c.pool, Kind: "do.database.pg",
		ProviderID: other.ID, Name: "elsewhere", IdempotencyKey: "adopt-elsewhere"})
	mustCode(t, "adopting another deployment's cluster", err, core.CodeInvalidState, "managedByAnother")

	// A takeover that cannot complete (the provider refuses every tag
	// write with 500s): the spec cannot change, the description can, and a
	// delete lets it go without a provider call.
	legacy, _, err := c.fakeClient(t).Databases.Create(ctx, &godo.DatabaseCreateRequest{Name: "legacy-stuck", EngineSlug: "pg", Version: "16",
		SizeSlug: "db-s-1vcpu-1gb", Region: "nyc3", NumNodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.fake.Inject(dofake.Fault{Method: "POST", Path: "/v2/tags/*/resources", Kind: dofake.FaultStatus, Status: 500, Count: dofake.Always}); err != nil {
		t.Fatal(err)
	}
	stuck, err := crs.Adopt.Call(ctx, c.admin, crs.AdoptInput{TenantID: rootTenant, PoolID: c.pool, Kind: "do.database.pg",
		ProviderID: legacy.ID, Name: "legacy-stuck", IdempotencyKey: "adopt-stuck"})
	if err != nil || !stuck.Adopting {
		t.Fatalf("adopt = %+v, %v", stuck, err)
	}
	_, err = crs.Update.Call(ctx, c.admin, crs.UpdateInput{TenantID: rootTenant, ResourceID: stuck.ID, Spec: json.RawMessage(`{"size":"db-s-1vcpu-2gb"}`)})
	mustCode(t, "a spec change before the takeover", err, core.CodeInvalidState, "adopting")
	note := "being taken over"
	if _, err := crs.Update.Call(ctx, c.admin, crs.UpdateInput{TenantID: rootTenant, ResourceID: stuck.ID, Description: &note}); err != nil {
		t.Fatalf("a description change before the takeover: %v", err)
	}
	let, err := crs.Delete.Call(ctx, c.admin, crs.ResourceInput{TenantID: rootTenant, ResourceID: stuck.ID})
	if err != nil || let.State != "released" {
		t.Fatalf("deleting an adoption that never completed = %+v, %v", let, err)
	}
	c.fake.ClearFaults()
	if _, _, err := c.fakeClient(t).Databases.Get(ctx, legacy.ID); err != nil {
		t.Fatalf("the let-go cluster is gone at the provider: %v", err)
	}

	// A delete overrides a release the provider has not done yet.
	rootDB, err := call(rootTenant, pg("root-db", okSpec))
	if err != nil {
		t.Fatal(err)
	}
	c.await(t, rootTenant, rootDB.ID, "ready")
	if err := c.fake.Inject(dofake.Fault{Method: "DELETE", Path: "/v2/tags/*/resources", Kind: dofake.FaultStatus, Status: 500, Count: dofake.Always}); err != nil {
		t.Fatal(err)
	}
	if r, err := crs.Release.Call(ctx, c.admin, crs.ResourceInput{TenantID: rootTenant, ResourceID: rootDB.ID}); err != nil || r.Desired != "released" {
		t.Fatalf("release = %+v, %v", r, err)
	}
	over, err := crs.Delete.Call(ctx, c.admin, crs.ResourceInput{TenantID: rootTenant, ResourceID: rootDB.ID})
	if err != nil || over.State != "deleting" || over.Desired != "deleted" {
		t.Fatalf("a delete over a release = %+v, %v", over, err)
	}
	c.fake.ClearFaults()
	c.await(t, rootTenant, rootDB.ID, "gone")
	if _, _, err := c.fakeClient(t).Databases.Get(ctx, over.ProviderID); err == nil {
		t.Fatal("the deleted cluster still exists at the provider")
	}

	// signals: acme sees those about its own resources, the account's
	// owner every one; malformed ones are dropped; one answer serves 30 s.
	nsReady := c.await(t, demoTenant, ns.ID, "ready")
	now := time.Now().UTC()
	if err := c.fake.AddSignals(
		json.RawMessage(`{"id":"sig-1","severity":"critical","title":"a run failed","created_at":"`+now.Format(time.RFC3339)+`","resource":{"type":"functions_namespace","id":"`+nsReady.ProviderID+`"}}`),
		json.RawMessage(`{"id":"sig-2","severity":"warning","title":"someone else's","created_at":"`+now.Add(time.Second).Format(time.RFC3339)+`","resource":{"type":"functions_namespace","id":"unrecorded"}}`),
		json.RawMessage(`{"id":"sig-3","severity":"loud","title":"malformed","created_at":"`+now.Format(time.RFC3339)+`","resource":{"type":"functions_namespace","id":"x"}}`),
	); err != nil {
		t.Fatal(err)
	}
	mine, err := crs.Signals.Call(ctx, c.demo, crs.SignalsInput{TenantID: demoTenant, PoolID: c.pool})
	if err != nil || len(mine.Signals) != 1 || mine.Signals[0].ID != "sig-1" || mine.Signals[0].ResourceID != ns.ID {
		t.Fatalf("acme's signals = %+v, %v", mine, err)
	}
	all, err := crs.Signals.Call(ctx, c.admin, crs.SignalsInput{TenantID: rootTenant, PoolID: c.pool})
	if err != nil || len(all.Signals) != 2 || all.Signals[0].ID != "sig-2" {
		t.Fatalf("the owner's signals = %+v, %v", all, err)
	}
	if err := c.fake.AddSignals(json.RawMessage(`{"id":"sig-4","severity":"info","title":"later","created_at":"` +
		now.Add(2*time.Second).Format(time.RFC3339) + `","resource":{"type":"functions_namespace","id":"` + nsReady.ProviderID + `"}}`)); err != nil {
		t.Fatal(err)
	}
	cached, err := crs.Signals.Call(ctx, c.demo, crs.SignalsInput{TenantID: demoTenant, PoolID: c.pool, ResourceID: ns.ID})
	if err != nil || len(cached.Signals) != 1 {
		t.Fatalf("within 30 s the account's answer is reused: %+v, %v", cached, err)
	}
	previews = false
	if _, err := pa.Update.Call(ctx, c.admin, pa.UpdateInput{TenantID: rootTenant, ProviderAccountID: acctID, Previews: &previews}); err != nil {
		t.Fatal(err)
	}
	_, err = crs.Signals.Call(ctx, c.demo, crs.SignalsInput{TenantID: demoTenant, PoolID: c.pool})
	mustCode(t, "signals without previews", err, core.CodeUnsupported, "preview")

	// catalog: the provider's 1-Click apps, narrowed by where they install.
	cat, err := crs.Catalog.Call(ctx, c.demo, crs.CatalogInput{TenantID: demoTenant, PoolID: c.pool, InstallsOn: "instance"})
	if err != nil || len(cat.Apps) == 0 || slices.ContainsFunc(cat.Apps, func(a drivers.CatalogApp) bool { return a.InstallsOn != "instance" }) {
		t.Fatalf("catalog = %+v, %v", cat, err)
	}

	// list: oldest first, narrowed; deleted ones only on request.
	c.await(t, demoTenant, cluster.ID, "gone")
	l, err := crs.List.Call(ctx, c.demo, crs.ListInput{TenantID: demoTenant, Family: "data", IncludeDeleted: true})
	if err != nil || l.Truncated || len(l.Items) == 0 {
		t.Fatalf("list = %+v, %v", l, err)
	}
	for i, r := range l.Items {
		if r.Family != "data" || (i > 0 && r.CreatedAt < l.Items[i-1].CreatedAt) {
			t.Fatalf("list item %d = %+v", i, r)
		}
	}
	live, err := crs.List.Call(ctx, c.demo, crs.ListInput{TenantID: demoTenant})
	if err != nil || slices.ContainsFunc(live.Items, func(r crs.Resource) bool { return r.ID == cluster.ID }) ||
		!slices.ContainsFunc(live.Items, func(r crs.Resource) bool { return r.ID == ns.ID }) {
		t.Fatalf("the live list = %+v, %v", live, err)
	}
}

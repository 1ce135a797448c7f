package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	fleetact "github.com/better-compute/better-compute/activities/fleet"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/fleet"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	fleetstore "github.com/better-compute/better-compute/store/fleet"
	fleetwf "github.com/better-compute/better-compute/workflows/fleet"
)

// fleetEnv is env served with a real Temporal and a worker running the
// fleet apply workflow.
func fleetEnv(t *testing.T) (*env, client.Client) {
	e := newEnv(t)
	tc, _ := startTemporal(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	const queue = "fleet-test-queue"
	w := worker.New(tc, queue, worker.Options{})
	fleetwf.Register(w, &fleetact.Fleet{Store: e.store, Catalog: e.catalog, Temporal: tc, TaskQueue: queue})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, Logger: quiet, Secrets: e.vault,
		Temporal: tc, TaskQueue: queue})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e.server, e.url = srv, hs.URL
	return e, tc
}

func fleetJSON(t *testing.T, d fleet.Document) string {
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitApply waits for the apply to leave running.
func waitApply(t *testing.T, c *api.Client, id string) fleet.Apply {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		st, err := fleet.StatusMethod.Call(context.Background(), c, fleet.StatusInput{TenantID: "root"})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range st.Applies {
			if a.ID == id && a.State != "running" {
				return a
			}
		}
	}
	t.Fatalf("apply %s still running", id)
	return fleet.Apply{}
}

func TestFleetAsCode(t *testing.T) {
	ctx := context.Background()
	e, tc := fleetEnv(t)
	c := e.client(e.boot.AdminToken)
	s := e.site(e.boot.AdminToken, "root", "fra-1", "shared")
	a := e.pool(e.boot.AdminToken, "root", s.ID, "a")
	e.pool(e.boot.AdminToken, "root", s.ID, "b")

	// Round trip: the export planned is no change.
	ex, err := fleet.ExportMethod.Call(ctx, c, fleet.ExportInput{TenantID: "root"})
	if err != nil || len(ex.Document.Sites) != 1 || len(ex.Document.Pools) != 2 || ex.Document.Pools[0].Name != "a" {
		t.Fatalf("export = %+v, %v", ex, err)
	}
	plan, err := fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: fleetJSON(t, ex.Document)})
	if err != nil || len(plan.Changes) != 0 || plan.Digest != ex.Digest || !core.ValidID("fplan", plan.ID) {
		t.Fatalf("round-trip plan = %+v, %v", plan, err)
	}

	// One update (a's memory), one create (c, YAML, default policy), one
	// delete (b).
	yaml := `apiVersion: better-compute/fleet/v1
sites:
- {name: fra-1, kind: shared, region: eu-central, iamRegion: eu-central-1}
pools:
- {name: a, site: fra-1, class: metal-host, gpuModel: H100, gpuMemoryGb: 94, sharing: exclusive, agent: bcd, billingMode: metered}
- {name: c, site: fra-1, class: vps-host, gpuModel: L40S, gpuMemoryGb: 48, sharing: exclusive, agent: bcd, billingMode: metered}
`
	plan, err = fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: yaml})
	if err != nil || len(plan.Changes) != 3 {
		t.Fatalf("plan = %+v, %v", plan, err)
	}
	want := []struct{ op, kind, name string }{{"update", "pool", "a"}, {"create", "pool", "c"}, {"delete", "pool", "b"}}
	for i, w := range want {
		if ch := plan.Changes[i]; ch.Op != w.op || ch.Kind != w.kind || ch.Name != w.name {
			t.Fatalf("change %d = %+v, want %v", i, ch, w)
		}
	}
	if f := plan.Changes[0].Fields; len(f) != 1 || f[0].Field != "gpuMemoryGb" || f[0].Before != float64(80) || f[0].After != float64(94) {
		t.Fatalf("update fields = %+v", f)
	}
	applied, err := fleet.ApplyMethod.Call(ctx, c, fleet.ApplyInput{TenantID: "root", PlanID: plan.ID, Digest: plan.Digest})
	if err != nil || applied.State != "running" || len(applied.Changes) != 3 {
		t.Fatalf("apply = %+v, %v", applied, err)
	}
	if done := waitApply(t, c, applied.ID); done.State != "succeeded" {
		t.Fatalf("apply ended %+v", done)
	}
	list, err := pools.List.Call(ctx, c, pools.ListInput{TenantID: "root"})
	if err != nil || len(list.Items) != 2 || list.Items[0].Name != "a" || list.Items[0].GPUMemoryGb != 94 || list.Items[1].Name != "c" ||
		list.Items[1].Class != "vps-host" {
		t.Fatalf("live pools = %+v, %v", list, err)
	}
	st, err := fleet.StatusMethod.Call(ctx, c, fleet.StatusInput{TenantID: "root"})
	if err != nil || len(st.Applies) != 1 || len(st.Drift) != 0 {
		t.Fatalf("status = %+v, %v", st, err)
	}
	for _, ch := range st.Applies[0].Changes {
		if ch.State != "done" {
			t.Fatalf("change %+v not done", ch)
		}
	}
	// A restarted workflow resumes where the rows say: nothing is left,
	// so nothing is applied twice.
	if err := fleetact.Start(ctx, tc, "fleet-test-queue", applied.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if again := waitApply(t, c, applied.ID); again.State != "succeeded" {
		t.Fatalf("restarted apply = %+v", again)
	}
	if list, err := pools.List.Call(ctx, c, pools.ListInput{TenantID: "root"}); err != nil || len(list.Items) != 2 {
		t.Fatalf("after a restart: %+v, %v", list, err)
	}
	// An apply whose workflow start was lost after its commit: the
	// reconciler starts it.
	ex, _ = fleet.ExportMethod.Call(ctx, c, fleet.ExportInput{TenantID: "root"})
	ex.Document.Pools[0].GPUMemoryGb = 100
	owed, err := fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: fleetJSON(t, ex.Document)})
	if err != nil {
		t.Fatal(err)
	}
	var lost fleetstore.Apply
	if err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		lost, err = fleetstore.StartApply(ctx, tx, "root", fleetstore.Caller{IdentityID: e.identityOf(e.boot.AdminToken)}, owed.ID, owed.Digest)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	reconciler := &fleetact.Fleet{Store: e.store, Catalog: e.catalog, Temporal: tc, TaskQueue: "fleet-test-queue"}
	if n, err := reconciler.FleetReconcile(ctx); err != nil || n != 1 {
		t.Fatalf("reconcile = %d, %v; want 1 apply started", n, err)
	}
	if done := waitApply(t, c, lost.ID); done.State != "succeeded" {
		t.Fatalf("reconciled apply = %+v", done)
	}
	if n, err := reconciler.FleetReconcile(ctx); err != nil || n != 0 {
		t.Fatalf("reconcile after = %d, %v; want none owed", n, err)
	}

	// Applying again is stale: the live state moved on.
	if _, err := fleet.ApplyMethod.Call(ctx, c, fleet.ApplyInput{TenantID: "root", PlanID: plan.ID, Digest: plan.Digest}); codeOf(err) != core.CodeConflict {
		t.Fatalf("re-apply = %v, want CONFLICT", err)
	}

	// A pool changed directly: status shows the drift, and a plan made
	// before it is stale.
	ex, _ = fleet.ExportMethod.Call(ctx, c, fleet.ExportInput{TenantID: "root"})
	ex.Document.Pools[0].GPUMemoryGb = 141
	plan, err = fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: fleetJSON(t, ex.Document)})
	if err != nil || len(plan.Changes) != 1 {
		t.Fatalf("plan = %+v, %v", plan, err)
	}
	mem := 120
	if _, err := pools.Update.Call(ctx, c, pools.UpdateInput{TenantID: "root", PoolID: a.ID, GPUMemoryGb: &mem}); err != nil {
		t.Fatal(err)
	}
	_, err = fleet.ApplyMethod.Call(ctx, c, fleet.ApplyInput{TenantID: "root", PlanID: plan.ID, Digest: plan.Digest})
	if ce := core.AsError(err); codeOf(err) != core.CodeConflict || ce.Details["reason"] != "stale" {
		t.Fatalf("stale apply = %v, want CONFLICT stale", err)
	}
	st, err = fleet.StatusMethod.Call(ctx, c, fleet.StatusInput{TenantID: "root"})
	if err != nil || len(st.Drift) != 1 || st.Drift[0].Name != "a" || st.Drift[0].Fields[0].Before != float64(120) ||
		st.Drift[0].Fields[0].After != float64(100) {
		t.Fatalf("drift = %+v, %v", st.Drift, err)
	}

	// Refused: a pool's class never changes.
	ex.Document.Pools[0].Class = "vps-host"
	_, err = fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: fleetJSON(t, ex.Document)})
	if codeOf(err) != core.CodeInvalidState {
		t.Fatalf("class change plan = %v, want INVALID_STATE", err)
	}
	// Another tenant has no fleet document.
	if _, err := fleet.ExportMethod.Call(ctx, e.client(e.boot.UserToken), fleet.ExportInput{TenantID: "acme"}); err == nil {
		t.Fatal("acme exported a fleet")
	}
}

func TestFleetInvalidDocument(t *testing.T) {
	e := newEnv(t)
	c := e.client(e.boot.AdminToken)
	for doc, field := range map[string]string{
		"apiVersion: v0\n": "document.apiVersion",
		"apiVersion: better-compute/fleet/v1\npools:\n- {name: a, site: s, class: metal-host, gpuModel: H100, gpuMemoryGb: 0, sharing: exclusive, agent: bcd, billingMode: metered}\n": "document.pools.0.gpuMemoryGb",
		"apiVersion: better-compute/fleet/v1\npools:\n- {name: a, site: s, class: metal-host, gpuModel: H100, gpuMemoryGb: 8, sharing: exclusive, agent: bcd, billingMode: metered}\n": "document.pools.0.site",
		"apiVersion: [": "document",
	} {
		_, err := fleet.PlanMethod.Call(context.Background(), c, fleet.PlanInput{TenantID: "root", Document: doc})
		if ce := core.AsError(err); codeOf(err) != core.CodeInvalidInput || ce.Details["field"] != field {
			t.Errorf("plan %q = %v %v; want INVALID_INPUT on %s", doc, err, detailsOf(ce), field)
		}
	}
}

// planAndApply plans the document, checks the changes' ops and kinds in
// order, and applies the plan to success.
func planAndApply(t *testing.T, c *api.Client, document string, want ...string) fleet.Apply {
	t.Helper()
	ctx := context.Background()
	plan, err := fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: document})
	if err != nil {
		t.Fatalf("plan: %v %v", err, detailsOf(core.AsError(err)))
	}
	var got []string
	for _, ch := range plan.Changes {
		got = append(got, ch.Op+" "+ch.Kind+" "+ch.Name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("plan changes = %q, want %q", got, want)
	}
	applied, err := fleet.ApplyMethod.Call(ctx, c, fleet.ApplyInput{TenantID: "root", PlanID: plan.ID, Digest: plan.Digest})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	done := waitApply(t, c, applied.ID)
	if done.State != "succeeded" {
		t.Fatalf("apply ended %+v", done)
	}
	return done
}

// TestFleetOffersFlavorsAndNodes plans and applies a pool's flavors and
// offers (with quotas) and a node's labels and taints: created, updated and
// deleted, each through its own method's writer and with its audit row.
func TestFleetOffersFlavorsAndNodes(t *testing.T) {
	ctx := context.Background()
	e, _ := fleetEnv(t)
	c := e.client(e.boot.AdminToken)
	s := e.site(e.boot.AdminToken, "root", "fra-1", "shared")
	metal := e.pool(e.boot.AdminToken, "root", s.ID, "metal")
	if _, err := pools.Create.Call(ctx, c, pools.CreateInput{TenantID: "root", SiteID: s.ID, Name: "vps", Class: "vps-host",
		GPUModel: "L40S", GPUMemoryGb: 48}); err != nil {
		t.Fatal(err)
	}
	n1 := e.node(schedulableNode(metal.ID, "n1"), nil)
	e.node(schedulableNode(metal.ID, "n2"), fixture(t, "h100-8x-sxm.json"))
	if _, err := nodes.Label.Call(ctx, c, nodes.LabelInput{TenantID: "root", NodeID: n1.ID, Set: map[string]string{"rack": "r1"}}); err != nil {
		t.Fatal(err)
	}

	// The export holds the labelled node only, and plans as no change.
	ex, err := fleet.ExportMethod.Call(ctx, c, fleet.ExportInput{TenantID: "root"})
	if err != nil || len(ex.Document.Nodes) != 1 || ex.Document.Nodes[0].Name != "n1" || ex.Document.Nodes[0].Labels["rack"] != "r1" {
		t.Fatalf("export = %+v, %v", ex.Document, err)
	}
	if plan, err := fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: fleetJSON(t, ex.Document)}); err != nil ||
		len(plan.Changes) != 0 {
		t.Fatalf("round trip = %+v, %v", plan, err)
	}

	head := `apiVersion: better-compute/fleet/v1
sites:
- {name: fra-1, kind: shared, region: eu-central, iamRegion: eu-central-1}
pools:
`
	pool := func(metalExtra, vpsExtra string) string {
		return head + "- {name: metal, site: fra-1, class: metal-host, gpuModel: H100, gpuMemoryGb: 80, sharing: exclusive, agent: bcd, billingMode: metered" + metalExtra + "}\n" +
			"- {name: vps, site: fra-1, class: vps-host, gpuModel: L40S, gpuMemoryGb: 48, sharing: exclusive, agent: bcd, billingMode: metered" + vpsExtra + "}\n"
	}
	// Create: a flavor, an offer with its quota, a node's labels and taint.
	applied := planAndApply(t, c, pool(", offers: [{tenant: acme, quota: {gpu: 4}}]", ", flavors: [{name: small, vcpu: 2, memoryGiB: 4, runtime: container}]")+
		"nodes:\n- {name: n1, labels: {rack: r2, zone: a}, taints: [{key: maintenance, effect: NoSchedule}]}\n",
		"create offer metal/acme", "create flavor vps/small", "update node n1")
	if len(applied.Changes) != 3 {
		t.Fatalf("apply changes = %+v", applied.Changes)
	}
	var vcpu, quota int
	if err := e.store.Pool.QueryRow(ctx, `SELECT f.vcpu FROM flavors f JOIN pools p ON p.id = f.pool_id
		WHERE p.name = 'vps' AND f.name = 'small' AND f.deleted_at IS NULL`).Scan(&vcpu); err != nil || vcpu != 2 {
		t.Fatalf("flavor small: vcpu %d, %v", vcpu, err)
	}
	if err := e.store.Pool.QueryRow(ctx, `SELECT (quota->>'gpu')::int FROM pool_offers WHERE pool_id = $1 AND tenant_id = 'acme'`,
		metal.ID).Scan(&quota); err != nil || quota != 4 {
		t.Fatalf("offer to acme: quota %d, %v", quota, err)
	}
	got, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "root", NodeID: n1.ID})
	if err != nil || got.Labels["rack"] != "r2" || got.Labels["zone"] != "a" || len(got.Taints) != 1 || got.Taints[0].Key != "maintenance" {
		t.Fatalf("node n1 = labels %v taints %v, %v", got.Labels, got.Taints, err)
	}
	// Each change wrote its own method's audit row, as the apply's caller
	// and under the fleet.apply call's request.
	admin := e.identityOf(e.boot.AdminToken)
	for _, m := range []string{"flavors.create", "pools.offer", "nodes.label", "nodes.taint"} {
		if n := e.count(`SELECT count(*) FROM audit_events WHERE method = $1 AND identity_id = $2
			AND request_id IN (SELECT request_id FROM audit_events WHERE method = 'fleet.apply')`, m, admin); n != 1 {
			t.Errorf("audit rows of %s = %d, want 1", m, n)
		}
	}

	// Update: the flavor's shape, the offer's quota.
	planAndApply(t, c, pool(", offers: [{tenant: acme, quota: {gpu: 8}, suspended: true}]", ", flavors: [{name: small, vcpu: 4, memoryGiB: 4, runtime: container}]")+
		"nodes:\n- {name: n1, labels: {rack: r2, zone: a}, taints: [{key: maintenance, effect: NoSchedule}]}\n",
		"update offer metal/acme", "update flavor vps/small")
	if n := e.count(`SELECT count(*) FROM pool_offers WHERE pool_id = $1 AND tenant_id = 'acme' AND (quota->>'gpu')::int = 8
		AND suspended_at IS NOT NULL`, metal.ID); n != 1 {
		t.Fatalf("updated offers = %d, want 1", n)
	}

	// Delete: the flavor, the offer, the node's labels and taints (a node
	// declared with none); n2, left out, is left alone.
	planAndApply(t, c, pool("", "")+"nodes:\n- {name: n1}\n", "delete offer metal/acme", "delete flavor vps/small", "update node n1")
	if n := e.count(`SELECT count(*) FROM flavors WHERE deleted_at IS NULL`) + e.count(`SELECT count(*) FROM pool_offers`); n != 0 {
		t.Fatalf("%d flavors and offers left", n)
	}
	if got, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "root", NodeID: n1.ID}); err != nil || len(got.Labels) != 0 || len(got.Taints) != 0 {
		t.Fatalf("node n1 = labels %v taints %v, %v", got.Labels, got.Taints, err)
	}
	if ex, err := fleet.ExportMethod.Call(ctx, c, fleet.ExportInput{TenantID: "root"}); err != nil || len(ex.Document.Nodes) != 0 {
		t.Fatalf("export after = %+v, %v", ex.Document, err)
	}

	// Refused at plan time: a node that is not enrolled, an offer of the
	// fleet's pool to its own tenant.
	for name, document := range map[string]string{
		"ghost node": pool("", "") + "nodes:\n- {name: ghost, labels: {a: b}}\n",
		"self offer": pool(", offers: [{tenant: root}]", ""),
	} {
		_, err := fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: document})
		if ce := core.AsError(err); codeOf(err) != core.CodeInvalidState || ce.Details["refused"] == nil {
			t.Errorf("%s: plan = %v, want INVALID_STATE with refused", name, err)
		}
	}
	// A pool with a live reservation is not deleted.
	if _, err := reservations.Create.Call(ctx, c, reserveInput("root", metal.ID, "fleet", 1, reservationsT0, 3600)); err != nil {
		t.Fatal(err)
	}
	vpsOnly := head + "- {name: vps, site: fra-1, class: vps-host, gpuModel: L40S, gpuMemoryGb: 48, sharing: exclusive, agent: bcd, billingMode: metered}\n"
	_, err = fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: vpsOnly})
	if ce := core.AsError(err); codeOf(err) != core.CodeInvalidState || fmt.Sprint(ce.Details["refused"]) == "" ||
		!strings.Contains(fmt.Sprint(ce.Details["refused"]), "live reservations") {
		t.Fatalf("delete of a pool with a reservation: plan = %v %v, want INVALID_STATE", err, detailsOf(ce))
	}

	// Invalid: flavors on a metal pool, a bad label key, a flavor's memory
	// that is not a whole number of MiB.
	for document, field := range map[string]string{
		pool(", flavors: [{name: x, vcpu: 1, memoryGiB: 1, runtime: vm}]", ""):       "document.pools.0.flavors",
		pool("", "") + "nodes:\n- {name: n1, labels: {'-bad': x}}\n":                 "document.nodes.0.labels",
		pool("", ", flavors: [{name: x, vcpu: 1, memoryGiB: 0.00001, runtime: vm}]"): "document.pools.1.flavors.0.memoryGiB",
	} {
		_, err := fleet.PlanMethod.Call(ctx, c, fleet.PlanInput{TenantID: "root", Document: document})
		if ce := core.AsError(err); codeOf(err) != core.CodeInvalidInput || ce.Details["field"] != field {
			t.Errorf("plan = %v %v; want INVALID_INPUT on %s", err, detailsOf(ce), field)
		}
	}
}

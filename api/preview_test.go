package api_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/capacity"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
)

func TestCapacityPreview(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, g := e.client(e.boot.UserToken), e.client(e.globex)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{}`)
	n1 := e.node(schedulableNode(p.ID, "gpu-a01"), fixture(t, "h100-8x-sxm.json"))
	n2 := e.node(schedulableNode(p.ID, "gpu-a02"), fixture(t, "h100-8x-sxm.json"))
	if !n1.Schedulable || !n2.Schedulable {
		t.Fatalf("nodes not schedulable: %+v %+v", n1, n2)
	}
	first, second := n1, n2
	if second.ID < first.ID {
		first, second = second, first
	}
	t0 := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	start := t0.UnixMilli()
	preview := func(c *api.Client, tenant string, d placement.Request, start int64) capacity.CapacityPreview {
		t.Helper()
		out, err := capacity.Preview.Call(ctx, c, capacity.PreviewInput{TenantID: tenant, PoolID: p.ID, Devices: d, Start: &start, Duration: 3600})
		if err != nil {
			t.Fatalf("preview %+v: %v", d, err)
		}
		return out
	}
	gpus := func(n int, topo string) placement.Request {
		return placement.Request{Class: "gpu", Count: n, Topology: placement.Topology{Type: topo}}
	}
	wantReason := func(what string, got capacity.CapacityPreview, code, scope string, wanted, max int) {
		t.Helper()
		if got.Fits || len(got.Reasons) != 1 || len(got.Plan.Allocations) != 0 {
			t.Fatalf("%s = %+v, want one %s reason", what, got, code)
		}
		r := got.Reasons[0]
		if r.Code != code || r.Scope != scope || r.Wanted != wanted || (r.Max != nil && *r.Max != max) || (r.Max == nil && max >= 0) {
			t.Fatalf("%s reason = %+v, want %s %s wanted %d max %d", what, r, code, scope, wanted, max)
		}
	}

	// Free nodes: two GPUs on the first node by id (a tie), the lowest ids.
	got := preview(a, "acme", gpus(2, ""), start)
	if !got.Fits || len(got.Reasons) != 0 || len(got.Plan.Allocations) != 1 || got.Plan.Allocations[0].NodeID != first.ID ||
		!slices.Equal(got.Plan.Allocations[0].Atoms, e.gpuAtoms(first.ID)[:2]) || got.Start != start || got.End != start+3600_000 ||
		got.Offered || got.Quota != nil || got.Devices.Topology.Type != "any" {
		t.Fatalf("free preview = %+v", got)
	}

	// Three GPUs of the second node booked over the window: packing picks
	// it, and the atoms it offers are free ones.
	at := func(h int) string {
		return fmt.Sprintf("'%s'::timestamptz", t0.Add(time.Duration(h)*time.Hour).Format(time.RFC3339))
	}
	busy := e.gpuAtoms(second.ID)[:3]
	for _, id := range busy {
		if err := e.book(second.ID, id, p.ID, at(0), at(1)); err != nil {
			t.Fatal(err)
		}
	}
	got = preview(a, "acme", gpus(2, "sameNode"), start)
	if !got.Fits || len(got.Plan.Allocations) != 1 || got.Plan.Allocations[0].NodeID != second.ID ||
		!slices.Equal(got.Plan.Allocations[0].Atoms, e.gpuAtoms(second.ID)[3:5]) {
		t.Fatalf("packing preview = %+v", got)
	}
	// Six on one node: only the first has them.
	if got = preview(a, "acme", gpus(6, "sameNode"), start); !got.Fits || got.Plan.Allocations[0].NodeID != first.ID {
		t.Fatalf("six on one node = %+v", got)
	}
	// The bookings leave 13 of 16 in the window; the next hour has all 16.
	wantReason("sixteen now", preview(a, "acme", gpus(16, ""), start), placement.ReasonInsufficientAtoms, placement.ScopeTotal, 16, 13)
	wantReason("nine on a node", preview(a, "acme", gpus(9, "sameNode"), start), placement.ReasonInsufficientAtoms, placement.ScopeNode, 9, 8)
	if got = preview(a, "acme", gpus(16, ""), start+3600_000); !got.Fits || len(got.Plan.Allocations) != 2 {
		t.Fatalf("sixteen in the next hour = %+v", got)
	}
	// A booked GPU takes its node's whole-machine atom.
	wantReason("two nodes", preview(a, "acme", placement.Request{Class: "node", Count: 2}, start), placement.ReasonInsufficientAtoms, placement.ScopeTotal, 2, 1)
	// A gang of two nodes × 4 fits; × 6 does not.
	if got = preview(a, "acme", placement.Request{Class: "gpu", Topology: placement.Topology{Type: "gang", Nodes: 2, PerNode: 4}}, start); !got.Fits ||
		len(got.Plan.Allocations) != 2 || len(got.Plan.Allocations[1].Atoms) != 4 {
		t.Fatalf("gang = %+v", got)
	}
	wantReason("gang of 6", preview(a, "acme", placement.Request{Class: "gpu", Topology: placement.Topology{Type: "gang", Nodes: 2, PerNode: 6}}, start),
		placement.ReasonTopology, "", 2, 1)

	// A selector that matches nothing names what there is.
	got = preview(a, "acme", placement.Request{Class: "gpu", Count: 1, Selector: placement.Selector{GPUModel: "L40S"}}, start)
	wantReason("L40S", got, placement.ReasonSelectorMatchesNothing, "", 0, -1)
	if !slices.Equal(got.Reasons[0].Available["gpuModel"], []string{"H100"}) {
		t.Fatalf("available = %+v", got.Reasons[0].Available)
	}
	if got = preview(a, "acme", placement.Request{Class: "gpu", Count: 1, Selector: placement.Selector{GPUModel: "H100", MinMemoryGiB: 80}}, start); !got.Fits {
		t.Fatalf("H100 80 GiB = %+v", got)
	}

	// A cordoned node is excluded; both cordoned, no schedulable nodes.
	if _, err := nodes.Cordon.Call(ctx, a, nodes.NodeInput{TenantID: "acme", NodeID: first.ID}); err != nil {
		t.Fatal(err)
	}
	wantReason("cordoned first", preview(a, "acme", gpus(6, "sameNode"), start), placement.ReasonInsufficientAtoms, placement.ScopeNode, 6, 5)
	if _, err := nodes.Cordon.Call(ctx, a, nodes.NodeInput{TenantID: "acme", NodeID: second.ID}); err != nil {
		t.Fatal(err)
	}
	got = preview(a, "acme", gpus(1, ""), start)
	wantReason("both cordoned", got, placement.ReasonNoSchedulableNodes, "", 0, -1)
	if *got.Reasons[0].Candidates != 2 {
		t.Fatalf("candidates = %+v", got.Reasons[0])
	}
	for _, n := range []string{first.ID, second.ID} {
		if _, err := nodes.Uncordon.Call(ctx, a, nodes.NodeInput{TenantID: "acme", NodeID: n}); err != nil {
			t.Fatal(err)
		}
	}

	// Preview books nothing.
	var bookings int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM device_bookings`).Scan(&bookings); err != nil || bookings != 3 {
		t.Fatalf("bookings = %d, %v", bookings, err)
	}

	// A tenant sees an offered pool with its quota; the unoffered one and
	// another tenant's view are closed to it.
	if _, err := capacity.Preview.Call(ctx, g, capacity.PreviewInput{TenantID: "globex", PoolID: p.ID, Devices: gpus(1, ""), Duration: 60}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex before the offer = %v, want NOT_FOUND", err)
	}
	if _, err := capacity.Preview.Call(ctx, g, capacity.PreviewInput{TenantID: "acme", PoolID: p.ID, Devices: gpus(1, ""), Duration: 60}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex in acme = %v, want ACCESS_DENIED", err)
	}
	if _, err := pools.Offer.Call(ctx, a, pools.OfferInput{TenantID: "acme", PoolID: p.ID, ToTenantID: "globex", Quota: map[string]int64{"gpu": 4}}); err != nil {
		t.Fatal(err)
	}
	got = preview(g, "globex", gpus(4, ""), start)
	if !got.Fits || !got.Offered || got.Quota == nil || got.Quota.Resource != "gpu" || got.Quota.Limit != 4 || got.Quota.InUse != 0 ||
		got.Quota.Requested != 4 || got.Quota.Exceeds {
		t.Fatalf("globex preview = %+v (quota %+v)", got, got.Quota)
	}
	if got = preview(g, "globex", gpus(5, ""), start); !got.Fits || !got.Quota.Exceeds {
		t.Fatalf("globex over quota = %+v (quota %+v)", got, got.Quota)
	}
	if got = preview(g, "globex", placement.Request{Class: "node", Count: 1}, start); got.Quota.Limit != 0 || !got.Quota.Exceeds {
		t.Fatalf("globex node quota = %+v", got.Quota)
	}

	// Start defaults to now.
	now := time.Now().UnixMilli()
	if out, err := capacity.Preview.Call(ctx, a, capacity.PreviewInput{TenantID: "acme", PoolID: p.ID, Devices: gpus(1, ""), Duration: 60}); err != nil ||
		out.Start < now-60_000 || out.Start > now+60_000 || out.End != out.Start+60_000 || !out.Fits {
		t.Fatalf("default start = %+v, %v", out, err)
	}
	if _, err := capacity.Preview.Call(ctx, a, capacity.PreviewInput{TenantID: "acme", PoolID: core.NewID("pool"), Devices: gpus(1, ""), Duration: 60}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("unknown pool = %v, want NOT_FOUND", err)
	}

	pre := `{"tenantId":"acme","poolId":"` + p.ID + `",`
	e.wantInvalid(e.boot.UserToken, "capacity.preview", map[string]string{
		`{"tenantId":"acme","devices":{"class":"gpu","count":1},"duration":60}`: "poolId",
		pre + `"duration":60}`:                                                                                      "devices",
		pre + `"devices":{"class":"gpu","count":1}}`:                                                                "duration",
		pre + `"devices":{"class":"gpu","count":1},"duration":0}`:                                                   "duration",
		pre + `"devices":{"class":"gpu","count":1},"duration":31622401}`:                                            "duration",
		pre + `"devices":{"class":"gpu","count":1},"duration":60,"start":-1}`:                                       "start",
		pre + `"devices":{"class":"gpu","count":1},"duration":60,"start":1.5}`:                                      "start",
		pre + `"devices":{"class":"disk","count":1},"duration":60}`:                                                 "devices.class",
		pre + `"devices":{"class":"gpu","count":0},"duration":60}`:                                                  "devices.count",
		pre + `"devices":{"class":"gpu","count":"1"},"duration":60}`:                                                "devices.count",
		pre + `"devices":{"class":"gpu","count":1,"Count":2},"duration":60}`:                                        "devices.Count",
		pre + `"devices":{"class":"gpu","count":1,"selector":{"model":"H100"}},"duration":60}`:                      "devices.selector.model",
		pre + `"devices":{"class":"gpu","count":1,"topology":{"type":"ring"}},"duration":60}`:                       "devices.topology.type",
		pre + `"devices":{"class":"gpu","count":3,"topology":{"type":"gang","nodes":2,"perNode":2}},"duration":60}`: "devices.count",
		pre + `"devices":{"class":"gpu","count":1},"duration":60,"x":1}`:                                            "x",
	})
}

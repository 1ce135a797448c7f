package api_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/capacity"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/api/sites"
	"github.com/better-compute/better-compute/core"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
)

// A registered site agent is a nodes row with role site: no pool, its
// site's, the site owner's; never a GPU host.
func TestSiteAgentIsASiteNode(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	p, host := h100Pool(t, e) // acme's site fra-1 with one 8-GPU host
	tok, err := sites.CreateToken.Call(ctx, c, sites.CreateTokenInput{TenantID: "acme", SiteID: p.SiteID, Name: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	base := siteAgentServer(t, e, true)
	body := func(v any) string {
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	status, out := postAgent(t, base, protocol.SiteRegisterPath, body(protocol.SiteRegisterRequest{Token: tok.Token, Holder: "edge-1"}))
	if status != 200 {
		t.Fatalf("register = %d %s", status, out)
	}
	var reg protocol.SiteResult
	if err := json.Unmarshal([]byte(out), &reg); err != nil {
		t.Fatal(err)
	}

	var nodeID, tenantID, role, connectivity string
	var poolID *string
	if err := e.store.Pool.QueryRow(ctx, `SELECT n.id, n.tenant_id, n.pool_id, n.role, n.connectivity FROM site_agents a
		JOIN nodes n ON n.id = a.node_id WHERE a.site_id = $1 AND a.holder = 'edge-1' AND n.site_id = $1`, p.SiteID).
		Scan(&nodeID, &tenantID, &poolID, &role, &connectivity); err != nil {
		t.Fatalf("the site agent's node: %v", err)
	}
	if tenantID != "acme" || poolID != nil || role != "site" || connectivity != "connected" {
		t.Fatalf("site node: tenant %s, pool %v, role %s, connectivity %s", tenantID, poolID, role, connectivity)
	}
	// Registering again and renewing keep the one node.
	if status, out := postAgent(t, base, protocol.SiteRegisterPath, body(protocol.SiteRegisterRequest{Token: tok.Token, Holder: "edge-1"})); status != 200 {
		t.Fatalf("register again = %d %s", status, out)
	}
	if err := json.Unmarshal([]byte(out), &reg); err != nil {
		t.Fatal(err)
	}
	if status, out := postAgent(t, base, protocol.SiteRenewPath, body(protocol.SiteRenewRequest{Token: tok.Token, Holder: "edge-1",
		Epoch: reg.Lease.Epoch})); status != 200 {
		t.Fatalf("renew = %d %s", status, out)
	}
	if n := e.count(`SELECT count(*) FROM nodes WHERE role = 'site'`); n != 1 {
		t.Fatalf("%d site nodes, want 1", n)
	}

	// nodes.list shows it as what it is: role site, no pool, not schedulable.
	all, err := nodes.List.Call(ctx, c, nodes.ListInput{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(all.Items, func(n nodes.Node) bool { return n.ID == nodeID })
	if len(all.Items) != 2 || i < 0 {
		t.Fatalf("nodes.list = %+v", all.Items)
	}
	if sn := all.Items[i]; sn.Role != "site" || sn.PoolID != "" || sn.SiteID != p.SiteID || sn.Schedulable ||
		!slices.Contains(sn.UnschedulableReasons, nodestate.ReasonRole) || sn.Devices != 0 || sn.Name != "edge-1" {
		t.Fatalf("site node in nodes.list = %+v", sn)
	}
	if got, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: nodeID}); err != nil || got.Role != "site" {
		t.Fatalf("nodes.get = %+v, %v", got, err)
	}
	for name, f := range map[string]nodes.ListInput{
		"schedulable": {TenantID: "acme", Schedulable: new(true)},
		"the pool's":  {TenantID: "acme", PoolID: p.ID},
	} {
		l, err := nodes.List.Call(ctx, c, f)
		if err != nil || len(l.Items) != 1 || l.Items[0].ID != host.ID {
			t.Fatalf("%s nodes = %+v, %v", name, l, err)
		}
	}
	// Capacity and placement count the GPU host only.
	got, err := capacity.Pool.Call(ctx, c, capacity.PoolInput{TenantID: "acme", PoolID: p.ID})
	if err != nil {
		t.Fatal(err)
	}
	wantCounts(t, "gpu", resourceOf(t, got.Resources, "gpu"), 8, 0, 0)
	wantCounts(t, "node", resourceOf(t, got.Resources, "node"), 1, 0, 0)
	r, err := reservations.Create.Call(ctx, c, reserveInput("acme", p.ID, "all", 8, reservationsT0, 3600))
	if err != nil || len(r.Allocations) != 1 || r.Allocations[0].NodeID != host.ID {
		t.Fatalf("reservation = %+v, %v", r, err)
	}
	if _, err := reservations.Create.Call(ctx, c, reserveInput("acme", p.ID, "more", 1, reservationsT0, 3600)); codeOf(err) != core.CodeInvalidState {
		t.Fatalf("a ninth GPU = %v, want INVALID_STATE noCapacity", err)
	}

	// A site agent that stops renewing goes unreachable like any node; a
	// renewal brings it back.
	if _, err := e.store.Pool.Exec(ctx, `UPDATE node_liveness SET expires_at = now() - interval '1 second' WHERE node_id = $1`, nodeID); err != nil {
		t.Fatal(err)
	}
	gw := e.withGateway(agentgateway.Deps{})
	if _, err := gw.SweepLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	if s, _ := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: nodeID}); s.Connectivity != "unreachable" {
		t.Fatalf("a silent site agent is %s", s.Connectivity)
	}
	if status, out := postAgent(t, base, protocol.SiteRenewPath, body(protocol.SiteRenewRequest{Token: tok.Token, Holder: "edge-1",
		Epoch: reg.Lease.Epoch})); status != 200 {
		t.Fatalf("renew = %d %s", status, out)
	}
	s, _ := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: nodeID})
	if s.Connectivity != "connected" || slices.ContainsFunc(s.Conditions, func(c nodesdomain.Condition) bool {
		return c.Type == nodesdomain.CondNodeUnreachable
	}) {
		t.Fatalf("after the renewal: %+v", s)
	}

	// No node session serves it: it is neither drained nor sent commands.
	if _, err := nodes.Drain.Call(ctx, c, nodes.DrainInput{TenantID: "acme", NodeID: nodeID}); core.AsError(err).Details["reason"] != "siteNode" {
		t.Fatalf("nodes.drain of the site node = %v", err)
	}
	if _, err := nodes.RunCommand.Call(ctx, c, nodes.RunCommandInput{TenantID: "acme", NodeID: nodeID, Kind: protocol.CommandInventoryRefresh}); core.AsError(err).Details["reason"] != "siteNode" {
		t.Fatalf("commands.run on the site node = %v", err)
	}

	// No node joins a pool as a site node.
	err = e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := nodesdomain.Create(ctx, tx, nodesdomain.TypesOf(e.catalog), nodesdomain.NewNode{PoolID: p.ID, Name: "x",
			Role: nodestate.RoleSite})
		return err
	})
	if codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("a pooled site node = %v, want INVALID_INPUT", err)
	}
}

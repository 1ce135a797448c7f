package api_test

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/core"
)

func drainNode(ctx context.Context, c *api.Client, nodeID, mode string) (nodes.Node, error) {
	var out nodes.Node
	in := map[string]string{"tenantId": "acme", "nodeId": nodeID}
	if mode != "" {
		in["mode"] = mode
	}
	return out, c.Call(ctx, "nodes.drain", in, &out)
}

// A pool's disruption budget bounds how many of its nodes drain at once; a
// refused drain changes nothing, and uncordoning ends a drain.
func TestNodesDrainRespectsTheDisruptionBudget(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{}`) // the default budget, 0.05: one node at a time
	a := e.node(schedulableNode(p.ID, "gpu-a01"), fixture(t, "h100-8x-sxm.json"))
	b := e.node(schedulableNode(p.ID, "gpu-a02"), fixture(t, "h100-8x-sxm.json"))
	c := e.client(e.boot.UserToken)

	n, err := drainNode(ctx, c, a.ID, "")
	if err != nil || n.DrainState != "draining" || n.DrainMode != "wait" || !n.Cordoned || n.Schedulable {
		t.Fatalf("drain = %+v, %v", n, err)
	}
	if again, err := drainNode(ctx, c, a.ID, "release"); err != nil || again.DrainMode != "wait" {
		t.Fatalf("draining again = %+v, %v; want the drain unchanged", again, err)
	}
	_, err = drainNode(ctx, c, b.ID, "release")
	if ce := core.AsError(err); ce.Code != core.CodeInvalidState || ce.Details["reason"] != "disruptionBudget" {
		t.Fatalf("a second drain = %v %+v", err, ce.Details)
	}
	if got, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: b.ID}); err != nil || got.Cordoned || got.DrainState != "" {
		t.Fatalf("the refused node = %+v, %v", got, err)
	}
	if _, err := drainNode(ctx, c, b.ID, "sometimes"); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("bad mode = %v", err)
	}
	if n, err := nodes.Uncordon.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: a.ID}); err != nil || n.DrainState != "" || n.Cordoned {
		t.Fatalf("uncordon = %+v, %v", n, err)
	}
	if n, err := drainNode(ctx, c, b.ID, "release"); err != nil || n.DrainState != "draining" {
		t.Fatalf("drain after the first ended = %+v, %v", n, err)
	}
	if _, err := drainNode(ctx, e.client(e.globex), a.ID, ""); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("another tenant = %v", err)
	}
}

package api_test

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/core"
)

// A machine joining a pool with acceptance checks lands adopting and is
// not schedulable; nodes.adopt takes it over once its agent is connected
// and has observed its NodeSpec, recording the checks attested.
func TestNodesAdopt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.withNodeCA()
	c := e.client(e.boot.UserToken)
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{"acceptance":["burn-in","nccl-allreduce"]}`)
	id, err := join.Join(ctx, join.Options{APIURL: e.url, Token: e.joinToken(p.ID, 1), StateDir: t.TempDir(),
		Name: "gpu-a01", Inventory: machine(t, "adopt")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := nodes.Get.Call(ctx, c, nodes.NodeInput{TenantID: "acme", NodeID: id.NodeID})
	if err != nil || got.ProvisionState != "adopting" || got.Schedulable || got.Metal != nil {
		t.Fatalf("joined node = %+v, %v", got, err)
	}
	n := got.Node
	// Its agent has not connected yet.
	_, err = e.callAdopt(ctx, id.NodeID)
	if ce := core.AsError(err); ce.Code != core.CodeInvalidState || ce.Details["reason"] != "agentNotReady" {
		t.Fatalf("adopt before the agent = %v %+v", err, ce.Details)
	}
	// As a session and an observed NodeSpec would leave it.
	if _, err := e.store.Pool.Exec(ctx, `UPDATE nodes SET connectivity = 'connected', observed_generation = generation WHERE id = $1`, id.NodeID); err != nil {
		t.Fatal(err)
	}
	for range 2 { // adopting an adopted node answers it as it is
		n, err = e.callAdopt(ctx, id.NodeID)
		if err != nil || n.ProvisionState != "adopted" || !n.Schedulable {
			t.Fatalf("adopt = %+v, %v", n, err)
		}
	}
	if got := e.count(`SELECT count(*) FROM node_events WHERE node_id = $1 AND type = 'Adopted'
		AND details->'acceptance' = '["burn-in", "nccl-allreduce"]'::jsonb`, id.NodeID); got != 1 {
		t.Fatalf("%d Adopted events with the checks", got)
	}
	if err := e.client(e.globex).Call(ctx, "nodes.adopt", map[string]string{"tenantId": "acme", "nodeId": id.NodeID}, nil); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("another tenant = %v", err)
	}
}

func (e *env) callAdopt(ctx context.Context, nodeID string) (nodes.Node, error) {
	var n nodes.Node
	return n, e.client(e.boot.UserToken).Call(ctx, "nodes.adopt", map[string]string{"tenantId": "acme", "nodeId": nodeID}, &n)
}

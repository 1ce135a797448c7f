package api_test

import (
	"context"
	"slices"
	"testing"

	apidrivers "github.com/better-compute/better-compute/api/drivers"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/drivers"
)

func TestDriversList(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	out, err := apidrivers.List.Call(ctx, e.client(e.globex), rpc.TenantListInput{TenantID: "globex"})
	if err != nil || out.NextCursor != "" {
		t.Fatalf("drivers.list = %+v, %v", out, err)
	}
	byName := map[string]apidrivers.Info{}
	for _, d := range out.Items {
		byName[d.Name] = d
	}
	rf, ipmi := byName[drivers.DriverRedfish], byName[drivers.DriverIPMI]
	if len(out.Items) != 2 || rf.Protocol != "redfish" || ipmi.Protocol != "ipmi" {
		t.Fatalf("drivers.list = %+v", out.Items)
	}
	if rf.Version != drivers.BMCLibVersion || rf.Library != drivers.BMCLibModule ||
		!slices.Equal(rf.Concerns, drivers.Concerns) || !slices.Contains(ipmi.Concerns, drivers.ConcernPower) ||
		slices.Contains(ipmi.Concerns, drivers.ConcernVirtualMedia) {
		t.Fatalf("drivers.list = %+v", out.Items)
	}
	// It pages like every list.
	first, err := apidrivers.List.Call(ctx, e.client(e.globex), rpc.TenantListInput{TenantID: "globex", ListInput: rpc.ListInput{Limit: 1}})
	if err != nil || len(first.Items) != 1 || first.Items[0].Name != drivers.DriverIPMI || first.NextCursor == "" {
		t.Fatalf("drivers.list's first page of 1 = %+v, %v", first, err)
	}
	second, err := apidrivers.List.Call(ctx, e.client(e.globex), rpc.TenantListInput{TenantID: "globex",
		ListInput: rpc.ListInput{Limit: 1, Cursor: first.NextCursor}})
	if err != nil || len(second.Items) != 1 || second.Items[0].Name != drivers.DriverRedfish || second.NextCursor != "" {
		t.Fatalf("drivers.list's second page of 1 = %+v, %v", second, err)
	}
	// A person with no policy in their tenant may not read it.
	if _, err := apidrivers.List.Call(ctx, e.client(e.stranger), rpc.TenantListInput{TenantID: "acme"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("drivers.list without a policy: %v, want ACCESS_DENIED", err)
	}
}

package nodes

import (
	"slices"
	"testing"
)

func TestSchedulable(t *testing.T) {
	ok := func() NodeView {
		return NodeView{ProvisionState: Adopted, Role: RoleHost, Connectivity: Connected, ObservedGeneration: 1,
			Trust: TrustPlatform, OwnerTenant: "acme"}
	}
	cases := []struct {
		name   string
		change func(*NodeView)
		pool   string
		want   string // the one failing reason, "" for schedulable
	}{
		{"all true (adopted)", func(*NodeView) {}, "acme", ""},
		{"all true (deployed)", func(n *NodeView) { n.ProvisionState = Deployed }, "acme", ""},
		{"tenant-owned in its owner's pool", func(n *NodeView) { n.Trust = TrustTenantOwned }, "acme", ""},
		{"provision state ready", func(n *NodeView) { n.ProvisionState = Ready }, "acme", ReasonProvisionState},
		{"role dedicated", func(n *NodeView) { n.Role = RoleDedicated }, "acme", ReasonRole},
		{"maintenance", func(n *NodeView) { n.Maintenance = true }, "acme", ReasonMaintenance},
		{"cordoned", func(n *NodeView) { n.Cordoned = true }, "acme", ReasonCordoned},
		{"disconnected", func(n *NodeView) { n.Connectivity = Disconnected }, "acme", ReasonConnectivity},
		{"no-schedule reasons", func(n *NodeView) { n.NoScheduleReasons = []string{"GpuCountMismatch"} }, "acme", ReasonNoScheduleReasons},
		{"observed generation 0", func(n *NodeView) { n.ObservedGeneration = 0 }, "acme", ReasonObservedGeneration},
		{"tenant-owned in another tenant's pool", func(n *NodeView) { n.Trust = TrustTenantOwned }, "globex", ReasonTrust},
		{"tenant-controlled", func(n *NodeView) { n.Trust = TrustTenantControlled }, "acme", ReasonTrust},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := ok()
			c.change(&n)
			got, reasons := Schedulable(n, c.pool)
			if c.want == "" {
				if !got || len(reasons) != 0 {
					t.Fatalf("Schedulable = %v, %v; want true", got, reasons)
				}
				return
			}
			if got || !slices.Equal(reasons, []string{c.want}) {
				t.Fatalf("Schedulable = %v, %v; want false, [%s]", got, reasons, c.want)
			}
		})
	}
	// Every failing clause is named, in order.
	_, reasons := Schedulable(NodeView{}, "acme")
	want := []string{ReasonProvisionState, ReasonRole, ReasonConnectivity, ReasonObservedGeneration, ReasonTrust}
	if !slices.Equal(reasons, want) {
		t.Fatalf("zero node reasons = %v, want %v", reasons, want)
	}
}

func TestAxesHaveTheSpecsValues(t *testing.T) {
	if len(ProvisionStates) != 13 || len(Powers) != 3 || len(Connectivities) != 4 || len(Roles) != 4 || len(Trusts) != 3 || len(Adapters) != 2 {
		t.Fatal("an axis lost or gained a value")
	}
}

// The types an input field may have list their values for its schema.
func TestEnumsListEveryValue(t *testing.T) {
	if got := ProvisionState("").Enum(); len(got) != len(ProvisionStates) || got[0] != string(Adopting) || got[12] != string(Retired) {
		t.Fatalf("provision states = %v", got)
	}
	if got := Connectivity("").Enum(); !slices.Equal(got, []string{"connected", "disconnected", "unreachable", "lost"}) {
		t.Fatalf("connectivities = %v", got)
	}
}

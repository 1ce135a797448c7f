package instances_test

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/instances"
)

// A tunnel dials a container at its address on the node's instance
// network and a VM only at its forwarded port (the guest's 22).
func TestTunnelTarget(t *testing.T) {
	f := newFixture(t, `{}`, 1)
	in, err := f.create(f.flavor(1, 512, 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, state, address string
		port                 int
		want, reason         string
	}{
		{"container", "running", "10.213.9.2", 8080, "10.213.9.2:8080", ""},
		{"vm's ssh", "running", "127.0.0.1:40022", 22, "127.0.0.1:40022", ""},
		{"vm's other port", "running", "127.0.0.1:40022", 80, "", "forwardedPort"},
		{"not running", "stopped", "10.213.9.2", 8080, "", "notRunning"},
		{"no address yet", "running", "", 8080, "", "notRunning"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.exec(`UPDATE instances SET state = $2, address = $3 WHERE id = $1`, in.ID, tc.state, tc.address)
			var node, addr string
			err := f.st.InTx(context.Background(), store.ReadOnly, func(tx store.Tx) (err error) {
				node, addr, err = domain.TunnelTarget(context.Background(), tx, tenant, in.ID, tc.port)
				return err
			})
			if tc.reason != "" {
				if got := core.AsError(err).Details["reason"]; got != tc.reason {
					t.Fatalf("err %v, reason %v; want %s", err, got, tc.reason)
				}
				return
			}
			if err != nil || node != in.NodeID || addr != tc.want {
				t.Fatalf("node %q address %q, %v; want %s on %s", node, addr, err, tc.want, in.NodeID)
			}
		})
	}
	err = f.st.InTx(context.Background(), store.ReadOnly, func(tx store.Tx) error {
		_, _, err := domain.TunnelTarget(context.Background(), tx, "ten_other", in.ID, 22)
		return err
	})
	if core.AsError(err).Code != core.CodeNotFound {
		t.Fatalf("another tenant's instance: %v", err)
	}
}

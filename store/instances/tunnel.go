package instances

import (
	"context"
	"net"
	"strconv"

	"github.com/better-compute/better-compute/agent/nodespec"

	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/instances"
	"github.com/better-compute/better-compute/store"
)

// TunnelTarget is where a tunnel to port of the tenant's instance goes:
// its node and the host:port the node dials (tunnels.open's
// InstanceTargets). Only a running instance on a vps-host node has one; a
// droplet is reached at its own public address, not through a node. A
// container is dialled at its address on the node's instance network; a
// VM, on user-mode networking, only at its forwarded port, which leads to
// its guest's port 22.
func TunnelTarget(ctx context.Context, tx store.Tx, tenantID, id string, port int) (nodeID, address string, err error) {
	in, err := Load(ctx, tx, tenantID, id, false)
	if err != nil {
		return "", "", err
	}
	if in.NodeID == "" {
		return "", "", core.Errorf(core.CodeUnsupported, "instance %s runs at a provider: reach it at its address %s", id, in.Address).
			WithDetails(map[string]any{"reason": "providerInstance"})
	}
	if in.State != string(states.Running) || in.Address == "" {
		return "", "", core.Errorf(core.CodeInvalidState, "instance %s is %s, not running", id, in.State).
			WithDetails(map[string]any{"reason": "notRunning", "state": in.State})
	}
	if _, _, err := net.SplitHostPort(in.Address); err == nil {
		if port != nodespec.VMGuestPort {
			return "", "", core.Errorf(core.CodeUnsupported, "instance %s is a VM: only its port %d is reachable (through %s)",
				id, nodespec.VMGuestPort, in.Address).WithDetails(map[string]any{"field": "port", "reason": "forwardedPort"})
		}
		return in.NodeID, in.Address, nil
	}
	return in.NodeID, net.JoinHostPort(in.Address, strconv.Itoa(port)), nil
}

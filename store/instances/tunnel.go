package instances

import (
	"context"
	"net"

	"github.com/better-compute/better-compute/core"
	states "github.com/better-compute/better-compute/core/instances"
	"github.com/better-compute/better-compute/store"
)

// TunnelTarget is where a tunnel to the tenant's instance goes: its node
// and its address on the node's instance network (tunnels.open's
// InstanceTargets). Only a running instance on a vps-host node has one; a
// droplet is reached at its own public address, not through a node.
func TunnelTarget(ctx context.Context, tx store.Tx, tenantID, id string) (nodeID, address string, err error) {
	in, err := Load(ctx, tx, tenantID, id, false)
	if err != nil {
		return "", "", err
	}
	if in.NodeID == "" {
		return "", "", core.Errorf(core.CodeUnsupported, "instance %s runs at a provider: reach it at its address %s", id, in.Address).
			WithDetails(map[string]any{"reason": "providerInstance"})
	}
	if in.State != string(states.Running) {
		return "", "", core.Errorf(core.CodeInvalidState, "instance %s is %s, not running", id, in.State).
			WithDetails(map[string]any{"reason": "notRunning", "state": in.State})
	}
	// A VM's address is a host port forwarded to its sshd (docs/instance-runtime.md):
	// no other port of it is reachable from the node.
	if _, _, err := net.SplitHostPort(in.Address); err == nil {
		return "", "", core.Errorf(core.CodeUnsupported, "instance %s is a VM reached only at its forwarded port %s", id, in.Address).
			WithDetails(map[string]any{"reason": "forwardedPort"})
	}
	return in.NodeID, in.Address, nil
}

package reservations

import (
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/store/pools"
)

// Bindings a reservation is made with.
const (
	BindingHold     = "hold"
	BindingInstance = "instance"
)

// poolClassVPSHost is the pool class binding instance reservations are
// made on: the class whose nodes run instances.
const poolClassVPSHost = "vps-host"

// checkInstanceBinding checks a binding instance request: its pool runs
// instances (vps-host; INVALID_INPUT field binding reason poolClass) and
// it is one allocation on one node, as an instance runs on one node
// (INVALID_INPUT field devices.topology reason singleNode for a gang of
// several nodes or an NVLink domain, which may span nodes). Topology any
// is placed as sameNode and answered so.
func checkInstanceBinding(pool pools.Pool, req placement.Request) (placement.Request, error) {
	if pool.Class != poolClassVPSHost {
		return req, core.Errorf(core.CodeInvalidInput, "binding instance is for vps-host pools; pool %s is a %s pool", pool.ID, pool.Class).
			WithDetails(map[string]any{"field": "binding", "reason": "poolClass"})
	}
	switch t := req.Topology; {
	case t.Type == placement.TopologyAny:
		req.Topology.Type = placement.TopologySameNode
	case t.Type == placement.TopologySameNode, t.Type == placement.TopologyGang && t.Nodes == 1:
	default:
		return req, core.Errorf(core.CodeInvalidInput,
			"an instance runs on one node: binding instance takes topology any, sameNode or a gang of one node, not %s", t.Type).
			WithDetails(map[string]any{"field": "devices.topology", "reason": "singleNode"})
	}
	return req, nil
}

package api

import (
	"github.com/better-compute/better-compute/api/batches"
	"github.com/better-compute/better-compute/api/capacity"
	"github.com/better-compute/better-compute/api/cloudresources"
	"github.com/better-compute/better-compute/api/drivers"
	"github.com/better-compute/better-compute/api/events"
	"github.com/better-compute/better-compute/api/flavors"
	"github.com/better-compute/better-compute/api/fleet"
	"github.com/better-compute/better-compute/api/images"
	"github.com/better-compute/better-compute/api/instances"
	"github.com/better-compute/better-compute/api/metal"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/profiles"
	"github.com/better-compute/better-compute/api/projects"
	"github.com/better-compute/better-compute/api/provideraccounts"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/api/rollouts"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/api/sandboxes"
	"github.com/better-compute/better-compute/api/secrets"
	"github.com/better-compute/better-compute/api/sites"
	"github.com/better-compute/better-compute/api/tunnels"
	"github.com/better-compute/better-compute/api/usage"
	"github.com/better-compute/better-compute/api/webhooks"
	"github.com/better-compute/better-compute/api/workflows"
	instancestore "github.com/better-compute/better-compute/store/instances"
	workflowstore "github.com/better-compute/better-compute/store/workflows"
)

// Domains are the method groups the API serves, each described by its
// domain's descriptors. Adding a group is one line here.
var Domains = []rpc.Domain{
	projects.Methods,
	events.Methods,
	usage.Methods,
	pools.Methods,
	sites.Methods,
	capacity.Methods,
	reservations.Methods,
	nodes.Methods,
	metal.Methods,
	secrets.Methods,
	drivers.Methods,
	images.Methods,
	profiles.Domain(workflowstore.LiveCount),
	workflows.Methods,
	provideraccounts.Methods,
	flavors.Methods,
	tunnels.Domain(instancestore.TunnelTarget),
	instances.Methods,
	cloudresources.Methods,
	fleet.Methods,
	sandboxes.Methods,
	rollouts.Methods,
	batches.Methods,
	webhooks.Methods,
}

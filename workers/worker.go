package workers

import (
	"context"
	"fmt"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	batchesact "github.com/better-compute/better-compute/activities/batches"
	cloudresourcesact "github.com/better-compute/better-compute/activities/cloudresources"
	fleetact "github.com/better-compute/better-compute/activities/fleet"
	healthact "github.com/better-compute/better-compute/activities/health"
	instancesact "github.com/better-compute/better-compute/activities/instances"
	metalact "github.com/better-compute/better-compute/activities/metal"
	nodesact "github.com/better-compute/better-compute/activities/nodes"
	reservationsact "github.com/better-compute/better-compute/activities/reservations"
	rolloutsact "github.com/better-compute/better-compute/activities/rollouts"
	sandboxesact "github.com/better-compute/better-compute/activities/sandboxes"
	webhooksact "github.com/better-compute/better-compute/activities/webhooks"
	"github.com/better-compute/better-compute/core"
	coresandboxes "github.com/better-compute/better-compute/core/sandboxes"
	"github.com/better-compute/better-compute/drivers/providers"
	webhooksender "github.com/better-compute/better-compute/drivers/webhooks"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	"github.com/better-compute/better-compute/store/secrets"
	"github.com/better-compute/better-compute/workflows/batches"
	"github.com/better-compute/better-compute/workflows/cloudresources"
	"github.com/better-compute/better-compute/workflows/fleet"
	"github.com/better-compute/better-compute/workflows/health"
	"github.com/better-compute/better-compute/workflows/instances"
	"github.com/better-compute/better-compute/workflows/metal/lifecycle"
	"github.com/better-compute/better-compute/workflows/nodes"
	"github.com/better-compute/better-compute/workflows/reservations"
	"github.com/better-compute/better-compute/workflows/rollouts"
	"github.com/better-compute/better-compute/workflows/sandboxes"
	"github.com/better-compute/better-compute/workflows/sites"
	"github.com/better-compute/better-compute/workflows/webhooks"
)

// Deps are what the control-plane activities need.
type Deps struct {
	Store *store.Store
	// Metrics, when set, counts workflow and activity failures.
	Metrics *Metrics
	// Catalog names the authorization rows' types the metal activities
	// write (nil: core.DefaultCatalog).
	Catalog *core.Catalog
	// Providers opens provider pools' accounts and Secrets resolves their
	// tokens and instances' user data, for the instance activities of
	// provider pools (nil: those activities fail and are retried).
	Providers providers.Factory
	Secrets   *secrets.Vault
	// Blobs holds images' and sandbox snapshots' bytes (nil: the
	// reconciler keeps deleted snapshots' bytes).
	Blobs blobs.Store
	// CloudResources tunes the cloud-resource reconciler: the waits its
	// workflows are started with and its bounds (tests shorten them).
	CloudResources CloudResourcesTuning
	// Webhooks tunes webhook delivery: loopback receivers allowed (the dev
	// stack, tests) and the idle poll (0: the default).
	Webhooks WebhooksTuning
}

// WebhooksTuning tunes webhook delivery.
type WebhooksTuning struct {
	AllowLoopback bool
	IdlePoll      time.Duration
	// Timeout bounds one attempt (0: drivers/webhooks.DefaultTimeout).
	Timeout time.Duration
}

// CloudResourcesTuning tunes the cloud-resource reconciler (0: defaults).
type CloudResourcesTuning struct {
	ConvergingEvery, SettledEvery time.Duration
	cloudresourcesact.Tuning
}

// NewControlPlane builds the worker of the control-plane task queue with
// every workflow and activity that runs there. Start it with Run or Start.
func NewControlPlane(c client.Client, deps Deps) worker.Worker {
	opts := worker.Options{}
	if deps.Metrics != nil {
		opts.Interceptors = append(opts.Interceptors, deps.Metrics.Interceptor())
	}
	w := worker.New(c, ControlPlaneQueue, opts)
	registerControlPlane(w, c, deps)
	return w
}

// registerControlPlane lists the domains whose workflows and activities run
// on the control-plane queue; each registers its own.
func registerControlPlane(r worker.Registry, c client.Client, deps Deps) {
	health.Register(r, &healthact.Health{Store: deps.Store})
	fleet.Register(r, &fleetact.Fleet{Store: deps.Store, Catalog: catalogOf(deps), Temporal: c, TaskQueue: ControlPlaneQueue})
	sites.Register(r)
	reservations.Register(r, &reservationsact.Reservations{Store: deps.Store, Temporal: c, TaskQueue: ControlPlaneQueue})
	nodes.Register(r, &nodesact.Nodes{Store: deps.Store, Temporal: c})
	lifecycle.Register(r, &metalact.Metal{Store: metalStore(deps), Temporal: c, TaskQueue: ControlPlaneQueue})
	instances.Register(r, &instancesact.Instances{Store: deps.Store, Temporal: c, TaskQueue: ControlPlaneQueue, Providers: deps.Providers, Secrets: deps.Secrets})
	tuning := deps.CloudResources
	cloudresources.Register(r, &cloudresourcesact.Resources{Store: deps.Store, Providers: deps.Providers, Secrets: deps.Secrets,
		Tuning: tuning.Tuning,
		StartWorkflow: func(ctx context.Context, p cloudresourcesact.ResourceParams) error {
			p.ConvergingEvery, p.SettledEvery = tuning.ConvergingEvery, tuning.SettledEvery
			return cloudresourcesact.StartResource(ctx, c, ControlPlaneQueue, p)
		}})
	rollouts.Register(r, &rolloutsact.Rollouts{Store: deps.Store, Temporal: c, TaskQueue: ControlPlaneQueue})
	batches.Register(r, &batchesact.Batches{Store: deps.Store, Temporal: c, TaskQueue: ControlPlaneQueue})
	webhooks.Register(r, &webhooksact.Webhooks{Store: deps.Store, Vault: deps.Secrets, Temporal: c, TaskQueue: ControlPlaneQueue,
		Sender: webhooksender.New(deps.Webhooks.AllowLoopback, deps.Webhooks.Timeout), IdlePoll: deps.Webhooks.IdlePoll})
	sandboxes.Register(r, &sandboxesact.Sandboxes{Store: deps.Store, Temporal: c, TaskQueue: ControlPlaneQueue,
		SandboxType:  catalogOf(deps).FullName(coresandboxes.ResourceType),
		SnapshotType: catalogOf(deps).FullName(coresandboxes.SnapshotResourceType), Blobs: deps.Blobs})
}

// catalogOf is deps' catalog, or the default one.
func catalogOf(deps Deps) *core.Catalog {
	if deps.Catalog != nil {
		return deps.Catalog
	}
	catalog, err := core.DefaultCatalog()
	if err != nil {
		panic(fmt.Sprintf("the default catalog: %v", err)) // built in: cannot fail
	}
	return catalog
}

// metalStore is the metal activities' store over deps.Store (nil without
// one, as in registration tests).
func metalStore(deps Deps) metalact.Store {
	if deps.Store == nil {
		return nil
	}
	return metalact.NewDBStore(deps.Store, catalogOf(deps))
}

// EnsureSchedules creates the control plane's Temporal schedules unless they
// exist: the reservations and metal reconcilers. Every worker calls it at
// start.
func EnsureSchedules(ctx context.Context, c client.Client) error {
	if err := reservations.EnsureSchedule(ctx, c, ControlPlaneQueue); err != nil {
		return err
	}
	if err := lifecycle.EnsureSchedule(ctx, c, ControlPlaneQueue); err != nil {
		return err
	}
	if err := instances.EnsureSchedule(ctx, c, ControlPlaneQueue); err != nil {
		return err
	}
	if err := webhooks.EnsureSchedule(ctx, c, ControlPlaneQueue); err != nil {
		return err
	}
	if err := fleet.EnsureSchedule(ctx, c, ControlPlaneQueue); err != nil {
		return err
	}
	if err := rollouts.EnsureSchedule(ctx, c, ControlPlaneQueue); err != nil {
		return err
	}
	if err := batches.EnsureSchedule(ctx, c, ControlPlaneQueue); err != nil {
		return err
	}
	if err := cloudresources.EnsureSchedule(ctx, c, ControlPlaneQueue); err != nil {
		return err
	}
	return sandboxes.EnsureSchedule(ctx, c, ControlPlaneQueue)
}

// Package controlplane wires one API process: the authorization projection
// and its resolver, the embedded IAM behind its caches, the IAM admin
// surface and the API server. `serve` and the dev stack both build theirs
// here, so the two cannot drift apart.
package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// Config is what the wiring needs from the process.
type Config struct {
	Store      *store.Store
	Temporal   client.Client
	TaskQueue  string
	RootTenant string // default api.DefaultRootTenant
	Logger     *slog.Logger
}

// ControlPlane is a wired API process.
type ControlPlane struct {
	API        *api.Server
	IAM        *iam.CachingPort
	Admin      *iam.Admin
	Projection *iam.Projection
	Catalog    *core.Catalog
	// Warnings are the registry's start-up findings (`doctor` prints them).
	Warnings []core.Warning

	stop func()
	wg   sync.WaitGroup
}

// New loads the authorization projection (so the first decision does not
// deny), starts tailing it and following IAM's change events (which drop
// cached answers), and builds the API. Close stops both.
func New(ctx context.Context, cfg Config) (*ControlPlane, error) {
	if cfg.RootTenant == "" {
		cfg.RootTenant = api.DefaultRootTenant
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	catalog, err := core.DefaultCatalog()
	if err != nil {
		return nil, err
	}
	registry, err := core.TableRegistry()
	if err != nil {
		return nil, err
	}
	warnings, err := core.CheckRegistry(catalog, registry)
	if err != nil {
		return nil, err
	}
	projection := iam.NewProjection(cfg.Store, iam.ProjectionOptions{Catalog: catalog, Logger: cfg.Logger.With("component", "authz-projection")})
	if err := projection.Load(ctx); err != nil {
		return nil, fmt.Errorf("authorization projection: %w", err)
	}
	resolver, err := iam.NewProjectionResolver(iam.ProjectionResolverConfig{Projection: projection, Catalog: catalog, RootTenant: cfg.RootTenant})
	if err != nil {
		return nil, err
	}
	embedded, err := iam.NewEmbedded(iam.EmbeddedConfig{
		Store: cfg.Store, Catalog: catalog, Resolver: resolver, RootTenantID: cfg.RootTenant,
		Logger: cfg.Logger.With("component", "iam"),
	})
	if err != nil {
		return nil, err
	}
	caching := iam.NewCachingPort(embedded, iam.CacheOptions{})
	admin, err := iam.NewAdmin(iam.AdminConfig{Store: cfg.Store, Catalog: catalog, RootTenantID: cfg.RootTenant, Logger: cfg.Logger.With("component", "iam-admin")})
	if err != nil {
		return nil, err
	}
	srv, err := api.New(api.Deps{
		Store: cfg.Store, Temporal: cfg.Temporal, TaskQueue: cfg.TaskQueue,
		IAM: caching.Port(), Catalog: catalog, Registry: registry, RootTenant: cfg.RootTenant,
		Projection: projection, IAMAdmin: iam.AdminHandler(admin, caching.Port()),
		Logger: cfg.Logger.With("component", "api"),
	})
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	cp := &ControlPlane{API: srv, IAM: caching, Admin: admin, Projection: projection, Catalog: catalog, Warnings: warnings, stop: stop}
	cp.wg.Go(func() { _ = projection.Run(runCtx) })
	cp.wg.Go(func() { caching.FollowEvents(runCtx, cfg.Store, cfg.Logger.With("component", "iam-events")) })
	return cp, nil
}

// Close stops the projection's tailer and the IAM events listener.
func (cp *ControlPlane) Close() {
	cp.stop()
	cp.wg.Wait()
}

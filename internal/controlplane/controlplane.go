// Package controlplane wires one API process: the authorization projection
// and its resolver, the embedded IAM behind its caches, the IAM admin
// surface and the API server. `serve` and the dev stack both build theirs
// here, so the two cannot drift apart.
package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
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
	// RemoteIAM, when set, decides through an IAM host over HTTP instead of
	// the embedded IAM; the admin surface is then the host's.
	RemoteIAM *RemoteIAM
}

// RemoteIAM says where the IAM host is and how to refresh admissions there.
type RemoteIAM struct {
	URL string
	// RefreshSecret, when set, signs refreshes to the host so admissions
	// never decide on the replica's stale copy; without it `doctor` warns
	// iam.refresh.
	RefreshSecret []byte
}

// ControlPlane is a wired API process.
type ControlPlane struct {
	API *api.Server
	IAM *iam.CachingPort
	// Admin is the embedded IAM's admin service; nil with a remote IAM.
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
	warnings = append(warnings, ConfigWarnings(cfg)...)
	projection := iam.NewProjection(cfg.Store, iam.ProjectionOptions{Catalog: catalog, Logger: cfg.Logger.With("component", "authz-projection")})
	if err := projection.Load(ctx); err != nil {
		return nil, fmt.Errorf("authorization projection: %w", err)
	}
	resolver, err := iam.NewProjectionResolver(iam.ProjectionResolverConfig{Projection: projection, Catalog: catalog, RootTenant: cfg.RootTenant})
	if err != nil {
		return nil, err
	}
	var decider iam.Port
	var admin *iam.Admin
	var adminHandler http.Handler
	if cfg.RemoteIAM != nil {
		rc := iam.RemoteConfig{BaseURL: cfg.RemoteIAM.URL}
		if len(cfg.RemoteIAM.RefreshSecret) > 0 {
			rc.Refresh = &iam.RemoteRefresh{Secret: cfg.RemoteIAM.RefreshSecret, PrimaryLSN: cfg.Store.WALPosition}
		}
		if decider, err = iam.NewRemotePort(rc); err != nil {
			return nil, err
		}
	} else {
		if decider, err = iam.NewEmbedded(iam.EmbeddedConfig{
			Store: cfg.Store, Catalog: catalog, Resolver: resolver, RootTenantID: cfg.RootTenant,
			Logger: cfg.Logger.With("component", "iam"),
		}); err != nil {
			return nil, err
		}
		if admin, err = iam.NewAdmin(iam.AdminConfig{Store: cfg.Store, Catalog: catalog, RootTenantID: cfg.RootTenant, Logger: cfg.Logger.With("component", "iam-admin")}); err != nil {
			return nil, err
		}
	}
	caching := iam.NewCachingPort(decider, iam.CacheOptions{})
	if admin != nil {
		adminHandler = iam.AdminHandler(admin, caching.Port())
	}
	srv, err := api.New(api.Deps{
		Store: cfg.Store, Temporal: cfg.Temporal, TaskQueue: cfg.TaskQueue,
		IAM: caching.Port(), Catalog: catalog, Registry: registry, RootTenant: cfg.RootTenant,
		Projection: projection, IAMAdmin: adminHandler,
		Logger: cfg.Logger.With("component", "api"),
	})
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	cp := &ControlPlane{API: srv, IAM: caching, Admin: admin, Projection: projection, Catalog: catalog, Warnings: warnings, stop: stop}
	cp.wg.Go(func() { _ = projection.Run(runCtx) })
	cp.wg.Go(func() { caching.FollowEvents(runCtx, cfg.Store, cfg.Logger.With("component", "iam-events"), nil) })
	return cp, nil
}

// WarnIAMRefresh is doctor's warning for a remote IAM without signed refresh.
const WarnIAMRefresh = "iam.refresh"

// ConfigWarnings are the findings of a configuration that works but is
// weaker than it should be.
func ConfigWarnings(cfg Config) []core.Warning {
	if cfg.RemoteIAM != nil && len(cfg.RemoteIAM.RefreshSecret) == 0 {
		return []core.Warning{{Code: WarnIAMRefresh, Subject: cfg.RemoteIAM.URL,
			Message: "remote IAM without a refresh secret: admissions may decide on a copy up to the replica lag plus 1 second old"}}
	}
	return nil
}

// Close stops the projection's tailer and the IAM events listener.
func (cp *ControlPlane) Close() {
	cp.stop()
	cp.wg.Wait()
}

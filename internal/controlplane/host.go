package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// HostConfig is what `better-compute iam-host` needs.
type HostConfig struct {
	// IAMStore holds IAM's own tables (identities, policies, the audit
	// chain): it must be writable.
	IAMStore *store.Store
	// ComputeStore is where the host reads compute's tables for its
	// projection, normally a streaming replica of compute's database.
	ComputeStore  *store.Store
	RootTenant    string
	RefreshSecret []byte // empty: the refresh handler refuses every call
	Logger        *slog.Logger
}

// Host is a wired IAM host: the IAM protocol at /iam/v1/ and the admin
// surface at /api/iam/.
type Host struct {
	Handler    http.Handler
	Projection *iam.Projection
	stop       func()
	wg         sync.WaitGroup
}

// NewHost loads the projection from the compute store, starts tailing it
// and following IAM's events, and builds the host's handler.
func NewHost(ctx context.Context, cfg HostConfig) (*Host, error) {
	if cfg.RootTenant == "" {
		cfg.RootTenant = iam.DefaultRootTenantID
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	catalog, err := core.DefaultCatalog()
	if err != nil {
		return nil, err
	}
	projection := iam.NewProjection(cfg.ComputeStore, iam.ProjectionOptions{Catalog: catalog, Logger: cfg.Logger.With("component", "authz-projection")})
	if err := projection.Load(ctx); err != nil {
		return nil, fmt.Errorf("authorization projection: %w", err)
	}
	resolver, err := iam.NewProjectionResolver(iam.ProjectionResolverConfig{Projection: projection, Catalog: catalog, RootTenant: cfg.RootTenant})
	if err != nil {
		return nil, err
	}
	embedded, err := iam.NewEmbedded(iam.EmbeddedConfig{Store: cfg.IAMStore, Catalog: catalog, Resolver: resolver,
		RootTenantID: cfg.RootTenant, Logger: cfg.Logger.With("component", "iam")})
	if err != nil {
		return nil, err
	}
	caching := iam.NewCachingPort(embedded, iam.CacheOptions{AuthenticationsOnly: true})
	protocol, err := iam.HostHandler(iam.HostConfig{
		Port: caching.Port(), Projection: projection, ReplicaLSN: cfg.ComputeStore.WALPosition,
		RefreshSecret: cfg.RefreshSecret, Logger: cfg.Logger.With("component", "iam-host"),
	})
	if err != nil {
		return nil, err
	}
	admin, err := iam.NewAdmin(iam.AdminConfig{Store: cfg.IAMStore, Catalog: catalog, RootTenantID: cfg.RootTenant, Logger: cfg.Logger.With("component", "iam-admin")})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(iam.HostPathPrefix, protocol)
	mux.Handle(iam.AdminPathPrefix, iam.AdminHandler(admin, caching.Port()))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if !projection.Loaded() || cfg.IAMStore.Ping(r.Context()) != nil {
			http.Error(w, `{"status":"degraded"}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	h := &Host{Handler: mux, Projection: projection, stop: stop}
	h.wg.Go(func() { _ = projection.Run(runCtx) })
	h.wg.Go(func() { caching.FollowEvents(runCtx, cfg.IAMStore, cfg.Logger.With("component", "iam-events"), nil) })
	return h, nil
}

// Close stops the projection's tailer and the events listener.
func (h *Host) Close() {
	h.stop()
	h.wg.Wait()
}

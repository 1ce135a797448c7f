// Package controlplane wires one API process: the authorization projection
// and its resolver, the embedded IAM behind its caches, the IAM admin
// surface, the agent gateway and the API server. `serve` and the dev stack both build theirs
// here, so the two cannot drift apart.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"github.com/better-compute/better-compute/drivers/providers"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	coreimages "github.com/better-compute/better-compute/core/images"
	imagestore "github.com/better-compute/better-compute/store/images"
	workflowstore "github.com/better-compute/better-compute/store/workflows"

	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"

	reservationsact "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/agentgateway"
	"github.com/better-compute/better-compute/api/console"
	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	"github.com/better-compute/better-compute/store/secrets"
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
	// NodeCA signs joining nodes' certificates and verifies them on the
	// agent listener (ServeAgents); without it nodes cannot join.
	NodeCA *nodeca.CA
	// AgentEndpoint is the agent listener's URL told to joining nodes
	// ("https://host:port").
	AgentEndpoint string
	// LivenessSweep is how often this process moves nodes whose liveness
	// lease lapsed to unreachable and then lost (default 5 s; every API
	// process sweeps, the updates are idempotent).
	LivenessSweep time.Duration
	// AgentLease and AgentHeartbeat override the session's liveness lease
	// (40 s) and heartbeat period (10 s); tests shrink them.
	AgentLease, AgentHeartbeat time.Duration
	// TemporalAddress and TemporalNamespace are told to registering site
	// agents (`bcd site`), which run their workers there.
	TemporalAddress, TemporalNamespace string
	// AgentTimeouts bound a request on the agent listener (the httpx
	// defaults for zero fields): the TLS handshake, the headers and, until
	// the session handler has checked the node and clears its stream's read
	// deadline, the body. A session's lifetime is bounded by its liveness
	// lease, not by them.
	AgentTimeouts httpx.Timeouts
	// ReservationMaxAhead bounds how far ahead a reservation may start (0:
	// one year).
	ReservationMaxAhead time.Duration
	// Metrics, when set, is the registry /metrics serves, so a worker in the
	// same process (the dev stack's) can add its series; a new one when nil.
	Metrics *prometheus.Registry
	// PublicURL is the API's base URL as nodes reach it (api.Deps).
	PublicURL string
	// ReservationStarter, when set, is the starter the API hands admitted
	// reservations to, and the caller runs it (tests stop one before it
	// starts anything). When nil and Temporal is set, New makes one and
	// runs it until Close.
	ReservationStarter *reservationsact.Starter
	// SecretsKeys are the secret store's key-encryption keys; without them
	// secrets.put and every resolution answer UNAVAILABLE (nothing is ever
	// stored in clear).
	SecretsKeys *secrets.Keyring
	// Blobs holds images' bytes (uploads, the site image endpoint); nil
	// answers images.register and both endpoints UNAVAILABLE.
	Blobs blobs.Store
	// ImageForSite says which image a node's workflow in flight writes,
	// for the site image endpoint (agentgateway.Deps).
	ImageForSite agentgateway.ImageForSite
	// Providers opens capacity providers (providerAccounts.offers); nil:
	// ProviderFactory's, limited in PostgreSQL.
	Providers providers.Factory
	// CloudResources configures the cloud-resources module (rpc.Deps).
	CloudResources rpc.CloudResourcesConfig
	// WebhookLoopback lets webhooks reach loopback receivers (rpc.Deps):
	// the dev stack's.
	WebhookLoopback bool
	// Console configures the web console at /console/.
	Console ConsoleConfig
}

// ConsoleConfig configures the console (api/console.Config).
type ConsoleConfig struct {
	// InsecureCookies drops the session cookie's Secure attribute (the dev
	// stack, plain HTTP on loopback); TemporalUI is the Temporal UI's base
	// URL for the links to workflows.
	InsecureCookies bool
	TemporalUI      string
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
	// Gateway serves the agent protocol: its join and site routes are
	// mounted on the API's, its sessions on the agent listener.
	Gateway *agentgateway.Gateway
	IAM     *iam.CachingPort
	// Admin is the embedded IAM's admin service; nil with a remote IAM.
	Admin      *iam.Admin
	Projection *iam.Projection
	Catalog    *core.Catalog
	// Secrets is the vault of Config.SecretsKeys: what resolves a secret reference just
	// before its use (the site endpoints' BMC credentials).
	Secrets *secrets.Vault
	// Warnings are the registry's start-up findings (`doctor` prints them).
	Warnings []core.Warning

	nodeCA        *nodeca.CA
	agentTimeouts httpx.Timeouts
	stop          func()
	wg            sync.WaitGroup
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
	registry, err := api.BuildRegistry(api.Domains)
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
	metrics := cfg.Metrics
	if metrics == nil {
		metrics = prometheus.NewRegistry()
	}
	metrics.MustRegister(caching.Collector())
	vault := secrets.NewVault(cfg.SecretsKeys, cfg.RootTenant)
	gateway, err := agentgateway.New(agentgateway.Deps{
		Store: cfg.Store, Catalog: catalog, RootTenant: cfg.RootTenant,
		NodeCA: cfg.NodeCA, AgentEndpoint: cfg.AgentEndpoint,
		AgentLease: cfg.AgentLease, AgentHeartbeat: cfg.AgentHeartbeat,
		TemporalAddress: cfg.TemporalAddress, TemporalNamespace: cfg.TemporalNamespace, Temporal: cfg.Temporal,
		Logger: cfg.Logger.With("component", "agent-gateway"), Metrics: metrics, Secrets: vault,
		Blobs: cfg.Blobs, ImageForSite: imageForSite(cfg.ImageForSite),
	})
	if err != nil {
		return nil, err
	}
	starter, runStarter := cfg.ReservationStarter, false
	if starter == nil && cfg.Temporal != nil {
		starter = reservationsact.NewStarter(cfg.Store, cfg.Temporal, cfg.TaskQueue,
			cfg.Logger.With("component", "reservation-starter"), reservationsact.StarterOptions{})
		runStarter = true
	}
	var starts rpc.WorkflowStarter
	if starter != nil {
		starts = starter
	}
	if cfg.Providers == nil && cfg.Store != nil {
		if cfg.Providers, err = ProviderFactory(cfg.Store, cfg.Logger.With("component", "providers")); err != nil {
			return nil, err
		}
	}
	web, err := console.New(console.Config{IAM: caching.Port(), RootTenant: cfg.RootTenant,
		InsecureCookies: cfg.Console.InsecureCookies, TemporalUI: cfg.Console.TemporalUI, Namespace: cfg.TemporalNamespace})
	if err != nil {
		return nil, err
	}
	var approvers rpc.ApproverKeys
	if admin != nil { // a remote IAM serves no approver keys to compute (yet)
		approvers = admin
	}
	srv, err := api.New(api.Deps{
		Store: cfg.Store, Temporal: cfg.Temporal, TaskQueue: cfg.TaskQueue, ReservationStarts: starts,
		IAM: caching.Port(), Catalog: catalog, RootTenant: cfg.RootTenant,
		Projection: projection, IAMAdmin: adminHandler,
		Logger: cfg.Logger.With("component", "api"),
		NodeCA: cfg.NodeCA, Routes: gateway, Metrics: metrics, ReservationMaxAhead: cfg.ReservationMaxAhead,
		PublicURL: cfg.PublicURL, Secrets: vault, Blobs: cfg.Blobs, Providers: cfg.Providers, CloudResources: cfg.CloudResources,
		WebhookLoopback: cfg.WebhookLoopback, Approvers: approvers, Console: web,
	})
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	cp := &ControlPlane{API: srv, Gateway: gateway, IAM: caching, Admin: admin, Projection: projection, Catalog: catalog, Warnings: warnings, stop: stop,
		Secrets: vault}
	cp.wg.Go(func() { _ = projection.Run(runCtx) })
	cp.wg.Go(func() { caching.FollowEvents(runCtx, cfg.Store, cfg.Logger.With("component", "iam-events"), nil) })
	sweep := cfg.LivenessSweep
	if sweep <= 0 {
		sweep = 5 * time.Second
	}
	cp.wg.Go(func() { gateway.RunLivenessSweeper(runCtx, sweep) })
	if runStarter {
		cp.wg.Go(func() { _ = starter.Run(runCtx) })
	}
	cp.nodeCA = cfg.NodeCA
	cp.agentTimeouts = cfg.AgentTimeouts
	return cp, nil
}

// ServeAgents serves the agent listener on ln until ctx ends: TLS 1.3 with
// a server certificate for hosts from the node CA, client certificates of
// the node CA required, and the node sessions over HTTP/2.
func (cp *ControlPlane) ServeAgents(ctx context.Context, ln net.Listener, hosts []string) error {
	if cp.nodeCA == nil {
		return errors.New("agent listener: no node CA configured")
	}
	tlsConfig, err := agentgateway.TLSConfig(cp.nodeCA, hosts)
	if err != nil {
		return err
	}
	srv := httpx.NewServer(cp.Gateway.SessionHandler(), cp.agentTimeouts)
	srv.TLSConfig = tlsConfig
	srv.HTTP2 = agentgateway.HTTP2Config()
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		// Sessions are long-lived streams: end them (each marks its node
		// disconnected), wait a moment for their handlers, then close what
		// is left. Agents reconnect to another replica.
		cp.Gateway.CloseSessions()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			return srv.Close()
		}
		return nil
	}
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

// Close stops the projection's tailer, the IAM events listener, the
// liveness sweeper and the reservation starter.
func (cp *ControlPlane) Close() {
	cp.stop()
	cp.wg.Wait()
}

// imageForSite is the site image endpoint's check: the image a live
// workflow on the node writes (store/workflows), as its row stands now and
// only with the digest the workflow pinned. A configured check replaces it.
func imageForSite(configured agentgateway.ImageForSite) agentgateway.ImageForSite {
	if configured != nil {
		return configured
	}
	return func(ctx context.Context, tx store.Tx, siteID, nodeID, imageID string) (coreimages.Image, error) {
		ref, err := workflowstore.ImageForSite(ctx, tx, siteID, nodeID, imageID)
		if err != nil {
			return coreimages.Image{}, err
		}
		im, err := imagestore.Get(ctx, tx, ref.TenantID, ref.ID)
		if err != nil {
			return coreimages.Image{}, err
		}
		if im.SHA256 != ref.SHA256 {
			return coreimages.Image{}, core.Errorf(core.CodeNotFound, "image %s not found", imageID)
		}
		return im, nil
	}
}

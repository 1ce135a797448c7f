// Package agentgateway is the server side of the agent protocol
// (docs/agent-protocol.md): a node's join and join status and the site
// agent's register and renew (on the API listener, outside the method
// table), the mutual-TLS session stream and its hub (on the agent
// listener), and the liveness sweeper. It is its own value, built from its
// own Deps, beside the API server: the process mounts its routes next to
// the API's. Every write goes through store/nodes.
package agentgateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/api/tunnels"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// Defaults of Deps' durations.
const (
	DefaultAgentLease     = 40 * time.Second
	DefaultAgentHeartbeat = 10 * time.Second
	// DefaultIdentityRecheck is how often a session checks its identity
	// again (expiry; a revocation's notice ends it at once).
	DefaultIdentityRecheck = time.Minute
	// DefaultSiteLease is the site boot lease's ttl; the agent renews every
	// third of it.
	DefaultSiteLease = 30 * time.Second
)

// Deps are what the gateway needs from the process.
type Deps struct {
	Store *store.Store
	// Catalog defaults to the core catalog; RootTenant (default
	// iam.DefaultRootTenantID) owns the platform's pools, whose nodes are
	// platform-trusted.
	Catalog    *core.Catalog
	RootTenant string
	// NodeCA signs the certificates of joining nodes; without it the join
	// endpoints answer UNAVAILABLE "no node CA configured".
	NodeCA *nodeca.CA
	// AgentEndpoint is where joined agents open their session
	// ("https://host:port", the agent listener), told to them at join.
	AgentEndpoint string
	// AgentLease is a node session's liveness lease (default
	// DefaultAgentLease); AgentHeartbeat the heartbeat period the session
	// asks of the agent (default DefaultAgentHeartbeat). Tests shrink them.
	AgentLease     time.Duration
	AgentHeartbeat time.Duration
	// HeartbeatFlush is how long a heartbeat waits for others to join its
	// batch write (default DefaultHeartbeatFlush); IdentityRecheck how
	// often a session checks its certificate again on a heartbeat
	// (default DefaultIdentityRecheck; a revocation ends it at once).
	HeartbeatFlush  time.Duration
	IdentityRecheck time.Duration
	// TemporalAddress (host:port) and TemporalNamespace are the Temporal
	// frontend site agents (`bcd site`) are told to dial at registration;
	// without them site registration answers UNAVAILABLE.
	TemporalAddress   string
	TemporalNamespace string
	// SiteLease is the ttl of a site agent's boot lease (default
	// DefaultSiteLease). Tests shrink it.
	SiteLease time.Duration
	// Temporal, when set, is told (best effort) of a reservation the
	// liveness sweep placed again or ended, by its workflow's `changed`
	// signal; without it the reservation reconciler finds the change.
	Temporal client.Client
	Logger   *slog.Logger
	// Secrets resolves BMC password references for the site agents'
	// credential endpoint; without it that endpoint answers UNAVAILABLE.
	Secrets SecretResolver
	// Blobs holds images' bytes, and ImageForSite says which image a
	// node's workflow in flight writes: the site image endpoint serves
	// only those (without either it answers UNAVAILABLE).
	Blobs        blobs.Store
	ImageForSite ImageForSite
	// TunnelDialBack bounds the wait for an agent's tunnel dial-back
	// (DefaultTunnelDialBack); TunnelMaxLifetime a connected tunnel's life
	// (api/tunnels.DefaultMaxLifetime).
	TunnelDialBack    time.Duration
	TunnelMaxLifetime time.Duration
	// Metrics, when set, gets the gateway's series (bc_agent_sessions,
	// bc_agent_heartbeat_seconds).
	Metrics prometheus.Registerer
}

// Gateway is the agent protocol's server of one process.
type Gateway struct {
	deps      Deps
	types     domain.Types
	hub       hub
	beats     *heartbeatBatcher
	beatConn  *beatConn
	heartbeat prometheus.Histogram
	tunnels   tunnelWaiters
}

// heartbeatBuckets run from 0.5 ms to 2 s, each about 1.41× the last.
var heartbeatBuckets = prometheus.ExponentialBucketsRange(0.0005, 2, 25)

// New builds the gateway.
func New(d Deps) (*Gateway, error) {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.RootTenant == "" {
		d.RootTenant = iam.DefaultRootTenantID
	}
	if d.AgentLease <= 0 {
		d.AgentLease = DefaultAgentLease
	}
	if d.AgentHeartbeat <= 0 {
		d.AgentHeartbeat = DefaultAgentHeartbeat
	}
	if d.SiteLease <= 0 {
		d.SiteLease = DefaultSiteLease
	}
	if d.HeartbeatFlush <= 0 {
		d.HeartbeatFlush = DefaultHeartbeatFlush
	}
	if d.IdentityRecheck <= 0 {
		d.IdentityRecheck = DefaultIdentityRecheck
	}
	if d.TunnelDialBack <= 0 {
		d.TunnelDialBack = DefaultTunnelDialBack
	}
	if d.Catalog == nil {
		var err error
		if d.Catalog, err = core.DefaultCatalog(); err != nil {
			return nil, err
		}
	}
	g := &Gateway{deps: d, types: domain.TypesOf(d.Catalog),
		heartbeat: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "bc_agent_heartbeat_seconds", Help: "Handling time of recorded agent heartbeats, until their batch committed.",
			Buckets: heartbeatBuckets,
		})}
	if d.Store != nil {
		g.beatConn = newBeatConn(d.Store.Pool.Config().ConnConfig, d.AgentLease)
		g.beats = newHeartbeatBatcher(d.HeartbeatFlush, g.beatConn.write, d.Logger)
	}
	if d.Metrics != nil {
		sessions := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "bc_agent_sessions", Help: "Live agent sessions of this process.",
		}, func() float64 { return float64(g.hub.count()) })
		if err := d.Metrics.Register(g.heartbeat); err != nil {
			return nil, fmt.Errorf("agent gateway metrics: %w", err)
		}
		if err := d.Metrics.Register(sessions); err != nil {
			return nil, fmt.Errorf("agent gateway metrics: %w", err)
		}
	}
	return g, nil
}

// Mount puts the gateway's routes of the API listener on r: the node's
// join and join status, the site agent's register and renew, and the
// bare-metal site and ramdisk endpoints, the site image endpoint, and the
// callers' tunnel endpoint.
func (g *Gateway) Mount(r gin.IRoutes) {
	r.GET(tunnels.ConnectPath+":tunnelId", tunnels.Connect(tunnels.ConnectDeps{Store: g.deps.Store, Relay: g,
		Logger: g.deps.Logger, MaxLifetime: g.deps.TunnelMaxLifetime}))
	g.MountMetal(r)
	g.MountImages(r)
	r.POST(protocol.JoinPath, g.handleJoin)
	r.POST(protocol.JoinStatusPath, g.handleJoinStatus)
	r.POST(protocol.SiteRegisterPath, agentJSON(g.SiteRegister))
	r.POST(protocol.SiteRenewPath, agentJSON(g.SiteRenew))
}

// TLSConfig is the agent listener's TLS configuration: TLS 1.3, HTTP/2, a
// client certificate of the node CA required, and a server certificate the
// CA issues for hosts (names or IP addresses), valid for a year.
func TLSConfig(ca *nodeca.CA, hosts []string) (*tls.Config, error) {
	cert, err := ca.ServerCertificate(hosts, 365*24*time.Hour)
	if err != nil {
		return nil, fmt.Errorf("agent listener certificate: %w", err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool(),
		MinVersion:   tls.VersionTLS13,
		NextProtos:   []string{"h2"},
	}, nil
}

// HTTP2Config is the agent listener's HTTP/2 settings, sized for many
// long-lived connections that each carry one session stream of small
// frames: a few streams per connection (a reconnect may briefly overlap
// the old stream), 64 KiB flow-control windows (a larger inventory frame
// still passes, one window at a time, as the session reads it), the
// smallest read frame size and small header tables. Each idle connection
// then holds as little as HTTP/2 allows.
func HTTP2Config() *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxConcurrentStreams:          4,
		MaxReadFrameSize:              16 << 10,
		MaxReceiveBufferPerConnection: 64 << 10,
		MaxReceiveBufferPerStream:     64 << 10,
		MaxDecoderHeaderTableSize:     1 << 10,
		MaxEncoderHeaderTableSize:     1 << 10,
	}
}

// readJSON reads a bounded JSON body into v, refusing unknown fields.
func readJSON(c *gin.Context, v any) error {
	body, err := httpx.ReadBody(c)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return core.Errorf(core.CodeInvalidInput, "the body is not the endpoint's JSON object")
	}
	return nil
}

// agentJSON serves an agent endpoint: the bounded JSON body (unknown
// fields refused) into In, fn's answer as JSON, errors in the API's shape.
func agentJSON[In, Out any](fn func(context.Context, In) (Out, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		var in In
		if err := readJSON(c, &in); err != nil {
			httpx.WriteError(c, err)
			return
		}
		out, err := fn(c.Request.Context(), in)
		if err != nil {
			httpx.WriteError(c, err)
			return
		}
		c.JSON(http.StatusOK, out)
	}
}

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

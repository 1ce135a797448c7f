// Package api is the HTTP API: the gin router, the call envelope, one file
// per method group, and the typed Go client.
package api

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.temporal.io/sdk/client"
	"golang.org/x/sync/singleflight"

	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/api/images"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	"github.com/better-compute/better-compute/store/secrets"
)

// Deps are what the API needs from the rest of the process.
type Deps struct {
	Store    *store.Store
	Temporal client.Client
	// TaskQueue is where the control-plane worker listens (health checks).
	TaskQueue string
	// IAM decides every call; nil means no credential is valid, so every
	// authenticated method fails closed with UNAUTHENTICATED.
	IAM iam.Port
	// Catalog defaults to the core catalog.
	Catalog *core.Catalog
	// Domains are the method groups served (default Domains); every other
	// method of the method table answers UNSUPPORTED (planned).
	Domains []rpc.Domain
	// RootTenant is the platform's tenant (default "root").
	RootTenant string
	// Projection reports the authorization projection's health to
	// system.selfCheck; nil when there is none.
	Projection ProjectionStatus
	// IAMAdmin, when set, is mounted at /api/iam/ (the IAM admin surface).
	IAMAdmin http.Handler
	Logger   *slog.Logger
	// NodeCA signs the certificates of join requests joinRequests.approve
	// admits; without it that method answers UNAVAILABLE "no node CA
	// configured".
	NodeCA *nodeca.CA
	// Routes, when set, mounts more routes on the API listener (the agent
	// gateway's join and site endpoints), with the API's middleware.
	Routes RouteMounter
	// Metrics, when set, is the registry the API's series go to and
	// /metrics serves, so other parts of the process (the agent gateway)
	// can add theirs; by default the server has a registry of its own.
	Metrics *prometheus.Registry
	// Timeouts bound a client's request on Serve's listener (the httpx
	// defaults for zero fields).
	Timeouts httpx.Timeouts
	// ReservationMaxAhead bounds how far ahead a reservation may start (0:
	// one year).
	ReservationMaxAhead time.Duration
	// PublicURL is the API's base URL as nodes reach it (rpc.Deps).
	PublicURL string
	// ReservationStarts, when set, starts admitted reservations' workflows
	// off the request path (rpc.Deps).
	ReservationStarts rpc.WorkflowStarter
	// Secrets is the sealed secret store (rpc.Deps); Metal tunes the metal
	// domain (rpc.Deps).
	Secrets *secrets.Vault
	Metal   rpc.MetalConfig
	// CloudResources configures the cloud-resources module (rpc.Deps).
	CloudResources rpc.CloudResourcesConfig
	// Blobs holds images' bytes (rpc.Deps); the upload endpoint
	// (images.UploadPath) streams into it.
	Blobs blobs.Store
	// Providers opens capacity providers' APIs (rpc.Deps).
	Providers providers.Factory
	// WebhookLoopback lets webhooks reach loopback receivers (rpc.Deps).
	WebhookLoopback bool
	// Approvers answers approvers' registered keys (rpc.Deps).
	Approvers rpc.ApproverKeys
	// Console, when set, mounts the web console (api/console).
	Console RouteMounter
}

// RouteMounter puts routes on the API's router.
type RouteMounter interface {
	Mount(r gin.IRoutes)
}

// ProjectionStatus is what system.selfCheck reads of the projection.
type ProjectionStatus interface {
	Loaded() bool
	Lag() time.Duration
}

// Server is the API of one process. It is an http.Handler.
type Server struct {
	deps       Deps
	store      *store.Store
	iam        iam.Port
	catalog    *core.Catalog
	registry   *core.Registry
	rootTenant string
	handlers   map[string]*rpc.Handler
	engine     *gin.Engine
	metrics    *metrics
	admissions singleflight.Group     // admissions in flight, by caller session and key (admission.go)
	openapi    func() ([]byte, error) // the OpenAPI document, built once on first use
	temporalRT roundTrips             // /healthz's recent Temporal round trip (health.go)
}

// maxBody bounds a call's JSON input.
const maxBody = httpx.MaxBody

// New builds the API server. It fails with INVALID_CONFIG when the method
// registry disagrees with the catalog.
func New(deps Deps) (*Server, error) {
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	if deps.RootTenant == "" {
		deps.RootTenant = DefaultRootTenant
	}
	var err error
	if deps.Catalog == nil {
		if deps.Catalog, err = core.DefaultCatalog(); err != nil {
			return nil, err
		}
	}
	if deps.Domains == nil {
		deps.Domains = Domains
	}
	gin.SetMode(gin.ReleaseMode)
	s := &Server{
		deps: deps, store: deps.Store, iam: deps.IAM, catalog: deps.Catalog,
		rootTenant: deps.RootTenant, engine: gin.New(), metrics: newMetrics(deps.Metrics, deps.Store),
	}
	rdeps := rpc.Deps{Store: deps.Store, Temporal: deps.Temporal, TaskQueue: deps.TaskQueue, Catalog: deps.Catalog,
		RootTenant: deps.RootTenant, Logger: deps.Logger, NodeCA: deps.NodeCA, ReservationMaxAhead: deps.ReservationMaxAhead,
		PublicURL: deps.PublicURL, ReservationStarts: deps.ReservationStarts, Secrets: deps.Secrets,
		IAM: deps.IAM, Metal: deps.Metal, Blobs: deps.Blobs, Providers: deps.Providers, CloudResources: deps.CloudResources,
		WebhookLoopback: deps.WebhookLoopback, Approvers: deps.Approvers}
	descriptors := s.systemMethods()
	for _, domain := range deps.Domains {
		descriptors = append(descriptors, domain(rdeps)...)
	}
	if s.registry, s.handlers, err = Served(descriptors); err != nil {
		return nil, err
	}
	if _, err := core.CheckRegistry(deps.Catalog, s.registry); err != nil {
		return nil, err
	}
	s.openapi = sync.OnceValues(func() ([]byte, error) { return openAPIJSON(s.registry, descriptors) })
	e := s.engine
	e.ContextWithFallback = true
	e.HandleMethodNotAllowed = true
	e.Use(requestID(deps.Logger), accessLog(s.metrics), recovery())
	e.NoRoute(func(c *gin.Context) { writeError(c, core.Errorf(core.CodeNotFound, "no such route")) })
	e.NoMethod(func(c *gin.Context) {
		writeError(c, core.Errorf(core.CodeInvalidInput, "method %s not allowed here", c.Request.Method))
	})
	e.POST("/api/compute/:group/:method", s.handleCall)
	e.PUT(images.UploadPath, images.Upload(rdeps))
	e.GET("/healthz", s.handleHealth)
	e.GET(OpenAPIPath, s.handleOpenAPI)
	if deps.Routes != nil {
		deps.Routes.Mount(e)
	}
	if deps.Console != nil {
		deps.Console.Mount(e)
	}
	e.GET("/metrics", gin.WrapH(promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{})))
	if deps.IAMAdmin != nil {
		e.Any("/api/iam/*method", gin.WrapH(deps.IAMAdmin))
	}
	return s, nil
}

// DefaultRootTenant is the platform's tenant id unless configured otherwise.
const DefaultRootTenant = iam.DefaultRootTenantID

// Registry is the registry this server runs: the method table, with the
// input schemas of the methods it serves.
func (s *Server) Registry() *core.Registry { return s.registry }

// ServeHTTP makes the server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.engine.ServeHTTP(w, r) }

// handleCall is POST /api/compute/<group>/<method>: the HTTP face of Call.
func (s *Server) handleCall(c *gin.Context) {
	name := c.Param("group") + "." + c.Param("method")
	body, err := readBody(c)
	if err != nil {
		writeError(c, err)
		return
	}
	cred := iam.Credential{
		Authorization: c.GetHeader("Authorization"),
		SourceIP:      remoteIP(c.Request),
		RequestID:     requestIDOf(c),
		Origin:        c.GetHeader("Origin"),
		UserAgent:     c.GetHeader("User-Agent"),
	}
	if cred.Authorization == "" {
		if ck, err := c.Request.Cookie(iam.SessionCookie); err == nil {
			cred.Cookie = ck.Value
		}
	}
	if err := iam.CheckCSRF(cred, c.GetHeader(iam.CSRFHeader)); err != nil {
		writeError(c, err)
		return
	}
	out, err := s.Call(c.Request.Context(), cred, name, body)
	if err != nil {
		writeError(c, err)
		return
	}
	if st, ok := out.(rpc.Stream); ok {
		s.writeStream(c, name, st)
		return
	}
	c.JSON(http.StatusOK, out)
}

// streamChunk is how much of a streamed answer is buffered before it is
// flushed to the client; each flush extends the write deadline, so a long
// export is bounded by its progress, not by the listener's write timeout.
const streamChunk = 32 << 10

// writeStream answers a Stream: 200, its rows as they come, and the
// trailers saying how many and whether it ended in an error.
func (s *Server) writeStream(c *gin.Context, name string, st rpc.Stream) {
	w := c.Writer
	w.Header().Set("Content-Type", st.ContentType)
	w.Header().Set("Trailer", rpc.StreamErrorTrailer+", "+rpc.StreamRowsTrailer)
	w.WriteHeader(http.StatusOK)
	sw := &streamWriter{rc: http.NewResponseController(w), w: w}
	sw.buf = make([]byte, 0, streamChunk)
	err := st.Write(c.Request.Context(), sw)
	if err == nil {
		err = sw.flush()
	}
	w.Header().Set(rpc.StreamRowsTrailer, strconv.FormatInt(sw.rows, 10))
	if err != nil {
		ce := core.AsError(err)
		w.Header().Set(rpc.StreamErrorTrailer, string(ce.Code)+": "+ce.Message)
		if s.deps.Logger != nil {
			s.deps.Logger.Warn("stream ended in an error", "method", name, "rows", sw.rows, "error", err)
		}
	}
}

type streamWriter struct {
	rc   *http.ResponseController
	w    io.Writer
	buf  []byte
	rows int64
}

func (sw *streamWriter) Write(p []byte) (int, error) {
	sw.buf = append(sw.buf, p...)
	if len(sw.buf) >= streamChunk {
		return len(p), sw.flush()
	}
	return len(p), nil
}

func (sw *streamWriter) Row() { sw.rows++ }

func (sw *streamWriter) flush() error {
	if len(sw.buf) == 0 {
		return nil
	}
	_ = sw.rc.SetWriteDeadline(time.Now().Add(time.Minute)) // unsupported by a test recorder: then none
	if _, err := sw.w.Write(sw.buf); err != nil {
		return err
	}
	sw.buf = sw.buf[:0]
	return sw.rc.Flush()
}

func readBody(c *gin.Context) ([]byte, error) { return httpx.ReadBody(c) }

// remoteIP is the socket peer: never a client-sent forwarding header.
func remoteIP(r *http.Request) string {
	host := r.RemoteAddr
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		host = host[:i]
	}
	return strings.Trim(host, "[]")
}

// Serve runs the API on ln until ctx ends, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := httpx.NewServer(s, s.deps.Timeouts)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		return srv.Shutdown(shutdownCtx)
	}
}

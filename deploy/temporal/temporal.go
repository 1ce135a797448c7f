// Package temporal runs a Temporal server inside the current process: the
// frontend, history, matching and worker services on loopback ports, backed
// by PostgreSQL or SQLite, with the Temporal web UI optionally alongside.
// It is meant for the one-machine dev stack and for end-to-end tests.
package temporal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	uiserver "github.com/temporalio/ui-server/v2/server"
	uiconfig "github.com/temporalio/ui-server/v2/server/config"
	uioptions "github.com/temporalio/ui-server/v2/server/server_options"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/common/membership/static"
	"go.temporal.io/server/common/primitives"
	"go.temporal.io/server/temporal"

	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/internal/freeport"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Options configures Start. The zero value runs an in-memory SQLite server
// on a free loopback port with the "default" namespace and no UI.
type Options struct {
	// FrontendAddr is the gRPC address clients dial, an IP literal (or
	// "localhost", meaning 127.0.0.1) and a port, e.g. "127.0.0.1:7233".
	// Port 0 (or an empty string, meaning "127.0.0.1:0") picks a free port.
	// The internal services listen on free ports of the same IP.
	FrontendAddr string

	// UIAddr, when set, serves the web UI there, e.g. "127.0.0.1:8233"
	// (port 0 picks a free port).
	UIAddr string

	// Namespaces are registered when missing. Default: {"default"}.
	Namespaces []string
	// SearchAttributes are the custom Keyword search attributes registered
	// in every namespace (kept when they exist). Default: the control
	// plane's, activities/visibility.Keywords, without which its workflow
	// starts are refused.
	SearchAttributes []string
	// NamespaceRetention is the retention of newly registered namespaces.
	// Default: 7 days. Existing namespaces are left alone.
	NamespaceRetention time.Duration

	// Postgres selects PostgreSQL persistence. When nil, SQLite is used:
	// the file SQLiteFile (created with its schema when missing), or a
	// private in-memory database when SQLiteFile is empty.
	Postgres   *PostgresStore
	SQLiteFile string

	// HistoryShards is the number of history shards, default 4 (measured on
	// two cores with PostgreSQL: about 1.5x the workflow starts per second
	// of a single shard; SQLite gains little). It is written to the database on first start and cannot change
	// afterwards: the persisted value wins, with a logged warning.
	HistoryShards int32

	// DynamicConfig overrides server dynamic config keys, e.g.
	// {"frontend.rps": 5000}.
	DynamicConfig map[string]any

	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// LogLevel is the lowest level forwarded to Logger. Default: Warn (the
	// server is very chatty at Info).
	LogLevel slog.Leveler
}

// Server is a running embedded Temporal server.
type Server struct {
	frontendAddr string
	httpAddr     string
	uiURL        string
	logger       *slog.Logger
	stopping     *atomic.Bool // quiets the server's logs during Stop

	server temporal.Server
	ui     *uiserver.Server
	uiDone chan struct{}

	stopOnce sync.Once
}

const (
	loopback    = "127.0.0.1"
	clusterName = "active"
	// pollInterval paces the readiness checks in Start.
	pollInterval = 50 * time.Millisecond
)

// FrontendAddr is the host:port SDK clients dial.
func (s *Server) FrontendAddr() string { return s.frontendAddr }

// FrontendHTTPAddr is the host:port of the frontend's HTTP API (also used
// for Nexus), on the frontend's IP and a free port.
func (s *Server) FrontendHTTPAddr() string { return s.httpAddr }

// UIURL is the web UI's base URL, or "" without a UI.
func (s *Server) UIURL() string { return s.uiURL }

// Start prepares persistence (creating and migrating the PostgreSQL databases
// when needed), starts the four Temporal services and, if asked, the web UI.
// It returns once the frontend answers and every namespace in o.Namespaces
// accepts requests. ctx bounds the readiness waits; the server's own start
// has internal timeouts.
func Start(ctx context.Context, o Options) (*Server, error) {
	o = o.withDefaults()
	slogger := o.Logger
	if slogger == nil {
		slogger = slog.New(slog.DiscardHandler)
	}
	logger := serverLogger{out: slogger, minLevel: o.LogLevel, stopping: new(atomic.Bool)}

	host, frontendPort, err := splitHostPort(o.FrontendAddr)
	if err != nil {
		return nil, fmt.Errorf("frontend address: %w", err)
	}
	var uiHost string
	var uiPort int
	if o.UIAddr != "" {
		if uiHost, uiPort, err = splitHostPort(o.UIAddr); err != nil {
			return nil, fmt.Errorf("UI address: %w", err)
		}
	}

	// Persistence.
	var mainStore, visStore *config.SQL
	if o.Postgres != nil {
		pg := o.Postgres.withDefaults()
		if mainStore, visStore, err = pg.prepare(ctx, logger); err != nil {
			return nil, fmt.Errorf("prepare postgres persistence: %w", err)
		}
	} else {
		if mainStore, err = sqliteConfig(o.SQLiteFile); err != nil {
			return nil, fmt.Errorf("prepare sqlite persistence: %w", err)
		}
		visStore = mainStore
	}

	// Ports: the frontend's, its HTTP API's and one per internal service.
	// The server treats a port it cannot listen on as fatal, so ports are
	// checked first; a port chosen here can still be taken before the
	// server binds it, and then the start is tried again with fresh ones.
	if frontendPort != 0 { // a port asked for is not retried: it stays taken
		if _, err := probePort(host, frontendPort); err != nil {
			return nil, fmt.Errorf("frontend address: %w", err)
		}
	}
	var srv temporal.Server
	var frontendAddr, httpAddr string
	for attempt := 1; ; attempt++ {
		srv, frontendAddr, httpAddr, err = newServer(o, logger, host, frontendPort, mainStore, visStore)
		if err == nil || attempt == maxStartAttempts || !addressInUse(err) {
			break
		}
		slogger.Warn("temporal: a chosen port was taken before the server bound it; retrying with fresh ports", "attempt", attempt, "error", err)
	}
	if err != nil {
		return nil, err
	}

	s := &Server{
		frontendAddr: frontendAddr,
		httpAddr:     httpAddr,
		logger:       slogger,
		stopping:     logger.stopping,
		server:       srv,
	}
	if err := s.awaitReady(ctx, o); err != nil {
		s.Stop()
		return nil, err
	}
	if o.UIAddr != "" {
		if err := s.startUI(ctx, uiHost, uiPort, o.Namespaces[0]); err != nil {
			s.Stop()
			return nil, err
		}
	}
	return s, nil
}

// maxStartAttempts bounds the starts tried when chosen ports are taken.
const maxStartAttempts = 3

// newServer chooses the ports left to it, then creates and starts the
// server. It returns the frontend's gRPC and HTTP addresses.
func newServer(o Options, logger serverLogger, host string, frontendPort int, mainStore, visStore *config.SQL) (temporal.Server, string, string, error) {
	frontendPort, err := probePort(host, frontendPort)
	if err != nil {
		return nil, "", "", fmt.Errorf("frontend address: %w", err)
	}
	ports, err := freeport.PickN(host, 4)
	if err != nil {
		return nil, "", "", err
	}
	httpPort := ports[0]
	servicePorts := map[primitives.ServiceName]int{
		primitives.FrontendService: frontendPort,
		primitives.HistoryService:  ports[1],
		primitives.MatchingService: ports[2],
		primitives.WorkerService:   ports[3],
	}
	frontendAddr := net.JoinHostPort(host, strconv.Itoa(frontendPort))
	httpAddr := net.JoinHostPort(host, strconv.Itoa(httpPort))

	conf := serverConfig(o, host, frontendAddr, httpAddr, servicePorts, httpPort, mainStore, visStore)
	hosts := make(map[primitives.ServiceName]static.Hosts, len(servicePorts))
	for svc, port := range servicePorts {
		hosts[svc] = static.SingleLocalHost(net.JoinHostPort(host, strconv.Itoa(port)))
	}
	var srv temporal.Server
	err = catchFatal(func() (err error) {
		srv, err = temporal.NewServer(
			temporal.WithConfig(conf),
			temporal.ForServices(temporal.DefaultServices),
			temporal.WithStaticHosts(hosts),
			temporal.WithLogger(logger),
			temporal.WithDynamicConfigClient(dynamicConfig(o.DynamicConfig)),
		)
		return err
	})
	if err != nil {
		return nil, "", "", fmt.Errorf("create temporal server: %w", err)
	}
	if err := catchFatal(srv.Start); err != nil {
		_ = catchFatal(srv.Stop)
		return nil, "", "", fmt.Errorf("start temporal server: %w", err)
	}
	return srv, frontendAddr, httpAddr, nil
}

// addressInUse reports whether err says a port was already taken. The
// server's dependency injection flattens causes into text, so the text is
// checked as well as the chain.
func addressInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

// Stop stops the UI and the server and releases their ports. It is safe to
// call more than once.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		s.stopping.Store(true)
		if s.ui != nil {
			s.ui.Stop()
			<-s.uiDone
		}
		if err := s.server.Stop(); err != nil {
			s.logger.Warn("stopping temporal server", "error", err)
		}
	})
}

func (o Options) withDefaults() Options {
	if o.FrontendAddr == "" {
		o.FrontendAddr = net.JoinHostPort(loopback, "0")
	}
	if len(o.Namespaces) == 0 {
		o.Namespaces = []string{"default"}
	}
	if o.SearchAttributes == nil {
		o.SearchAttributes = visibility.Keywords()
	}
	if o.NamespaceRetention == 0 {
		o.NamespaceRetention = 7 * 24 * time.Hour
	}
	if o.HistoryShards == 0 {
		o.HistoryShards = 4
	}
	if o.LogLevel == nil {
		o.LogLevel = slog.LevelWarn
	}
	return o
}

func serverConfig(
	o Options,
	host, frontendAddr, httpAddr string,
	ports map[primitives.ServiceName]int, httpPort int,
	mainStore, visStore *config.SQL,
) *config.Config {
	const mainName, visName = "main", "visibility"
	stores := map[string]config.DataStore{mainName: {SQL: mainStore}}
	visibility := mainName
	if visStore != mainStore {
		stores[visName] = config.DataStore{SQL: visStore}
		visibility = visName
	}

	services := make(map[string]config.Service, len(ports))
	for svc, port := range ports {
		services[string(svc)] = config.Service{RPC: config.RPC{GRPCPort: port, BindOnIP: host}}
	}
	frontend := services[string(primitives.FrontendService)]
	frontend.RPC.HTTPPort = httpPort
	services[string(primitives.FrontendService)] = frontend

	c := &config.Config{
		Persistence: config.Persistence{
			DefaultStore:     mainName,
			VisibilityStore:  visibility,
			NumHistoryShards: o.HistoryShards,
			DataStores:       stores,
		},
		ClusterMetadata: &cluster.Config{
			FailoverVersionIncrement: 10,
			MasterClusterName:        clusterName,
			CurrentClusterName:       clusterName,
			ClusterInformation: map[string]cluster.ClusterInformation{
				clusterName: {
					Enabled:                true,
					InitialFailoverVersion: 1,
					RPCAddress:             frontendAddr,
					HTTPAddress:            httpAddr,
				},
			},
		},
		DCRedirectionPolicy: config.DCRedirectionPolicy{Policy: "noop"},
		Services:            services,
		PublicClient:        config.PublicClient{HostPort: frontendAddr, HTTPHostPort: httpAddr},
	}
	c.Global.Membership.MaxJoinDuration = 30 * time.Second
	c.Global.Membership.BroadcastAddress = host
	c.Archival.History.State = "disabled"
	c.Archival.Visibility.State = "disabled"
	c.NamespaceDefaults.Archival.History.State = "disabled"
	c.NamespaceDefaults.Archival.Visibility.State = "disabled"
	return c
}

func dynamicConfig(overrides map[string]any) dynamicconfig.StaticClient {
	dc := dynamicconfig.StaticClient{
		// The default (10) makes the UI's list pages and tests that poll
		// visibility run into rate limits.
		dynamicconfig.FrontendMaxNamespaceVisibilityRPSPerInstance.Key(): 100,

		// The worker service starts SDK workers for these system
		// workflows and never stops them (server v1.32.1): after Stop they
		// would keep polling, and after a restart on the same port they
		// would poll the new server. They do maintenance that a dev
		// database does not need; with the parent-close-policy worker off,
		// history applies parent close policies itself.
		dynamicconfig.TaskQueueScannerEnabled.Key():       false,
		dynamicconfig.HistoryScannerEnabled.Key():         false,
		dynamicconfig.EnableParentClosePolicyWorker.Key(): false,
	}
	for k, v := range overrides {
		dc[dynamicconfig.MakeKey(k)] = v
	}
	return dc
}

// awaitReady waits for the frontend, registers the namespaces and waits until
// each is usable through frontend and history.
func (s *Server) awaitReady(ctx context.Context, o Options) error {
	c, err := dialWhenUp(ctx, s.frontendAddr)
	if err != nil {
		return err
	}
	defer c.Close()

	if err := poll(ctx, func(ctx context.Context) error {
		resp, err := c.CheckHealth(ctx, &client.CheckHealthRequest{})
		if err == nil && resp == nil {
			err = errors.New("empty health response")
		}
		return err
	}); err != nil {
		return fmt.Errorf("wait for frontend health at %s: %w", s.frontendAddr, err)
	}

	svc := c.WorkflowService()
	for _, ns := range o.Namespaces {
		_, err := svc.RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
			Namespace:                        ns,
			WorkflowExecutionRetentionPeriod: durationpb.New(o.NamespaceRetention),
		})
		var exists *serviceerror.NamespaceAlreadyExists
		if err != nil && !errors.As(err, &exists) {
			return fmt.Errorf("register namespace %q: %w", ns, err)
		}
	}

	// A namespace that was looked up before it existed stays "not found" in
	// the services' namespace caches for a moment. Wait until a workflow
	// lookup gets past the namespace check in frontend and history: a
	// missing workflow then answers NotFound rather than NamespaceNotFound.
	probe := &commonpb.WorkflowExecution{WorkflowId: "readiness-probe-" + uuid.NewString()}
	for _, ns := range o.Namespaces {
		err := poll(ctx, func(ctx context.Context) error {
			_, err := svc.DescribeWorkflowExecution(ctx, &workflowservice.DescribeWorkflowExecutionRequest{
				Namespace: ns,
				Execution: probe,
			})
			var notFound *serviceerror.NotFound
			if err == nil || errors.As(err, &notFound) {
				return nil
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("wait for namespace %q: %w", ns, err)
		}
		if err := addSearchAttributes(ctx, c, ns, o.SearchAttributes); err != nil {
			return err
		}
	}
	return nil
}

// addSearchAttributes registers the Keyword search attributes in the
// namespace and waits until the frontend's namespace cache knows them: a
// visibility query naming each is accepted.
func addSearchAttributes(ctx context.Context, c client.Client, ns string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	attrs := make(map[string]enumspb.IndexedValueType, len(names))
	clauses := make([]string, len(names))
	for i, name := range names {
		attrs[name] = enumspb.INDEXED_VALUE_TYPE_KEYWORD
		clauses[i] = name + " = ''"
	}
	if _, err := c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace: ns, SearchAttributes: attrs,
	}); err != nil {
		return fmt.Errorf("add search attributes to namespace %q: %w", ns, err)
	}
	query := strings.Join(clauses, " AND ")
	if err := poll(ctx, func(ctx context.Context) error {
		_, err := c.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{Namespace: ns, Query: query})
		return err
	}); err != nil {
		return fmt.Errorf("wait for the search attributes of namespace %q: %w", ns, err)
	}
	return nil
}

func dialWhenUp(ctx context.Context, addr string) (client.Client, error) {
	var c client.Client
	err := poll(ctx, func(ctx context.Context) error {
		var err error
		c, err = client.DialContext(ctx, client.Options{
			HostPort: addr,
			Logger:   sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial temporal frontend at %s: %w", addr, err)
	}
	return c, nil
}

// poll calls try until it succeeds or ctx ends, giving each attempt at most
// a few seconds. It returns the last attempt's error along with ctx's.
func poll(ctx context.Context, try func(context.Context) error) error {
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := try(attemptCtx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(pollInterval):
		}
	}
}

func (s *Server) startUI(ctx context.Context, host string, port int, defaultNamespace string) error {
	// The UI server exits the process (echo's Logger.Fatal) when it cannot
	// listen, so make sure the port is usable first.
	port, err := probePort(host, port)
	if err != nil {
		return fmt.Errorf("UI address: %w", err)
	}

	s.ui = uiserver.NewServer(uioptions.WithConfigProvider(&uiconfig.Config{
		Host:                host,
		Port:                port,
		TemporalGRPCAddress: s.frontendAddr,
		EnableUI:            true,
		DefaultNamespace:    defaultNamespace,
		CORS:                uiconfig.CORS{CookieInsecure: true},
		HideLogs:            true,
		DisableNewsFetch:    true,
	}))
	s.uiDone = make(chan struct{})
	go func() {
		defer close(s.uiDone)
		_ = s.ui.Start() // blocks until Stop; returns nil then
	}()
	s.uiURL = "http://" + net.JoinHostPort(host, strconv.Itoa(port))

	hc := &http.Client{}
	err = poll(ctx, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.uiURL+"/healthz", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("UI health check: %s", resp.Status)
		}
		return nil
	})
	hc.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("wait for UI at %s: %w", s.uiURL, err)
	}
	return nil
}

func splitHostPort(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	if h == "" || h == "localhost" {
		h = loopback
	}
	if net.ParseIP(h) == nil {
		return "", 0, fmt.Errorf("host %q is not an IP address", h)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return h, port, nil
}

// probePort checks that host:port can be listened on right now; port 0
// picks a free port, which is returned.
func probePort(host string, port int) (int, error) {
	if port == 0 {
		return freeport.Pick(host)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return 0, err
	}
	ln.Close()
	return port, nil
}

// Package devstack is `better-compute dev`: the whole system on one machine
// for a newcomer. A PostgreSQL cluster under <dir>/postgres, an embedded
// Temporal server (with its Web UI) persisting to that cluster, the
// migrations, the API and the control-plane worker, all in one process.
package devstack

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/drivers/providers/dofake"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core/cloudresources"
	"github.com/better-compute/better-compute/deploy/postgres"
	"github.com/better-compute/better-compute/deploy/temporal"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/controlplane"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	"github.com/better-compute/better-compute/store/secrets"
	"github.com/better-compute/better-compute/workers"
)

// Options place the stack. The zero value of each field takes the default
// in Defaults, which the README documents.
type Options struct {
	Dir          string // default ".dev"
	Reset        bool   // wipe Dir (and the cluster's data, wherever it is) first
	APIAddr      string // the API, its /healthz and /metrics
	PostgresPort int
	TemporalAddr string // the Temporal frontend (gRPC)
	UIAddr       string // the Temporal Web UI; "-" for none
	// AgentAddr is the agent listener (mutual TLS).
	AgentAddr string
	// AgentHosts are further names or addresses the agent listener's
	// certificate is valid for: how machines behind a NAT reach it (a QEMU
	// guest reaches the host's loopback at 10.0.2.2).
	AgentHosts []string
	// Agents simulated `bcd node` processes join the demo pool (default 2;
	// -1 for none); BCD is the bcd binary (default: bcd next to this
	// executable, and no agents without one).
	Agents int
	BCD    string
	// AgentLease, AgentHeartbeat and LivenessSweep override the node
	// sessions' liveness settings (40 s, 10 s, 5 s); tests shrink them.
	AgentLease, AgentHeartbeat, LivenessSweep time.Duration
	// NoWorker runs no control-plane worker in this process: workflows
	// wait for a `better-compute worker` started elsewhere (tests that kill
	// the worker run it as a separate process).
	NoWorker bool
	Logger   *slog.Logger
	// ProviderAddr is the fake DigitalOcean API's address ("-" for none),
	// backing the provider pool (vps.go).
	ProviderAddr string
	// CloudResources tunes the cloud-resource reconciler (tests shorten
	// its waits).
	CloudResources workers.CloudResourcesTuning
	// WebhookIdlePoll is how often an idle webhook looks for new events
	// (0: the default).
	WebhookIdlePoll time.Duration
	// CloudResourceQuotas are the module's per-tenant caps of each kind
	// (default: 20 of every kind).
	CloudResourceQuotas cloudresources.Quotas
	// DemoImage is the instance image the stack registers for the demo
	// (default bin/testimage/image.squashfs, which `make testimage` makes).
	DemoImage string
	// CLIConfig is the CLI's configuration file, into which the stack
	// writes the contexts dev (the demo user) and dev-admin; "" for none.
	CLIConfig string

	// fallbackRoot is where the cluster's data goes when the postgres OS
	// user cannot reach Dir (default /var/lib/better-compute); tests move it.
	fallbackRoot string
}

// Defaults are the stack's default directory and addresses: the one place
// they are written. Every port lies below 20000, so neither in the kernel's
// ephemeral range (32768–60999 on Linux), from which outgoing connections
// take their source ports and could hold one when the stack starts, nor in
// the range internal/freeport hands out to the servers tests start.
func Defaults() Options {
	return Options{
		Dir:          ".dev",
		APIAddr:      "127.0.0.1:8080",
		AgentAddr:    "127.0.0.1:8443",
		PostgresPort: 15432,
		TemporalAddr: "127.0.0.1:7233",
		UIAddr:       "127.0.0.1:8233",
		ProviderAddr: "127.0.0.1:8091",
		DemoImage:    "bin/testimage/image.squashfs",
		Agents:       2,
		fallbackRoot: "/var/lib/better-compute",
	}
}

const (
	// Database is the control plane's database in the dev cluster.
	Database = "bettercompute"
	// Namespace is the control plane's Temporal namespace.
	Namespace = "better-compute"
)

func (o Options) withDefaults() Options {
	d := Defaults()
	if o.Dir == "" {
		o.Dir = d.Dir
	}
	if o.APIAddr == "" {
		o.APIAddr = d.APIAddr
	}
	if o.AgentAddr == "" {
		o.AgentAddr = d.AgentAddr
	}
	if o.ProviderAddr == "" {
		o.ProviderAddr = d.ProviderAddr
	}
	if o.DemoImage == "" {
		o.DemoImage = d.DemoImage
	}
	if o.Agents == 0 {
		o.Agents = d.Agents
	}
	if o.PostgresPort == 0 {
		o.PostgresPort = d.PostgresPort
	}
	if o.TemporalAddr == "" {
		o.TemporalAddr = d.TemporalAddr
	}
	if o.UIAddr == "" {
		o.UIAddr = d.UIAddr
	}
	if o.UIAddr == "-" {
		o.UIAddr = ""
	}
	if o.fallbackRoot == "" {
		o.fallbackRoot = d.fallbackRoot
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Stack is a running dev stack.
type Stack struct {
	opts     Options
	postgres *postgres.Cluster
	temporal *temporal.Server
	store    *store.Store
	client   client.Client
	worker   worker.Worker
	cp       *controlplane.ControlPlane
	tokens   iam.BootstrapResult
	demo     DemoFleet
	apiURL   string
	agentURL string
	agents   []*agentProcess
	// stopAgentListener ends ServeAgents; agentListenerStopped closes when
	// it has.
	stopAgentListener    context.CancelFunc
	agentListenerStopped chan struct{}
	stopAPI              context.CancelFunc
	apiStopped           chan error
	databaseURL          string
	// postgresDir is the cluster's data directory: under Dir, or where
	// clusterDir put it.
	postgresDir string
	// provider is the fake DigitalOcean API; vps what seedVPS made.
	provider *dofake.Server
	vps      VPSFleet
}

// SecretsKEKFile is the dev stack's key-encryption key, under Dir.
const SecretsKEKFile = "secrets-kek"

// BlobDir is the dev stack's blob store (images' bytes), under Dir.
const BlobDir = "blobs"

// Start brings the stack up, in dependency order. On any failure it stops
// what it had started and returns the error.
func Start(ctx context.Context, o Options) (s *Stack, err error) {
	o = o.withDefaults()
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return nil, err
	}
	if o.Reset {
		for _, dir := range []string{o.Dir, fallbackDir(o.Dir, o.fallbackRoot)} {
			if err := os.RemoveAll(dir); err != nil {
				return nil, fmt.Errorf("reset: %w", err)
			}
		}
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	s = &Stack{opts: o}
	defer func() {
		if err != nil {
			s.Stop(context.WithoutCancel(ctx))
			s = nil
		}
	}()
	log := o.Logger

	if err = s.startPostgres(ctx); err != nil {
		return s, err
	}
	if err = store.MigrateUp(ctx, s.databaseURL); err != nil {
		return s, err
	}
	if s.store, err = store.Open(ctx, s.databaseURL); err != nil {
		return s, err
	}

	log.Info("starting Temporal", "frontend", o.TemporalAddr, "ui", o.UIAddr)
	s.temporal, err = temporal.Start(ctx, temporal.Options{
		FrontendAddr: o.TemporalAddr,
		UIAddr:       o.UIAddr,
		Namespaces:   []string{"default", Namespace},
		Postgres: &temporal.PostgresStore{Host: s.postgres.Host(), Port: s.postgres.Port(),
			User: s.postgres.User(), Password: s.postgres.Password(), SSLMode: "disable"},
		Logger: log.With("component", "temporal"),
	})
	if err != nil {
		return s, err
	}
	if s.client, err = workers.Dial(ctx, workers.TemporalConfig{Address: s.temporal.FrontendAddr(), Namespace: Namespace}, log.With("component", "temporal-client")); err != nil {
		return s, err
	}
	// The secret store's key-encryption key: made once (0600), kept with
	// the checkout's other dev keys, so secrets survive restarts.
	kekFile := filepath.Join(o.Dir, SecretsKEKFile)
	if err = secrets.EnsureKEKFile(kekFile); err != nil {
		return s, err
	}
	keys, err := secrets.LoadKeyring(kekFile, func(string) string { return "" })
	if err != nil {
		return s, err
	}
	// Images' and sandbox snapshots' bytes, kept with the checkout's other dev state.
	blobStore, err := blobs.NewDir(filepath.Join(o.Dir, BlobDir))
	if err != nil {
		return s, err
	}
	// One registry for the API and the worker: /metrics shows both.
	metrics := prometheus.NewRegistry()
	if !o.NoWorker {
		wm, err := workers.NewMetrics(metrics)
		if err != nil {
			return s, err
		}
		providerFactory, err := controlplane.ProviderFactory(s.store, log.With("component", "providers"))
		if err != nil {
			return s, err
		}
		s.worker = workers.NewControlPlane(s.client, workers.Deps{Store: s.store, Metrics: wm,
			Providers: providerFactory, Secrets: secrets.NewVault(keys, api.DefaultRootTenant), Blobs: blobStore,
			CloudResources: o.CloudResources, Webhooks: workers.WebhooksTuning{AllowLoopback: true, IdlePoll: o.WebhookIdlePoll}})
		if err = s.worker.Start(); err != nil {
			return s, fmt.Errorf("worker: %w", err)
		}
	}
	if err = workers.EnsureSchedules(ctx, s.client); err != nil {
		return s, err
	}

	ca, err := nodeca.LoadOrGenerate(filepath.Join(o.Dir, "node-ca"))
	if err != nil {
		return s, err
	}
	agentLn, err := net.Listen("tcp", o.AgentAddr)
	if err != nil {
		return s, fmt.Errorf("agent listener: %w", err)
	}
	s.agentURL = "https://" + agentLn.Addr().String()
	if s.cp, err = controlplane.New(ctx, controlplane.Config{
		Store: s.store, Temporal: s.client, TaskQueue: workers.ControlPlaneQueue, Logger: log,
		NodeCA: ca, AgentEndpoint: s.agentURL,
		AgentLease: o.AgentLease, AgentHeartbeat: o.AgentHeartbeat, LivenessSweep: o.LivenessSweep,
		TemporalAddress: s.temporal.FrontendAddr(), TemporalNamespace: Namespace, Metrics: metrics,
		SecretsKeys: keys, Blobs: blobStore, WebhookLoopback: true,
		// Plain HTTP on loopback: the console's cookie cannot be Secure.
		Console: controlplane.ConsoleConfig{InsecureCookies: true, TemporalUI: s.temporal.UIURL()},
		CloudResources: rpc.CloudResourcesConfig{Quotas: o.CloudResourceQuotas,
			ConvergingEvery: o.CloudResources.ConvergingEvery, SettledEvery: o.CloudResources.SettledEvery},
	}); err != nil {
		agentLn.Close()
		return s, err
	}
	agentHost, _, _ := net.SplitHostPort(agentLn.Addr().String())
	agentCtx, stopAgentListener := context.WithCancel(context.WithoutCancel(ctx))
	s.stopAgentListener, s.agentListenerStopped = stopAgentListener, make(chan struct{})
	go func() {
		defer close(s.agentListenerStopped)
		if err := s.cp.ServeAgents(agentCtx, agentLn, append([]string{agentHost}, o.AgentHosts...)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("agent listener", "error", err)
		}
	}()
	if err = s.bootstrapIAM(ctx); err != nil {
		return s, err
	}
	ln, err := net.Listen("tcp", o.APIAddr)
	if err != nil {
		return s, fmt.Errorf("api: %w", err)
	}
	s.apiURL = "http://" + ln.Addr().String()
	apiCtx, stopAPI := context.WithCancel(context.WithoutCancel(ctx))
	s.stopAPI, s.apiStopped = stopAPI, make(chan error, 1)
	go func() { s.apiStopped <- s.cp.API.Serve(apiCtx, ln) }()
	if err = s.seedDemoFleet(ctx); err != nil {
		return s, err
	}
	if err = s.startProvider(); err != nil {
		return s, err
	}
	if err = s.seedVPS(ctx); err != nil {
		return s, err
	}
	if err = s.startAgents(ctx); err != nil {
		return s, err
	}
	if err = s.awaitAgents(ctx); err != nil {
		return s, err
	}

	if err = s.writeCLIContexts(); err != nil {
		return s, err
	}
	if err = s.writeEnv(); err != nil {
		return s, err
	}
	return s, nil
}

// startPostgres starts the dev cluster, with the password kept in
// <Dir>/postgres-password, and makes the control plane's database.
func (s *Stack) startPostgres(ctx context.Context) error {
	o, log := s.opts, s.opts.Logger
	reachable, err := postgres.ServerUserCanReach(ctx, o.Dir)
	if err != nil {
		return err
	}
	s.postgresDir = clusterDir(o.Dir, o.fallbackRoot, func(string) bool { return reachable })
	if !reachable {
		log.Info("the postgres OS user cannot reach the checkout; the cluster's data lives outside it",
			"checkout", o.Dir, "data", s.postgresDir)
		if err := recordCheckout(s.postgresDir, o.Dir); err != nil {
			return err
		}
	}
	password, err := loadOrCreatePassword(filepath.Join(o.Dir, postgresPasswordFile))
	if err != nil {
		return err
	}
	log.Info("starting PostgreSQL", "dir", s.postgresDir, "port", o.PostgresPort)
	if s.postgres, err = postgres.Start(ctx, postgres.Options{
		DataDir:  s.postgresDir,
		Port:     o.PostgresPort,
		Password: password,
		LogFile:  filepath.Join(o.Dir, "postgres.log"),
	}); err != nil {
		return err
	}
	if _, err = s.postgres.EnsureDatabase(ctx, Database, ""); err != nil {
		return err
	}
	s.databaseURL = s.postgres.URL(Database)
	return nil
}

// postgresPasswordFile holds the dev cluster's superuser password, readable
// by the owner only; .dev/env (as private) carries it in BC_DATABASE_URL.
const postgresPasswordFile = "postgres-password"

// clusterDir says where the dev cluster keeps its data: <devDir>/postgres
// when the server's OS user can enter devDir (canReach), else
// fallbackDir's postgres. As root the server runs as the postgres OS user,
// which a checkout under a private folder (/root/src) shuts out.
func clusterDir(devDir, fallbackRoot string, canReach func(dir string) bool) string {
	if canReach(devDir) {
		return filepath.Join(devDir, "postgres")
	}
	return filepath.Join(fallbackDir(devDir, fallbackRoot), "postgres")
}

// fallbackDir is the checkout's own directory under fallbackRoot, named by a
// hash of devDir (absolute): stable across runs, distinct per checkout.
func fallbackDir(devDir, fallbackRoot string) string {
	sum := sha256.Sum256([]byte(devDir))
	return filepath.Join(fallbackRoot, "dev-"+hex.EncodeToString(sum[:6]))
}

// recordCheckout writes, next to a cluster kept outside its checkout, which
// checkout it belongs to, for whoever finds it there.
func recordCheckout(dataDir, devDir string) error {
	dir := filepath.Dir(dataDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "CHECKOUT"), devDir+"\n", 0o644)
}

// loadOrCreatePassword reads the password in path, or generates one and
// writes it there, private to the owner.
func loadOrCreatePassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if pw := strings.TrimSpace(string(b)); pw != "" {
		return pw, nil
	}
	pw, err := postgres.GeneratePassword()
	if err != nil {
		return "", err
	}
	return pw, writeFileAtomic(path, pw+"\n", 0o600)
}

// Stop stops everything Start started, in reverse order; it is safe on a
// partly started stack and idempotent.
func (s *Stack) Stop(ctx context.Context) {
	s.stopAgents()
	if s.provider != nil {
		_ = s.provider.Close(ctx)
		s.provider = nil
	}
	if s.stopAgentListener != nil {
		s.stopAgentListener()
		<-s.agentListenerStopped
		s.stopAgentListener = nil
	}
	if s.stopAPI != nil {
		s.stopAPI()
		<-s.apiStopped
		s.stopAPI = nil
	}
	if s.cp != nil {
		s.cp.Close()
		s.cp = nil
	}
	if s.worker != nil {
		s.worker.Stop()
		s.worker = nil
	}
	if s.client != nil {
		s.client.Close()
		s.client = nil
	}
	if s.temporal != nil {
		s.temporal.Stop()
		s.temporal = nil
	}
	if s.store != nil {
		s.store.Close()
		s.store = nil
	}
	if s.postgres != nil {
		if err := s.postgres.Stop(ctx); err != nil {
			s.opts.Logger.Error("stopping PostgreSQL", "error", err)
		}
		s.postgres = nil
	}
}

// URLs of the running stack.
func (s *Stack) APIURL() string        { return s.apiURL }
func (s *Stack) AgentURL() string      { return s.agentURL }
func (s *Stack) DatabaseURL() string   { return s.databaseURL }
func (s *Stack) TemporalAddr() string  { return s.temporal.FrontendAddr() }
func (s *Stack) TemporalUI() string    { return s.temporal.UIURL() }
func (s *Stack) Client() client.Client { return s.client }

// Secrets is the API's secret store, sealed with the stack's KEK.
func (s *Stack) Secrets() *secrets.Vault { return s.cp.Secrets }

// SecretsKEKPath is the file of the stack's key-encryption key, for a
// worker process of its own to open what the stack sealed.
func (s *Stack) SecretsKEKPath() string { return filepath.Join(s.opts.Dir, SecretsKEKFile) }

// env is what .dev/env exports, in order.
func (s *Stack) env() [][2]string {
	return [][2]string{
		{"BC_API_URL", s.apiURL},
		{"BC_AGENT_ENDPOINT", s.agentURL},
		{"BC_NODE_CA_CERT", filepath.Join(s.opts.Dir, "node-ca", nodeca.CertFile)},
		{"BC_DATABASE_URL", s.databaseURL},
		{"BC_TEMPORAL_ADDRESS", s.temporal.FrontendAddr()},
		{"BC_TEMPORAL_NAMESPACE", Namespace},
		{"BC_TEMPORAL_UI", s.temporal.UIURL()},
		{"BC_POSTGRES_SOCKET_DIR", s.postgres.SocketDir()},
		{"BC_ROOT_TENANT", s.tokens.RootTenantID},
		{"BC_ADMIN_TOKEN_FILE", filepath.Join(s.opts.Dir, adminTokenFile)},
		{"BC_DEMO_TENANT", s.tokens.TenantID},
		{"BC_DEMO_TOKEN_FILE", filepath.Join(s.opts.Dir, demoTokenFile)},
		{"BC_DEMO_POOL", s.demo.PoolID},
		{"BC_VPS_POOL", s.vps.HostPoolID},
		{"BC_PROVIDER_POOL", s.vps.ProviderPoolID},
		{"BC_DEMO_IMAGE", s.vps.ImageID},
		{"BC_SANDBOX_TEMPLATE", s.vps.SandboxTemplateID},
		{"BC_PROVIDER_URL", s.vps.ProviderURL},
		// A worker started from this file delivers webhooks to loopback
		// receivers, as the stack's own does.
		{"BC_WEBHOOKS_ALLOW_LOOPBACK", "true"},
	}
}

// described is id and what follows it, or "" (no row) without an id.
func described(id, what string) string {
	if id == "" {
		return ""
	}
	return id + what
}

// writeEnv writes <dir>/env atomically (a temporary file renamed into
// place), so a reader never sees half of it. It holds the database's
// password, so it is private to the owner, like the token files.
func (s *Stack) writeEnv() error {
	var b strings.Builder
	b.WriteString("# Written by `better-compute dev`; source it: . .dev/env\n")
	for _, kv := range s.env() {
		fmt.Fprintf(&b, "export %s=%q\n", kv[0], kv[1])
	}
	return writeFileAtomic(filepath.Join(s.opts.Dir, "env"), b.String(), 0o600)
}

// Token files: plaintext bearer tokens of the dev stack's bootstrap
// identities, readable by the owner only. IAM itself keeps only hashes.
const (
	adminTokenFile = "admin-token"
	demoTokenFile  = "acme-token"
)

// bootstrapIAM makes the root tenant with an admin, and the demo tenant with
// a user, reusing the tokens an earlier run left in the token files.
func (s *Stack) bootstrapIAM(ctx context.Context) error {
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(s.opts.Dir, name))
		return strings.TrimSpace(string(b))
	}
	res, err := iam.Bootstrap(ctx, s.cp.Admin, iam.BootstrapOptions{
		AdminToken: read(adminTokenFile), UserToken: read(demoTokenFile),
	})
	if err != nil {
		return fmt.Errorf("iam bootstrap: %w", err)
	}
	for name, token := range map[string]string{adminTokenFile: res.AdminToken, demoTokenFile: res.UserToken} {
		if token == "" {
			continue // the earlier token still works
		}
		if err := writeFileAtomic(filepath.Join(s.opts.Dir, name), token+"\n", 0o600); err != nil {
			return err
		}
	}
	s.tokens = res
	return nil
}

// AdminToken and DemoToken read the bootstrap tokens back from their files.
func (s *Stack) AdminToken() (string, error) { return s.readToken(adminTokenFile) }
func (s *Stack) DemoToken() (string, error)  { return s.readToken(demoTokenFile) }

func (s *Stack) readToken(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(s.opts.Dir, name))
	return strings.TrimSpace(string(b)), err
}

// writeFileAtomic writes a temporary file and renames it into place, so a
// reader (or a crash) never sees half of it.
func writeFileAtomic(path, content string, perm os.FileMode) error {
	tmp := path + ".tmp"
	// A temporary file a crash left keeps its mode through WriteFile.
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.WriteFile(tmp, []byte(content), perm); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// postgresRows are the banner's rows about the cluster: its URL without the
// password, and where its data is (and why, when not in the checkout).
func (s *Stack) postgresRows() [][2]string {
	data := s.postgresDir
	if filepath.Dir(s.postgresDir) != s.opts.Dir {
		data += " (outside the checkout: the postgres OS user cannot reach " + s.opts.Dir + ")"
	}
	return [][2]string{
		{"PostgreSQL", postgres.RedactURL(s.databaseURL) + " (password in " +
			filepath.Join(s.opts.Dir, postgresPasswordFile) + "; the whole URL in " + filepath.Join(s.opts.Dir, "env") + ")"},
		{"PG socket", s.postgres.SocketDir()},
		{"PG data", data},
	}
}

// Banner is the text `better-compute dev` prints once the stack is ready.
func (s *Stack) Banner() string {
	var b strings.Builder
	b.WriteString("\nBetter Compute dev stack is ready\n\n")
	rows := [][2]string{
		{"API", s.apiURL + "/api/compute/<group>/<method>"},
		{"Console", s.apiURL + "/console/ (sign in with a token below)"},
		{"Health", s.apiURL + "/healthz"},
		{"Metrics", s.apiURL + "/metrics"},
		{"Agents", s.agentURL + " (mutual TLS; " + s.agentSummary() + ", logs in " + filepath.Join(s.opts.Dir, "agents") + ")"},
		{"Temporal UI", s.temporal.UIURL()},
		{"Temporal gRPC", s.temporal.FrontendAddr() + " (namespace " + Namespace + ")"},
	}
	rows = append(rows, s.postgresRows()...)
	rows = append(rows, [][2]string{
		{"Environment", filepath.Join(s.opts.Dir, "env")},
		{"Admin token", filepath.Join(s.opts.Dir, adminTokenFile) + " (tenant " + s.tokens.RootTenantID + ", root authority)"},
		{"Demo token", filepath.Join(s.opts.Dir, demoTokenFile) + " (tenant " + s.tokens.TenantID + ")"},
		{"CLI contexts", s.cliContextsRow()},
		{"Demo pool", s.demo.PoolID + " (H100, root's, offered to " + s.tokens.TenantID + " with " + fmt.Sprint(demoGPUQuota) + " GPUs)"},
		{"VPS pool", described(s.vps.HostPoolID, " (vps-host: instances in runc and QEMU on "+hostAgent+"; flavors c1-m1, c2-m2, vm-c1-m512)")},
		{"Provider pool", described(s.vps.ProviderPoolID, " (droplets at the fake DigitalOcean "+s.vps.ProviderURL+"; flavor s-1vcpu-1gb)")},
		{"Demo image", described(s.vps.ImageID, " ("+demoImageName+"@"+demoImageVersion+", public: busybox httpd on port 8080)")},
		{"Sandboxes", described(s.vps.SandboxTemplateID, " ("+s.tokens.TenantID+"'s template "+sandboxTemplate+": better-compute sandbox exec)")},
	}...)
	for _, r := range rows {
		if r[1] == "" {
			continue
		}
		fmt.Fprintf(&b, "  %-14s %s\n", r[0], r[1])
	}
	kept := s.opts.Dir
	if filepath.Dir(s.postgresDir) != s.opts.Dir {
		kept += " and " + filepath.Dir(s.postgresDir)
	}
	b.WriteString("\nCtrl-C stops everything; the data stays in " + kept + " (--reset wipes it).\n")
	return b.String()
}

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/deploy/postgres"
	"github.com/better-compute/better-compute/deploy/temporal"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/store"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
)

// temporalNamespace is serve's default --temporal-namespace.
const temporalNamespace = "better-compute"

// stack is what the run starts: everything but the sessions.
type stack struct {
	dir      string
	pg       *postgres.Cluster
	dbURL    string
	st       *store.Store
	temporal *temporal.Server
	ca       *nodeca.CA
	poolID   string
	nodes    []join.Identity // AgentEndpoint filled once the API runs
	api      *exec.Cmd
	apiURL   string
	agentURL string
	apiExit  chan error
}

func (s *stack) pgPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "postgres", "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

func (s *stack) stop(keep bool) {
	if s.api != nil && s.api.Process != nil {
		_ = s.api.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.apiExit:
		case <-time.After(20 * time.Second):
			_ = s.api.Process.Kill()
			<-s.apiExit
		}
	}
	if s.st != nil {
		s.st.Close()
	}
	if s.temporal != nil {
		s.temporal.Stop()
	}
	if s.pg != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = s.pg.Stop(ctx)
		cancel()
	}
	if keep {
		progress("kept %s", s.dir)
	} else if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// startStack starts PostgreSQL and Temporal and writes the fleet.
func startStack(ctx context.Context, cfg config, logger *slog.Logger) (*stack, error) {
	s := &stack{}
	var err error
	if s.dir, err = os.MkdirTemp("", "bc-agentload-"); err != nil {
		return s, err
	}
	// The PostgreSQL server may run as the postgres OS user, which must reach in.
	if err := os.Chmod(s.dir, 0o755); err != nil {
		return s, err
	}
	port, err := freeport.Pick("127.0.0.1")
	if err != nil {
		return s, err
	}
	progress("starting PostgreSQL in %s on port %d", s.dir, port)
	s.pg, err = postgres.Start(ctx, postgres.Options{DataDir: filepath.Join(s.dir, "postgres"), Port: port,
		LogFile: filepath.Join(s.dir, "postgres.log")})
	if err != nil {
		return s, err
	}
	if _, err := s.pg.EnsureDatabase(ctx, "bc", ""); err != nil {
		return s, err
	}
	s.dbURL = s.pg.URL("bc")
	if err := store.MigrateUp(ctx, s.dbURL); err != nil {
		return s, fmt.Errorf("migrate: %w", err)
	}
	if s.st, err = store.Open(ctx, s.dbURL); err != nil {
		return s, err
	}
	progress("starting Temporal (embedded, in-memory SQLite)")
	s.temporal, err = temporal.Start(ctx, temporal.Options{Namespaces: []string{"default", temporalNamespace},
		Logger: logger.With("component", "temporal")})
	if err != nil {
		return s, fmt.Errorf("temporal: %w", err)
	}
	if s.ca, err = nodeca.LoadOrGenerate(filepath.Join(s.dir, "node-ca")); err != nil {
		return s, err
	}
	t0 := time.Now()
	if err := s.writeFleet(ctx, cfg.agents, logger); err != nil {
		return s, fmt.Errorf("fleet: %w", err)
	}
	progress("%d nodes with identities written in %s", cfg.agents, time.Since(t0).Round(time.Millisecond))
	return s, nil
}

// writeFleet writes a site, a pool and n deployed nodes, each with an
// identity the node CA signed (its own ECDSA key), 100 nodes a transaction.
func (s *stack) writeFleet(ctx context.Context, n int, logger *slog.Logger) error {
	const tenant, by = "root", "agentload"
	siteID, poolID := core.NewID("site"), core.NewID("pool")
	if _, err := s.st.Pool.Exec(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, $2, 'agentload', 'local', 'dev-local-1', 'shared', $3)`, siteID, tenant, by); err != nil {
		return err
	}
	if _, err := s.st.Pool.Exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, created_by)
		VALUES ($1, $2, $3, 'agentload', 'metal-host', 'H100', 80, 'bcd', $4)`, poolID, tenant, siteID, by); err != nil {
		return err
	}
	s.poolID = poolID
	catalog, err := core.DefaultCatalog()
	if err != nil {
		return err
	}
	types := nodesdomain.TypesOf(catalog)
	const batch = 100
	for first := 0; first < n; first += batch {
		err := s.st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			for i := first; i < min(first+batch, n); i++ {
				node, err := nodesdomain.Create(ctx, tx, types, nodesdomain.NewNode{PoolID: poolID, Name: fmt.Sprintf("load-%05d", i),
					ProvisionState: nodes.Deployed, Role: nodes.RoleHost, Trust: nodes.TrustPlatform, Power: nodes.PowerOn})
				if err != nil {
					return err
				}
				id, rec, err := s.identity(node.ID)
				if err != nil {
					return err
				}
				if _, err := nodesdomain.RecordNodeIdentity(ctx, tx, rec); err != nil {
					return err
				}
				s.nodes = append(s.nodes, id)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// identity makes a key and has the CA sign a certificate for the node, as
// a join does.
func (s *stack) identity(nodeID string) (join.Identity, nodesdomain.NodeIdentity, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return join.Identity{}, nodesdomain.NodeIdentity{}, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: nodeID}}, key)
	if err != nil {
		return join.Identity{}, nodesdomain.NodeIdentity{}, err
	}
	const ttl = 30 * 24 * time.Hour
	certPEM, serial, err := s.ca.SignNode(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr}), nodeID, ttl)
	if err != nil {
		return join.Identity{}, nodesdomain.NodeIdentity{}, err
	}
	b, _ := pem.Decode(certPEM)
	id := join.Identity{NodeID: nodeID, CAPool: s.ca.Pool(),
		Certificate: tls.Certificate{Certificate: [][]byte{b.Bytes}, PrivateKey: key}}
	rec := nodesdomain.NodeIdentity{NodeID: nodeID, Serial: serial, Certificate: string(certPEM), ExpiresAt: time.Now().Add(ttl)}
	return id, rec, nil
}

// startAPI builds better-compute (unless bin names one) and runs `serve`
// with an agent listener: the API process.
func (s *stack) startAPI(ctx context.Context, cfg config) error {
	bin := cfg.bin
	if bin == "" {
		bin = filepath.Join(s.dir, "better-compute")
		progress("go build -o %s ./cmd/better-compute", bin)
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/better-compute")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("go build: %w", err)
		}
	}
	ports, err := freeport.PickN("127.0.0.1", 2)
	if err != nil {
		return err
	}
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	agentListen := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	s.apiURL, s.agentURL = "http://"+listen, "https://"+agentListen
	dbURL := s.dbURL
	if cfg.pool > 0 {
		sep := "?"
		if strings.Contains(dbURL, "?") {
			sep = "&"
		}
		dbURL += sep + "pool_max_conns=" + strconv.Itoa(cfg.pool)
	}
	logFile, err := os.Create(filepath.Join(s.dir, "api.log"))
	if err != nil {
		return err
	}
	s.api = exec.Command(bin, "serve", "--database-url", dbURL, "--listen", listen,
		"--temporal-address", s.temporal.FrontendAddr(),
		"--node-ca-cert", filepath.Join(s.dir, "node-ca", nodeca.CertFile),
		"--node-ca-key", filepath.Join(s.dir, "node-ca", nodeca.KeyFile),
		"--agent-listen", agentListen, "--agent-endpoint", s.agentURL, "--log-level", cfg.logLevel)
	s.api.Stdout, s.api.Stderr = logFile, logFile
	if cfg.memLimit != "" {
		s.api.Env = append(os.Environ(), "GOMEMLIMIT="+cfg.memLimit)
	}
	if err := s.api.Start(); err != nil {
		logFile.Close()
		return err
	}
	s.apiExit = make(chan error, 1)
	go func() { err := s.api.Wait(); logFile.Close(); s.apiExit <- err; close(s.apiExit) }()
	progress("API process %d: api %s, agents %s (log %s)", s.api.Process.Pid, s.apiURL, s.agentURL, logFile.Name())
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-s.apiExit:
			return fmt.Errorf("the API process exited: %v (see %s)", err, logFile.Name())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		resp, err := http.Get(s.apiURL + "/metrics")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if c, err := net.DialTimeout("tcp", agentListen, time.Second); err == nil && resp.StatusCode == http.StatusOK {
				c.Close()
				break
			}
		}
		if time.Now().After(deadline) {
			return errors.New("the API process did not come up within 60s")
		}
	}
	for i := range s.nodes {
		s.nodes[i].AgentEndpoint = s.agentURL
	}
	return nil
}

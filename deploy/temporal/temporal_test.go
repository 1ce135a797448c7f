package temporal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/better-compute/better-compute/deploy/postgres"
	"github.com/better-compute/better-compute/internal/freeport"
)

// testTimeout bounds each test's interactions with the server. It is a
// safety net against hangs, not a performance assertion.
const testTimeout = 3 * time.Minute

func TestPostgresRestartKeepsWorkflows(t *testing.T) {
	pg := startTestPostgres(t)
	ctx := testContext(t)
	opts := Options{
		FrontendAddr: "127.0.0.1:0",
		Namespaces:   []string{"default", "better-compute"},
		Postgres:     &pg,
		Logger:       testLogger(),
	}

	first := startServer(ctx, t, opts)
	const workflowID = "greet-before-restart"
	runID, result := runGreeting(ctx, t, first.FrontendAddr(), "better-compute", workflowID, "postgres")
	if result != "hello, postgres" {
		t.Fatalf("workflow result = %q, want %q", result, "hello, postgres")
	}
	stopServer(t, first)
	first.Stop() // idempotent
	migrations := schemaUpdates(ctx, t, pg)

	// Same databases, same frontend port: the port must have been released
	// and the data must still be there, without a new schema setup.
	opts.FrontendAddr = first.FrontendAddr()
	second := startServer(ctx, t, opts)
	if again := schemaUpdates(ctx, t, pg); again != migrations {
		t.Fatalf("schema updates after restart = %v, want %v (no schema work on a current database)", again, migrations)
	}
	c := dial(ctx, t, second.FrontendAddr(), "better-compute")

	desc, err := c.DescribeWorkflowExecution(ctx, workflowID, runID)
	if err != nil {
		t.Fatalf("describe workflow after restart: %v", err)
	}
	if got := desc.GetWorkflowExecutionInfo().GetStatus(); got != enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED {
		t.Fatalf("status after restart = %v, want COMPLETED", got)
	}
	var again string
	if err := c.GetWorkflow(ctx, workflowID, runID).Get(ctx, &again); err != nil {
		t.Fatalf("get workflow result after restart: %v", err)
	}
	if again != result {
		t.Fatalf("result after restart = %q, want %q", again, result)
	}

	// The restarted server still runs new work.
	if _, got := runGreeting(ctx, t, second.FrontendAddr(), "better-compute", "greet-after-restart", "again"); got != "hello, again" {
		t.Fatalf("workflow result after restart = %q", got)
	}
}

func TestUI(t *testing.T) {
	ctx := testContext(t)
	uiPort := freeTestPort(t)
	s := startServer(ctx, t, Options{
		UIAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(uiPort)),
		Logger: testLogger(),
	})
	if want := fmt.Sprintf("http://127.0.0.1:%d", uiPort); s.UIURL() != want {
		t.Fatalf("UIURL() = %q, want %q", s.UIURL(), want)
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.UIURL()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET /: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	hc.CloseIdleConnections()
	if err != nil {
		t.Fatalf("read UI response: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET / = %s", resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Fatalf("GET / content type = %q, want text/html", ct)
	}
	if !strings.Contains(strings.ToLower(string(body)), "<html") {
		t.Fatalf("GET / body is not HTML: %.200q", body)
	}

	frontend, httpAddr := s.FrontendAddr(), s.FrontendHTTPAddr()
	stopServer(t, s)
	for _, addr := range []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(uiPort)), frontend, httpAddr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s still in use after Stop: %v", addr, err)
		}
		_ = ln.Close()
	}
}

func TestSQLiteInMemory(t *testing.T) {
	ctx := testContext(t)
	s := startServer(ctx, t, Options{Namespaces: []string{"better-compute"}, Logger: testLogger()})
	if s.UIURL() != "" {
		t.Fatalf("UIURL() = %q without a UI", s.UIURL())
	}
	if _, got := runGreeting(ctx, t, s.FrontendAddr(), "better-compute", "greet-sqlite", "sqlite"); got != "hello, sqlite" {
		t.Fatalf("workflow result = %q", got)
	}
}

func TestBusyFrontendPortIsAnError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s, err := Start(testContext(t), Options{FrontendAddr: ln.Addr().String(), Logger: testLogger()})
	if err == nil {
		s.Stop()
		t.Fatal("Start succeeded on a port in use")
	}
}

// --- workflow under test ---

func greetWorkflow(ctx workflow.Context, name string) (string, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	var greeting string
	err := workflow.ExecuteActivity(ctx, greetActivity, name).Get(ctx, &greeting)
	return greeting, err
}

func greetActivity(_ context.Context, name string) (string, error) {
	return "hello, " + name, nil
}

// runGreeting runs greetWorkflow to completion with a worker of its own and
// returns the run ID and the result.
func runGreeting(ctx context.Context, t *testing.T, addr, namespace, workflowID, name string) (string, string) {
	t.Helper()
	c := dial(ctx, t, addr, namespace)
	const taskQueue = "greetings"
	w := worker.New(c, taskQueue, worker.Options{})
	w.RegisterWorkflow(greetWorkflow)
	w.RegisterActivity(greetActivity)
	if err := w.Start(); err != nil {
		t.Fatalf("start worker: %v", err)
	}
	defer w.Stop()

	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: workflowID, TaskQueue: taskQueue}, greetWorkflow, name)
	if err != nil {
		t.Fatalf("start workflow: %v", err)
	}
	var result string
	if err := run.Get(ctx, &result); err != nil {
		t.Fatalf("workflow %s: %v", workflowID, err)
	}
	return run.GetRunID(), result
}

// --- helpers ---

// schemaUpdates counts the schema steps recorded in both Temporal databases.
func schemaUpdates(ctx context.Context, t testing.TB, pg PostgresStore) [2]int {
	t.Helper()
	var n [2]int
	for i, db := range []string{"temporal", "temporal_visibility"} {
		u := url.URL{Scheme: "postgres", User: url.UserPassword(pg.User, pg.Password), Host: net.JoinHostPort(pg.Host, strconv.Itoa(pg.Port)), Path: "/" + db, RawQuery: "sslmode=disable"}
		conn, err := pgx.Connect(ctx, u.String())
		if err != nil {
			t.Fatalf("connect to %s: %v", db, err)
		}
		err = conn.QueryRow(ctx, `SELECT count(*) FROM schema_update_history`).Scan(&n[i])
		_ = conn.Close(ctx)
		if err != nil {
			t.Fatalf("count schema updates in %s: %v", db, err)
		}
		if n[i] == 0 {
			t.Fatalf("no schema updates recorded in %s", db)
		}
	}
	return n
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// testLogger sends the server's warnings to stderr (not t.Log: server
// goroutines may still log while a test is being torn down).
func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}

func startServer(ctx context.Context, t testing.TB, o Options) *Server {
	t.Helper()
	begin := time.Now()
	s, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	t.Logf("Start took %v (frontend %s)", time.Since(begin).Round(time.Millisecond), s.FrontendAddr())
	return s
}

func stopServer(t testing.TB, s *Server) {
	begin := time.Now()
	s.Stop()
	t.Logf("Stop took %v", time.Since(begin).Round(time.Millisecond))
}

func dial(ctx context.Context, t testing.TB, addr, namespace string) client.Client {
	t.Helper()
	c, err := client.DialContext(ctx, client.Options{
		HostPort:  addr,
		Namespace: namespace,
		Logger:    sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
	})
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

func freeTestPort(t testing.TB) int {
	t.Helper()
	port, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// startTestPostgres runs a throwaway PostgreSQL server (the project's own
// deploy/postgres) for one test; extra settings are "name=value".
func startTestPostgres(t testing.TB, settings ...string) PostgresStore {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	dir, err := os.MkdirTemp("", "temporal-test-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// The server may run as the postgres OS user, which must reach in.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	set := map[string]string{"fsync": "off"}
	for _, kv := range settings {
		k, v, _ := strings.Cut(kv, "=")
		set[k] = v
	}
	c, err := postgres.Start(context.Background(), postgres.Options{DataDir: filepath.Join(dir, "data"), Settings: set})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return PostgresStore{Host: c.Host(), Port: c.Port(), User: c.User(), Password: c.Password(), SSLMode: "disable"}
}

func TestAddressInUseRecognisesFlattenedCauses(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("listen: %w", syscall.EADDRINUSE), true},
		{errors.New("failed listening for HTTP API on 127.0.0.1:34053: listen tcp 127.0.0.1:34053: bind: address already in use"), true},
		{errors.New("connection refused"), false},
	} {
		if got := addressInUse(tc.err); got != tc.want {
			t.Errorf("addressInUse(%q) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

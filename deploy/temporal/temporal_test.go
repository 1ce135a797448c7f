package temporal

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
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

	// Same databases, same frontend port: the port must have been released
	// and the data must still be there, without a new schema setup.
	opts.FrontendAddr = first.FrontendAddr()
	second := startServer(ctx, t, opts)
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

const pgBin = "/usr/lib/postgresql/15/bin"

// startTestPostgres runs a throwaway PostgreSQL 15 server as the "postgres"
// OS user on a free loopback port with trust authentication, and returns
// where to find it. The server and its files go away when the test ends.
// Extra settings are passed as postgres -c options.
func startTestPostgres(t testing.TB, settings ...string) PostgresStore {
	t.Helper()
	if _, err := os.Stat(filepath.Join(pgBin, "postgres")); err != nil {
		t.Skipf("PostgreSQL binaries not available: %v", err)
	}
	pgUser, err := user.Lookup("postgres")
	if err != nil {
		t.Skipf("no postgres OS user: %v", err)
	}
	uid, _ := strconv.ParseUint(pgUser.Uid, 10, 32)
	gid, _ := strconv.ParseUint(pgUser.Gid, 10, 32)
	asPostgres := func(cmd *exec.Cmd) *exec.Cmd {
		if os.Geteuid() == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		}
		return cmd
	}

	// t.TempDir is private to root; PostgreSQL needs a directory it owns.
	dir, err := os.MkdirTemp("", "temporal-test-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, int(uid), int(gid)); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")

	initdb := asPostgres(exec.Command(filepath.Join(pgBin, "initdb"),
		"-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"))
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}

	port := freeTestPort(t)
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	logFile, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	srv := asPostgres(exec.Command(filepath.Join(pgBin, "postgres"), args...))
	srv.Stdout, srv.Stderr = logFile, logFile
	if err := srv.Start(); err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = srv.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = srv.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = srv.Process.Kill()
			<-exited
		}
	})

	store := PostgresStore{Host: "127.0.0.1", Port: port, User: "postgres", SSLMode: "disable"}
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			_ = conn.Close(ctx)
			cancel()
			return store
		}
		cancel()
		select {
		case <-exited:
			pgLog, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			t.Fatalf("postgres exited during startup:\n%s", pgLog)
		default:
		}
		if time.Now().After(deadline) {
			pgLog, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			t.Fatalf("postgres not accepting connections: %v\n%s", err, pgLog)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Package testenv is the test harness: one throwaway PostgreSQL cluster per
// test binary, a migrated template database, and a fresh database cloned from
// it for every test that asks.
//
// A test package that uses it runs its tests through Main:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
package testenv

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/deploy/postgres"
	"github.com/better-compute/better-compute/store"
)

const (
	templateDB = "bc_template"
	dirPrefix  = "bc-testpg-"
)

// harness is the one cluster of this test binary. It is package state by
// necessity: Go gives tests no other place to share a server, and TestMain
// (Main) owns its lifetime.
var harness struct {
	mu      sync.Mutex
	cluster *postgres.Cluster
	dir     string
	err     error
	next    int
	// replica streams from cluster; started by the first Replica.
	replica    *postgres.Cluster
	replicaErr error
}

// Main runs the tests and then stops the cluster and removes its files, also
// when tests fail. Should the binary die (a panic, a kill), the server dies
// with it, and the next run removes what it left.
func Main(m *testing.M) {
	code := m.Run()
	stop()
	os.Exit(code)
}

func stop() {
	harness.mu.Lock()
	defer harness.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if harness.replica != nil {
		_ = harness.replica.Stop(ctx)
		harness.replica = nil
	}
	if harness.cluster != nil {
		_ = harness.cluster.Stop(ctx)
		harness.cluster = nil
	}
	if harness.dir != "" {
		_ = os.RemoveAll(harness.dir)
		harness.dir = ""
	}
}

// Cluster returns the binary's PostgreSQL cluster, starting it and migrating
// the template database on first use.
func Cluster(t testing.TB) *postgres.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped in -short mode")
	}
	harness.mu.Lock()
	defer harness.mu.Unlock()
	if harness.cluster == nil && harness.err == nil {
		harness.cluster, harness.dir, harness.err = start()
	}
	if harness.err != nil {
		t.Fatalf("testenv: %v", harness.err)
	}
	return harness.cluster
}

func start() (*postgres.Cluster, string, error) {
	removeStale()
	dir, err := os.MkdirTemp("", dirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return nil, "", err
	}
	// The server may run as the postgres OS user, which must reach in.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, dir, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := postgres.Start(ctx, postgres.Options{
		DataDir: filepath.Join(dir, "data"),
		// A throwaway cluster needs no durability; this makes tests faster.
		Settings: map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", err
	}
	if _, err := c.EnsureDatabase(ctx, templateDB, ""); err != nil {
		c.Stop(ctx)
		os.RemoveAll(dir)
		return nil, "", err
	}
	if err := store.MigrateUp(ctx, c.URL(templateDB)); err != nil {
		c.Stop(ctx)
		os.RemoveAll(dir)
		return nil, "", fmt.Errorf("migrating the template: %w", err)
	}
	return c, dir, nil
}

// Replica returns a streaming replica (a read-only hot standby) of the
// binary's cluster, starting it on first use; Main stops it. Every database
// of the cluster, the per-test ones included, arrives on it through the WAL,
// a moment after the primary commits: see ReplicaURL.
//
// The replica is shared by the binary's tests. A test that pauses its replay
// (PauseReplay) holds up every test reading from it, so it must not run in
// parallel with them and must resume replay, also when it fails:
//
//	r := testenv.Replica(t)
//	t.Cleanup(func() { _ = r.ResumeReplay(context.Background()) })
func Replica(t testing.TB) *postgres.Cluster {
	t.Helper()
	primary := Cluster(t)
	harness.mu.Lock()
	defer harness.mu.Unlock()
	if harness.replica == nil && harness.replicaErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		harness.replica, harness.replicaErr = primary.StartReplica(ctx, postgres.ReplicaOptions{
			DataDir: filepath.Join(harness.dir, "replica"),
		})
	}
	if harness.replicaErr != nil {
		t.Fatalf("testenv: starting the replica: %v", harness.replicaErr)
	}
	return harness.replica
}

// ReplicaURL returns the URL of primaryURL's database (one DatabaseURL gave)
// on the replica, once the replica has replayed its creation; it waits up to
// a minute. Rows committed on the primary reach the replica asynchronously,
// so a test polls for them (or compares Cluster(t).CurrentLSN with
// Replica(t).ReplayLSN).
func ReplicaURL(t testing.TB, primaryURL string) string {
	t.Helper()
	primary, replica := Cluster(t), Replica(t)
	u, err := url.Parse(primaryURL)
	if err != nil {
		t.Fatalf("testenv: ReplicaURL: %v", err)
	}
	want := net.JoinHostPort(primary.Host(), strconv.Itoa(primary.Port()))
	db := strings.TrimPrefix(u.Path, "/")
	if u.Host != want || db == "" {
		t.Fatalf("testenv: ReplicaURL: %s is not a database of the test cluster (%s)", postgres.RedactURL(primaryURL), want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, replica.URL("postgres"))
	if err != nil {
		t.Fatalf("testenv: ReplicaURL: %v", err)
	}
	defer conn.Close(context.Background())
	for {
		var exists bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, db).Scan(&exists)
		if err == nil && exists {
			return replica.URL(db)
		}
		if err == nil {
			select {
			case <-ctx.Done():
				err = ctx.Err()
			case <-time.After(10 * time.Millisecond):
				continue
			}
		}
		var state string
		_ = conn.QueryRow(context.Background(), `SELECT pg_get_wal_replay_pause_state()`).Scan(&state)
		t.Fatalf("testenv: database %s did not reach the replica (replay: %s): %v", db, state, err)
	}
}

// removeStale deletes the clusters of earlier test binaries that died
// without cleaning up (their servers died with them).
func removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), dirPrefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(d)
		}
	}
}

// DatabaseURL gives the test a database of its own, cloned from the migrated
// template and dropped when the test ends.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	c := Cluster(t)
	harness.mu.Lock()
	harness.next++
	name := fmt.Sprintf("t%d_%d", os.Getpid(), harness.next)
	harness.mu.Unlock()
	ctx := context.Background()
	if _, err := c.EnsureDatabase(ctx, name, templateDB); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			t.Errorf("testenv: drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("testenv: drop %s: %v", name, err)
		}
	})
	return c.URL(name)
}

// Store opens a pool on a fresh database of the test's own.
func Store(t testing.TB) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), DatabaseURL(t))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// DumpTables is every row of every table of the database's own schemas as
// JSON, one table after another (bytea as hex): what pg_dump would write,
// for tests that prove a value (a secret) is stored nowhere in clear.
func DumpTables(t testing.TB, s *store.Store) string {
	t.Helper()
	ctx := context.Background()
	rows, err := s.Pool.Query(ctx, `SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) FROM information_schema.tables
		WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 20 {
		t.Fatalf("only %d tables to dump", len(names))
	}
	var dump strings.Builder
	for _, name := range names {
		var text string
		if err := s.Pool.QueryRow(ctx, `SELECT coalesce(string_agg(row_to_json(t)::text, E'\n'), '') FROM `+name+` t`).Scan(&text); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		fmt.Fprintf(&dump, "%s\n%s\n", name, text)
	}
	return dump.String()
}

package postgres

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/internal/testutil"
)

func TestReplicaStreamsPausesResumesAndRefusesWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two PostgreSQL clusters")
	}
	ctx := context.Background()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// As the test harness runs it: asynchronous commits, no fsync.
	primary, err := Start(ctx, Options{
		DataDir:  filepath.Join(dir, "primary"),
		Settings: map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Stop(context.Background()) })
	if _, err := primary.EnsureDatabase(ctx, "app", ""); err != nil {
		t.Fatal(err)
	}
	execSQL(t, primary.URL("app"), `CREATE TABLE items (v int)`)

	began := time.Now()
	replica, err := primary.StartReplica(ctx, ReplicaOptions{DataDir: filepath.Join(dir, "replica")})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("StartReplica took %v", time.Since(began))
	t.Cleanup(func() { _ = replica.Stop(context.Background()) })

	if is, err := replica.IsReplica(ctx); err != nil || !is {
		t.Fatalf("replica IsReplica = %v, %v", is, err)
	}
	if is, err := primary.IsReplica(ctx); err != nil || is {
		t.Fatalf("primary IsReplica = %v, %v", is, err)
	}
	if _, err := primary.ReplayLSN(ctx); err == nil {
		t.Fatal("ReplayLSN on a primary: no error")
	}

	rconn, err := pgx.Connect(ctx, replica.URL("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer rconn.Close(ctx)

	// A commit on the primary reaches the replica.
	execSQL(t, primary.URL("app"), `INSERT INTO items VALUES (1)`)
	waitForRow(t, rconn, 1)

	// With replay paused the replica receives a new commit but does not show it.
	if err := replica.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	paused, err := replica.ReplayLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// synchronous_commit=on: the commit is in the primary's WAL write position on return.
	execSQL(t, primary.URL("app"), `SET synchronous_commit = on; INSERT INTO items VALUES (2)`)
	current, err := primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "the replica to receive the commit", func() bool {
		got, err := replica.ReceiveLSN(ctx)
		return err == nil && got >= current
	})
	if n := countRows(t, rconn, 2); n != 0 {
		t.Fatalf("a commit made while replay was paused is visible on the replica")
	}
	if replay, err := replica.ReplayLSN(ctx); err != nil || replay != paused || replay >= current {
		t.Fatalf("paused replay LSN = %v (%v), at pause %v, primary at %v", replay, err, paused, current)
	}

	// Resumed, it shows it.
	if err := replica.ResumeReplay(ctx); err != nil {
		t.Fatal(err)
	}
	waitForRow(t, rconn, 2)
	if replay, err := replica.ReplayLSN(ctx); err != nil || replay < current {
		t.Fatalf("resumed replay LSN = %v (%v), want at least %v", replay, err, current)
	}

	// The replica refuses writes.
	_, err = rconn.Exec(ctx, `INSERT INTO items VALUES (3)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("a write on the replica: %v, want read_only_sql_transaction (25006)", err)
	}

	// Stop leaves nothing behind: no server on the data directory, the port
	// free, and the primary no longer streaming to it.
	rconn.Close(ctx)
	if pids := serversOn(t, replica.opts.DataDir); len(pids) == 0 {
		t.Fatal("found no server process on the running replica's data directory")
	}
	if err := replica.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if pids := serversOn(t, replica.opts.DataDir); len(pids) > 0 {
		t.Fatalf("processes still running on the replica's data directory: %v", pids)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(replica.Host(), strconv.Itoa(replica.Port())))
	if err != nil {
		t.Fatalf("the replica's port is still taken: %v", err)
	}
	l.Close()
	testutil.Eventually(t, time.Minute, "the primary to drop the replica's walsender", func() bool {
		var n int
		return primary.queryRow(ctx, `SELECT count(*) FROM pg_stat_replication`, &n) == nil && n == 0
	})
}

func TestReplicaRestartsOnItsDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two PostgreSQL clusters")
	}
	ctx := context.Background()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	primary, err := Start(ctx, Options{DataDir: filepath.Join(dir, "primary")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Stop(context.Background()) })
	ro := ReplicaOptions{DataDir: filepath.Join(dir, "replica")}
	replica, err := primary.StartReplica(ctx, ro)
	if err != nil {
		t.Fatal(err)
	}
	if err := replica.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// What was committed while it was down arrives once it is back.
	if _, err := primary.EnsureDatabase(ctx, "app", ""); err != nil {
		t.Fatal(err)
	}
	execSQL(t, primary.URL("app"), `CREATE TABLE items (v int); INSERT INTO items VALUES (7)`)
	replica, err = primary.StartReplica(ctx, ro)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Stop(context.Background()) })
	testutil.Eventually(t, time.Minute, "the database to reach the restarted replica", func() bool {
		conn, err := pgx.Connect(ctx, replica.URL("app"))
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		var v int
		return conn.QueryRow(ctx, `SELECT v FROM items`).Scan(&v) == nil && v == 7
	})

	// A data directory holding a primary is not taken for a replica.
	if _, err := primary.StartReplica(ctx, ReplicaOptions{DataDir: primary.opts.DataDir}); err == nil ||
		!strings.Contains(err.Error(), "not a replica") {
		t.Fatalf("StartReplica on a primary's data directory: %v", err)
	}
}

func countRows(t *testing.T, conn *pgx.Conn, v int) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM items WHERE v = $1`, v).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitForRow(t *testing.T, conn *pgx.Conn, v int) {
	t.Helper()
	testutil.Eventually(t, time.Minute, "the row to reach the replica", func() bool { return countRows(t, conn, v) == 1 })
}

// serversOn lists the processes whose command line names dir.
func serversOn(t *testing.T, dir string) []string {
	t.Helper()
	cmdlines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the process has gone
		}
		for _, arg := range strings.Split(string(b), "\x00") {
			if arg == dir {
				pids = append(pids, filepath.Base(filepath.Dir(f)))
				break
			}
		}
	}
	return pids
}

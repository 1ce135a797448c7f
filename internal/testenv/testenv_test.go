package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
)

func TestMain(m *testing.M) { Main(m) }

func TestEachTestGetsItsOwnMigratedDatabase(t *testing.T) {
	ctx := context.Background()
	a, b := Store(t), Store(t)
	if _, err := a.Pool.Exec(ctx, `CREATE TABLE only_in_a (v int)`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a table made in one test database is visible in another: %d, %v", n, err)
	}
	var ext string
	if err := b.Pool.QueryRow(ctx, `SELECT extname FROM pg_extension WHERE extname = 'btree_gist'`).Scan(&ext); err != nil {
		t.Fatalf("the template was not migrated: %v", err)
	}
}

func TestReplicaURLServesTheTestDatabaseFromTheReplica(t *testing.T) {
	ctx := context.Background()
	primaryURL := DatabaseURL(t)
	s, err := store.Open(ctx, primaryURL)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Pool.Exec(ctx, `CREATE TABLE seen (v int); INSERT INTO seen VALUES (1)`); err != nil {
		t.Fatal(err)
	}

	replicaURL := ReplicaURL(t, primaryURL)
	if replicaURL == primaryURL {
		t.Fatal("ReplicaURL returned the primary's URL")
	}
	conn, err := pgx.Connect(ctx, replicaURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var inRecovery bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil || !inRecovery {
		t.Fatalf("ReplicaURL's server in recovery = %v, %v", inRecovery, err)
	}
	var ext string
	if err := conn.QueryRow(ctx, `SELECT extname FROM pg_extension WHERE extname = 'btree_gist'`).Scan(&ext); err != nil {
		t.Fatalf("the migrated schema is not on the replica: %v", err)
	}
	testutil.EventuallyNil(t, time.Minute, func() error {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM seen`).Scan(&n); err != nil {
			return fmt.Errorf("the row has not reached the replica: %w", err)
		}
		if n != 1 {
			return fmt.Errorf("the replica holds %d rows, want 1", n)
		}
		return nil
	})
	_, err = conn.Exec(ctx, `INSERT INTO seen VALUES (2)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("a write on the replica: %v, want read_only_sql_transaction (25006)", err)
	}
	if Replica(t) != Replica(t) {
		t.Fatal("the binary has more than one replica")
	}
}

// The harness's cluster trusts no one: a test database's URL carries the
// password, and the same URL without it, or with a wrong one, is refused
// (28P01), so no other local user can write the tests' rows.
func TestDatabasesRefuseConnectionsWithoutThePassword(t *testing.T) {
	ctx := context.Background()
	good := DatabaseURL(t)
	conn, err := pgx.Connect(ctx, good)
	if err != nil {
		t.Fatalf("with the password: %v", err)
	}
	_ = conn.Close(ctx)
	t.Setenv("PGPASSFILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("PGPASSWORD", "")
	for name, user := range map[string]*url.Userinfo{
		"no password":    url.User("postgres"),
		"wrong password": url.UserPassword("postgres", "wrong"),
	} {
		u, err := url.Parse(good)
		if err != nil {
			t.Fatal(err)
		}
		u.User = user
		conn, err := pgx.Connect(ctx, u.String())
		if err == nil {
			_ = conn.Close(ctx)
			t.Errorf("%s: admitted", name)
			continue
		}
		var pgErr *pgconn.PgError
		if name == "wrong password" && (!errors.As(err, &pgErr) || pgErr.Code != "28P01") {
			t.Errorf("%s: %v, want invalid_password (28P01)", name, err)
		}
	}
}

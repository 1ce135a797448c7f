package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
)

// oneConnStore is a store whose pool holds a single connection, so each
// read runs on the connection the one before left behind.
func oneConnStore(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Open(context.Background(), testenv.DatabaseURL(t), func(c *pgxpool.Config) { c.MaxConns = 1 })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func backendPID(t *testing.T, s *store.Store) int32 {
	t.Helper()
	var pid int32
	if err := s.Read(context.Background(), func(b *store.Batch) {
		b.Queue(`SELECT pg_backend_pid()`).QueryRow(func(row pgx.Row) error { return row.Scan(&pid) })
	}); err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestReadRunsTheQueuedStatementsInOneReadOnlyTransaction(t *testing.T) {
	s := oneConnStore(t)
	ctx := context.Background()
	var readOnly string
	var n int
	var ids []int
	err := s.Read(ctx, func(b *store.Batch) {
		b.Queue(`SHOW transaction_read_only`).QueryRow(func(row pgx.Row) error { return row.Scan(&readOnly) })
		b.Queue(`SELECT $1::int + 1`, 41).QueryRow(func(row pgx.Row) error { return row.Scan(&n) })
		b.Queue(`SELECT generate_series(1, 3)`).Query(func(rows pgx.Rows) error {
			var err error
			ids, err = pgx.CollectRows(rows, pgx.RowTo[int])
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if readOnly != "on" || n != 42 || len(ids) != 3 || ids[2] != 3 {
		t.Fatalf("read-only %q, n %d, ids %v; want on, 42, [1 2 3]", readOnly, n, ids)
	}
	// Both statements ran in one transaction: now() is its start.
	var a, b string
	err = s.Read(ctx, func(q *store.Batch) {
		q.Queue(`SELECT now()::text`).QueryRow(func(row pgx.Row) error { return row.Scan(&a) })
		q.Queue(`SELECT pg_sleep(0.01), now()::text`).QueryRow(func(row pgx.Row) error { return row.Scan(nil, &b) })
	})
	if err != nil || a != b {
		t.Fatalf("transaction starts %q and %q (err %v), want one", a, b, err)
	}
}

func TestReadRefusesAWrite(t *testing.T) {
	s := oneConnStore(t)
	ctx := context.Background()
	if _, err := s.Pool.Exec(ctx, `CREATE TABLE read_probe (x int)`); err != nil {
		t.Fatal(err)
	}
	pid := backendPID(t, s)
	err := s.Read(ctx, func(b *store.Batch) {
		b.Queue(`INSERT INTO read_probe VALUES (1)`)
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" { // read_only_sql_transaction
		t.Fatalf("a write in a read = %v, want SQLSTATE 25006", err)
	}
	var rows int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM read_probe`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("read_probe holds %d rows (err %v), want 0", rows, err)
	}
	if got := backendPID(t, s); got != pid {
		t.Fatalf("the read's connection was replaced (backend %d, then %d)", pid, got)
	}
}

func TestReadFailsOnAStatementErrorAndKeepsTheConnection(t *testing.T) {
	s := oneConnStore(t)
	ctx := context.Background()
	pid := backendPID(t, s)
	var first int
	later := false
	err := s.Read(ctx, func(b *store.Batch) {
		b.Queue(`SELECT 1`).QueryRow(func(row pgx.Row) error { return row.Scan(&first) })
		b.Queue(`SELECT 1/0`).QueryRow(func(row pgx.Row) error { var x int; return row.Scan(&x) })
		b.Queue(`SELECT 2`).QueryRow(func(row pgx.Row) error { later = true; return nil })
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22012" { // division_by_zero
		t.Fatalf("a failing statement = %v, want SQLSTATE 22012", err)
	}
	if first != 1 || later {
		t.Fatalf("callbacks: first %d, later ran %v; want 1 and false", first, later)
	}
	if got := backendPID(t, s); got != pid {
		t.Fatalf("the failed read's connection was replaced (backend %d, then %d)", pid, got)
	}
}

func TestReadAnswersACallbacksError(t *testing.T) {
	s := oneConnStore(t)
	ctx := context.Background()
	pid := backendPID(t, s)
	missing := errors.New("missing")
	err := s.Read(ctx, func(b *store.Batch) {
		b.Queue(`SELECT 1 WHERE false`).QueryRow(func(row pgx.Row) error {
			var x int
			if err := row.Scan(&x); errors.Is(err, pgx.ErrNoRows) {
				return missing
			}
			return nil
		})
	})
	if !errors.Is(err, missing) {
		t.Fatalf("Read = %v, want the callback's error", err)
	}
	if got := backendPID(t, s); got != pid {
		t.Fatalf("the read's connection was replaced (backend %d, then %d)", pid, got)
	}
}

// Reads rely on pgx's statement cache: each statement is parsed once per
// connection, and a batch sends only Bind and Execute for it.
func TestStoreCachesPreparedStatements(t *testing.T) {
	s := testenv.Store(t)
	if got := s.Pool.Config().ConnConfig.DefaultQueryExecMode; got != pgx.QueryExecModeCacheStatement {
		t.Fatalf("query exec mode %v, want QueryExecModeCacheStatement", got)
	}
}

package store_test

import (
	"bytes"
	"context"
	"io/fs"
	"strconv"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/migrations"
	"github.com/better-compute/better-compute/store"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestMigrateDownAndUpAgain(t *testing.T) {
	ctx := context.Background()
	m, err := store.NewMigrator(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	latest, err := m.Version(ctx)
	if err != nil || latest < 1 {
		t.Fatalf("template version = %d, %v", latest, err)
	}
	if n, err := m.Up(ctx); err != nil || n != 0 {
		t.Fatalf("Up on a migrated database applied %d, %v", n, err)
	}
	if err := m.Down(ctx); err != nil {
		t.Fatal(err)
	}
	// Migration numbers may have gaps (each line of work gets its own).
	if v, _ := m.Version(ctx); v != previousMigration(t, latest) {
		t.Fatalf("after Down version = %d, want %d", v, previousMigration(t, latest))
	}
	var status bytes.Buffer
	if err := m.WriteStatus(ctx, &status); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(status.String(), "pending") {
		t.Fatalf("status after Down shows nothing pending:\n%s", status.String())
	}
	if n, err := m.Up(ctx); err != nil || n != 1 {
		t.Fatalf("Up after Down applied %d, %v", n, err)
	}
}

// previousMigration is the number of the embedded migration before latest.
func previousMigration(t *testing.T, latest int64) int64 {
	t.Helper()
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	var prev int64
	for _, e := range entries {
		n, err := strconv.ParseInt(strings.SplitN(e.Name(), "_", 2)[0], 10, 64)
		if err == nil && n < latest && n > prev {
			prev = n
		}
	}
	return prev
}

func TestInTxRollsBackOnError(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	if _, err := s.Pool.Exec(ctx, `CREATE TABLE t (v int)`); err != nil {
		t.Fatal(err)
	}
	boom := context.Canceled
	err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`); err != nil {
			return err
		}
		return boom
	})
	if err != boom {
		t.Fatalf("InTx = %v, want the callback's error", err)
	}
	var n int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after a failed transaction = %d, %v", n, err)
	}
}

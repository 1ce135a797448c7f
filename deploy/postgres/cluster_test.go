package postgres

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestStartStopRestartKeepsData(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	ctx := context.Background()
	dir := t.TempDir()
	// t.TempDir's folders are private to root; the postgres OS user must reach in.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := Options{DataDir: filepath.Join(dir, "data")}
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	created, err := c.EnsureDatabase(ctx, "app", "")
	if err != nil || !created {
		t.Fatalf("EnsureDatabase = %v, %v", created, err)
	}
	execSQL(t, c.URL("app"), `CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)`)
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}

	opts.Port = c.Port()
	c2, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c2.Stop(context.Background()) })
	if created, err := c2.EnsureDatabase(ctx, "app", ""); err != nil || created {
		t.Fatalf("EnsureDatabase after restart = %v, %v", created, err)
	}
	conn, err := pgx.Connect(ctx, c2.URL("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v int
	if err := conn.QueryRow(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != 42 {
		t.Fatalf("kept row = %d, %v", v, err)
	}
}

func execSQL(t *testing.T, url, sql string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

func TestStartExplainsAPrivateParent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root hands the server to another OS user")
	}
	dir := t.TempDir() // private to root: the postgres OS user cannot enter
	_, err := Start(context.Background(), Options{DataDir: filepath.Join(dir, "data")})
	if err == nil || !strings.Contains(err.Error(), "chmod o+x") {
		t.Fatalf("Start under a private folder: %v, want an error naming the fix", err)
	}
}

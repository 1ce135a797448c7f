package testenv

import (
	"context"
	"testing"
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

package nodes_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
)

// Join token ids are jt_<ULID>; the migration that brought the prefix
// rewrites the ids made before it, with the join requests that name them,
// and the database refuses any other prefix.
func TestJoinTokenIDsAreJT(t *testing.T) {
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	m, err := store.NewMigrator(url)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const prefixMigration = 22
	for {
		v, err := m.Version(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if v < prefixMigration {
			break
		}
		if err := m.Down(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pool := joinPool(t, s, "acme")
	old := "jtok_" + strings.TrimPrefix(core.NewID("x"), "x_")
	if _, err := s.Pool.Exec(ctx, `INSERT INTO join_tokens (id, tenant_id, pool_id, token_hash, expires_at, max_uses, created_by)
		VALUES ($1, 'acme', $2, $3, now() + interval '1 hour', 1, 'idn_x')`, old, pool, nodes.HashJoinToken("bcjt_old")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, `INSERT INTO join_requests (id, tenant_id, pool_id, join_token_id, name, inventory, csr, request_secret_hash)
		VALUES ('jr_x', 'acme', $1, $2, 'n', '{}', 'csr', $3)`, pool, old, nodes.HashJoinToken("secret")); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	want := "jt_" + strings.TrimPrefix(old, "jtok_")
	var id, requestToken string
	if err := s.Pool.QueryRow(ctx, `SELECT t.id, r.join_token_id FROM join_tokens t JOIN join_requests r ON r.join_token_id = t.id`).
		Scan(&id, &requestToken); err != nil || id != want || requestToken != want {
		t.Fatalf("after the migration: token %s, request's token %s, %v; want %s", id, requestToken, err, want)
	}

	jt, _ := newJoinToken(t, s, "acme", pool, 1)
	if !core.ValidID(nodes.JoinTokenIDPrefix, jt.ID) || !strings.HasPrefix(jt.ID, "jt_") {
		t.Fatalf("new join token id %s", jt.ID)
	}
	if _, err := s.Pool.Exec(ctx, `UPDATE join_tokens SET id = 'jtok_' || substr(id, 4) WHERE id = $1`, jt.ID); err == nil {
		t.Fatal("a jtok_ id was accepted")
	}
}

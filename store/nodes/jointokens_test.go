package nodes_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
)

// joinPool inserts a site and a bcd pool of tenant and returns the pool's id.
func joinPool(t *testing.T, s *store.Store, tenant string) string {
	t.Helper()
	ctx := context.Background()
	site, pool := core.NewID("site"), core.NewID("pool")
	if _, err := s.Pool.Exec(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, $2, $1, 'eu', 'eu-west', 'custom', 'idn_x')`, site, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, created_by)
		VALUES ($1, $2, $3, $1, 'metal-host', 'H100', 80, 'bcd', 'idn_x')`, pool, tenant, site); err != nil {
		t.Fatal(err)
	}
	return pool
}

// newJoinToken records a token of pool and returns it with its plain text.
func newJoinToken(t *testing.T, s *store.Store, tenant, pool string, maxUses int) (nodes.JoinToken, string) {
	t.Helper()
	plain := nodes.JoinTokenPrefix + strings.ToLower(core.NewID("x")) + strings.ToLower(core.NewID("y"))
	var jt nodes.JoinToken
	err := s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		jt, err = nodes.CreateJoinToken(context.Background(), tx, nodes.NewJoinToken{TenantID: tenant, PoolID: pool,
			Name: "n", Hash: nodes.HashJoinToken(plain), TTL: time.Hour, MaxUses: maxUses, CreatedBy: "idn_x"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return jt, plain
}

func consume(s *store.Store, token string) (nodes.JoinToken, error) {
	var jt nodes.JoinToken
	err := s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) (err error) {
		jt, err = nodes.ConsumeJoinToken(context.Background(), tx, token)
		return err
	})
	return jt, err
}

// wantRefused wants err to be code with details.reason (none when "") and
// to name neither the token nor its pool.
func wantRefused(t *testing.T, what string, err error, code core.Code, reason string, jt nodes.JoinToken) {
	t.Helper()
	var e *core.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("%s = %v, want %s", what, err, code)
	}
	if got, _ := e.Details["reason"].(string); got != reason || (reason == "" && len(e.Details) != 0) {
		t.Fatalf("%s details = %v, want reason %q", what, e.Details, reason)
	}
	if strings.Contains(e.Error(), jt.PoolID) || strings.Contains(e.Error(), jt.ID) || strings.Contains(e.Error(), jt.TenantID) {
		t.Fatalf("%s reveals the token's pool, id or tenant: %v", what, e)
	}
}

func TestCreateJoinToken(t *testing.T) {
	s := testenv.Store(t)
	pool := joinPool(t, s, "acme")
	before := time.Now()
	jt, plain := newJoinToken(t, s, "acme", pool, 3)
	if !core.ValidID("jt", jt.ID) || jt.TenantID != "acme" || jt.PoolID != pool || jt.MaxUses != 3 || jt.Uses != 0 ||
		jt.State != nodes.JoinTokenActive || jt.RevokedAt != nil || jt.CreatedBy != "idn_x" {
		t.Fatalf("created %+v", jt)
	}
	if d := jt.ExpiresAt.Sub(jt.CreatedAt); d != time.Hour {
		t.Fatalf("expires %v after its creation, want 1h", d)
	}
	if jt.CreatedAt.Before(before.Add(-time.Minute)) {
		t.Fatalf("createdAt %v", jt.CreatedAt)
	}
	var hash []byte
	if err := s.Pool.QueryRow(context.Background(), `SELECT token_hash FROM join_tokens WHERE id = $1`, jt.ID).Scan(&hash); err != nil ||
		!bytes.Equal(hash, nodes.HashJoinToken(plain)) {
		t.Fatalf("stored hash %x, %v", hash, err)
	}
	// A hash that is not a SHA-256 is refused before the database.
	err := s.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
		_, err := nodes.CreateJoinToken(context.Background(), tx, nodes.NewJoinToken{TenantID: "acme", PoolID: pool,
			Hash: []byte("short"), TTL: time.Hour, MaxUses: 1, CreatedBy: "idn_x"})
		return err
	})
	if err == nil {
		t.Fatal("a short hash was stored")
	}
}

func TestConsumeJoinToken(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	pool := joinPool(t, s, "acme")
	jt, plain := newJoinToken(t, s, "acme", pool, 2)

	got, err := consume(s, plain)
	if err != nil || got.ID != jt.ID || got.PoolID != pool || got.TenantID != "acme" || got.Uses != 1 || got.State != nodes.JoinTokenActive {
		t.Fatalf("first use = %+v, %v", got, err)
	}
	// A join that fails after the use gives it back: the use is in the join's transaction.
	boom := errors.New("the join failed")
	err = s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		if _, err := nodes.ConsumeJoinToken(ctx, tx, plain); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failed join = %v", err)
	}
	got, err = consume(s, plain)
	if err != nil || got.Uses != 2 || got.State != nodes.JoinTokenExhausted {
		t.Fatalf("last use = %+v, %v", got, err)
	}
	_, err = consume(s, plain)
	wantRefused(t, "a use past maxUses", err, core.CodeInvalidState, nodes.JoinTokenExhausted, jt)

	// Unknown and malformed tokens: UNAUTHENTICATED, with no details.
	for _, tok := range []string{"", "bcst_" + strings.TrimPrefix(plain, nodes.JoinTokenPrefix), plain + "x",
		nodes.JoinTokenPrefix, strings.ToUpper(plain), nodes.JoinTokenPrefix + strings.Repeat("a", 300)} {
		_, err := consume(s, tok)
		wantRefused(t, "token "+tok, err, core.CodeUnauthn, "", jt)
	}

	// Expired: its expiry is in the past.
	ex, exPlain := newJoinToken(t, s, "acme", pool, 5)
	if _, err := s.Pool.Exec(ctx, `UPDATE join_tokens SET expires_at = now() - interval '1 second' WHERE id = $1`, ex.ID); err != nil {
		t.Fatal(err)
	}
	_, err = consume(s, exPlain)
	wantRefused(t, "an expired token", err, core.CodeInvalidState, nodes.JoinTokenExpired, ex)

	// Revoked (and expired: revoked wins), and idempotent revocation.
	rv, rvPlain := newJoinToken(t, s, "acme", pool, 5)
	var first, again nodes.JoinToken
	err = s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		if first, err = nodes.RevokeJoinToken(ctx, tx, "acme", pool, rv.ID); err != nil {
			return err
		}
		again, err = nodes.RevokeJoinToken(ctx, tx, "acme", pool, rv.ID)
		return err
	})
	if err != nil || first.State != nodes.JoinTokenRevoked || first.RevokedAt == nil || !again.RevokedAt.Equal(*first.RevokedAt) {
		t.Fatalf("revoke = %+v, %+v, %v", first, again, err)
	}
	_, err = consume(s, rvPlain)
	wantRefused(t, "a revoked token", err, core.CodeInvalidState, nodes.JoinTokenRevoked, rv)
	if _, err := s.Pool.Exec(ctx, `UPDATE join_tokens SET expires_at = now() - interval '1 second' WHERE id = $1`, rv.ID); err != nil {
		t.Fatal(err)
	}
	_, err = consume(s, rvPlain)
	wantRefused(t, "a revoked, expired token", err, core.CodeInvalidState, nodes.JoinTokenRevoked, rv)

	// Revoking through another pool or tenant, or a missing token: NOT_FOUND.
	other := joinPool(t, s, "acme")
	for _, c := range []struct{ tenant, pool, id string }{{"acme", other, jt.ID}, {"globex", pool, jt.ID}, {"acme", pool, core.NewID("jt")}} {
		err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			_, err := nodes.RevokeJoinToken(ctx, tx, c.tenant, c.pool, c.id)
			return err
		})
		if !errors.Is(err, core.ErrNotFound) {
			t.Fatalf("revoke %+v = %v, want NOT_FOUND", c, err)
		}
	}

	// A token of an archived pool takes no more nodes.
	ar, arPlain := newJoinToken(t, s, "acme", other, 5)
	if _, err := s.Pool.Exec(ctx, `UPDATE pools SET archived_at = now() WHERE id = $1`, other); err != nil {
		t.Fatal(err)
	}
	_, err = consume(s, arPlain)
	wantRefused(t, "a token of an archived pool", err, core.CodeInvalidState, nodes.JoinTokenPoolArchived, ar)

	// Refusals spent nothing.
	var uses int
	if err := s.Pool.QueryRow(ctx, `SELECT sum(uses) FROM join_tokens`).Scan(&uses); err != nil || uses != 2 {
		t.Fatalf("%d uses in all, %v; want 2", uses, err)
	}

	// List: every state, oldest first (by the millisecond, then the id:
	// tokens made within one millisecond come in id order).
	var list []nodes.JoinToken
	err = s.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		list, err = nodes.ListJoinTokens(ctx, tx, "acme", pool, store.PageQuery{Limit: 500})
		return err
	})
	if err != nil || len(list) != 3 || list[0].ID != jt.ID || list[0].State != nodes.JoinTokenExhausted {
		t.Fatalf("list = %+v, %v", list, err)
	}
	states := map[string]bool{}
	for i, tok := range list {
		states[tok.State] = true
		if i > 0 {
			prev, at := list[i-1].CreatedAt.UnixMilli(), tok.CreatedAt.UnixMilli()
			if prev > at || (prev == at && list[i-1].ID > tok.ID) {
				t.Fatalf("list out of order at %d: %+v", i, list)
			}
		}
	}
	if !states[nodes.JoinTokenExpired] || !states[nodes.JoinTokenRevoked] {
		t.Fatalf("list states = %v", states)
	}
}

// Concurrent joins never spend more than maxUses: the row is locked.
func TestConsumeJoinTokenConcurrently(t *testing.T) {
	s := testenv.Store(t)
	pool := joinPool(t, s, "acme")
	const maxUses, joins = 3, 12
	jt, plain := newJoinToken(t, s, "acme", pool, maxUses)
	var wg sync.WaitGroup
	errs := make(chan error, joins)
	for range joins {
		wg.Go(func() {
			_, err := consume(s, plain)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	ok := 0
	for err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, core.ErrInvalidState):
		default:
			t.Errorf("join = %v", err)
		}
	}
	var uses int
	if err := s.Pool.QueryRow(context.Background(), `SELECT uses FROM join_tokens WHERE id = $1`, jt.ID).Scan(&uses); err != nil {
		t.Fatal(err)
	}
	if ok != maxUses || uses != maxUses {
		t.Fatalf("%d joins succeeded and %d uses recorded; want %d", ok, uses, maxUses)
	}
}

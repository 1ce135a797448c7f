package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
)

func TestNodeIdentities(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	pool := joinPool(t, s, "acme")
	node := core.NewID("node")
	if _, err := s.Pool.Exec(ctx, `INSERT INTO nodes (id, tenant_id, pool_id, name) VALUES ($1, 'acme', $2, 'n1')`, node, pool); err != nil {
		t.Fatal(err)
	}
	record := func(serial string, expires time.Time) {
		t.Helper()
		if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			_, err := store.RecordNodeIdentity(ctx, tx, store.NodeIdentity{NodeID: node, Serial: serial, Certificate: "PEM", ExpiresAt: expires})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	valid := func(serial string) bool {
		t.Helper()
		ok, err := store.NodeIdentityValid(ctx, s.Pool, node, serial)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	record("aa01", time.Now().Add(time.Hour))
	record("aa02", time.Now().Add(-time.Minute)) // expired
	if !valid("aa01") || valid("aa02") || valid("ffff") {
		t.Fatal("valid: want aa01 only")
	}
	if ok, _ := store.NodeIdentityValid(ctx, s.Pool, core.NewID("node"), "aa01"); ok {
		t.Fatal("a serial is valid for another node")
	}

	// Revoking notifies the channel with the node id, on commit.
	got := make(chan string, 1)
	listening := make(chan struct{})
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = s.Listen(lctx, store.NodeIdentityRevokedChannel, func() { close(listening) }, func(p string) { got <- p })
	}()
	<-listening
	var n int
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		n, err = store.RevokeNodeIdentities(ctx, tx, node, "idn_x")
		return err
	}); err != nil || n != 2 {
		t.Fatalf("revoke = %d, %v", n, err)
	}
	select {
	case p := <-got:
		if p != node {
			t.Fatalf("notified %q, want %q", p, node)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification")
	}
	if valid("aa01") {
		t.Fatal("a revoked identity is valid")
	}
	ids, err := store.ListNodeIdentities(ctx, s.Pool, node)
	if err != nil || len(ids) != 2 || ids[0].RevokedAt == nil || ids[0].RevokedBy != "idn_x" {
		t.Fatalf("list = %+v, %v", ids, err)
	}
}

func TestJoinRequests(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	pool := joinPool(t, s, "acme")
	jt, _ := newJoinToken(t, s, "acme", pool, 5)
	node := core.NewID("node")
	if _, err := s.Pool.Exec(ctx, `INSERT INTO nodes (id, tenant_id, pool_id, name) VALUES ($1, 'acme', $2, 'n1')`, node, pool); err != nil {
		t.Fatal(err)
	}
	create := func() store.JoinRequest {
		t.Helper()
		var r store.JoinRequest
		err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			r, err = store.CreateJoinRequest(ctx, tx, store.NewJoinRequest{TenantID: "acme", PoolID: pool, JoinTokenID: jt.ID,
				Name: "gpu-1", HardwareKey: "hk", Inventory: []byte(`{"a":1}`), CSR: "CSR",
				SecretHash: store.HashRequestSecret("secret-" + core.NewID("x"))})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := create(), create()
	if !core.ValidID("jreq", a.ID) || a.State != store.JoinRequestPending || a.ExpiresAt.Sub(a.CreatedAt) != store.JoinRequestTTL {
		t.Fatalf("created %+v", a)
	}
	decide := func(id string, d store.JoinRequestDecision) (store.JoinRequest, error) {
		var r store.JoinRequest
		err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			r, err = store.DecideJoinRequest(ctx, tx, "acme", pool, id, d)
			return err
		})
		return r, err
	}
	r, err := decide(a.ID, store.JoinRequestDecision{State: store.JoinRequestApproved, NodeID: node, Certificate: "CERT", DecidedBy: "idn_x"})
	if err != nil || r.State != store.JoinRequestApproved || r.NodeID != node || r.Certificate != "CERT" || r.DecidedAt == nil {
		t.Fatalf("approve = %+v, %v", r, err)
	}
	if _, err := decide(a.ID, store.JoinRequestDecision{State: store.JoinRequestRejected}); core.AsError(err).Code != core.CodeInvalidState {
		t.Fatalf("decide twice = %v", err)
	}
	// b expires: it reads expired and cannot be decided.
	if _, err := s.Pool.Exec(ctx, `UPDATE join_requests SET expires_at = now() - interval '1 s' WHERE id = $1`, b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := decide(b.ID, store.JoinRequestDecision{State: store.JoinRequestRejected}); core.AsError(err).Details["reason"] != "expired" {
		t.Fatalf("decide expired = %v", err)
	}
	c := create()
	if r, err := decide(c.ID, store.JoinRequestDecision{State: store.JoinRequestRejected, DecidedBy: "idn_x"}); err != nil || r.State != "rejected" {
		t.Fatalf("reject = %+v, %v", r, err)
	}
	var byState map[string]int
	err = s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		all, err := store.ListJoinRequests(ctx, tx, "acme", pool, "", 100)
		if err != nil {
			return err
		}
		byState = map[string]int{}
		for _, r := range all {
			byState[r.State]++
		}
		exp, err := store.ListJoinRequests(ctx, tx, "acme", pool, "expired", 100)
		if err != nil || len(exp) != 1 || exp[0].ID != b.ID {
			return errors.Join(err, errors.New("expired filter"))
		}
		other, err := store.ListJoinRequests(ctx, tx, "globex", pool, "", 100)
		if err != nil || len(other) != 0 {
			return errors.Join(err, errors.New("another tenant sees the requests"))
		}
		if _, err := store.GetJoinRequest(ctx, tx, "globex", pool, a.ID, false); core.AsError(err).Code != core.CodeNotFound {
			return errors.Join(err, errors.New("another tenant reads a request"))
		}
		return nil
	})
	if err != nil || byState["approved"] != 1 || byState["expired"] != 1 || byState["rejected"] != 1 {
		t.Fatalf("list = %v, %v", byState, err)
	}
	if _, err := store.GetJoinRequestBySecret(ctx, s.Pool, a.ID, "wrong"); core.AsError(err).Code != core.CodeUnauthn {
		t.Fatalf("wrong secret = %v", err)
	}
}

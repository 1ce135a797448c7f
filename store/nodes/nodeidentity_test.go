package nodes_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
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
			_, err := nodes.RecordNodeIdentity(ctx, tx, nodes.NodeIdentity{NodeID: node, Serial: serial, Certificate: "PEM", ExpiresAt: expires})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	valid := func(serial string) bool {
		t.Helper()
		ok, err := nodes.NodeIdentityValid(ctx, s.Pool, node, serial)
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
	if ok, _ := nodes.NodeIdentityValid(ctx, s.Pool, core.NewID("node"), "aa01"); ok {
		t.Fatal("a serial is valid for another node")
	}

	// Revoking notifies the channel with the node id, on commit.
	got := make(chan string, 1)
	listening := make(chan struct{})
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = s.Listen(lctx, nodes.NodeIdentityRevokedChannel, func() { close(listening) }, func(p string) { got <- p })
	}()
	<-listening
	var n int
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		n, err = nodes.RevokeNodeIdentities(ctx, tx, node, "idn_x")
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
	ids, err := nodes.ListNodeIdentities(ctx, s.Pool, node)
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
	create := func() nodes.JoinRequest {
		t.Helper()
		var r nodes.JoinRequest
		err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			r, err = nodes.CreateJoinRequest(ctx, tx, nodes.NewJoinRequest{TenantID: "acme", PoolID: pool, JoinTokenID: jt.ID,
				Name: "gpu-1", HardwareKey: "hk", Inventory: []byte(`{"a":1}`), CSR: "CSR",
				SecretHash: nodes.HashRequestSecret("secret-" + core.NewID("x"))})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b := create(), create()
	if !core.ValidID("jreq", a.ID) || a.State != nodes.JoinRequestPending || a.ExpiresAt.Sub(a.CreatedAt) != nodes.JoinRequestTTL {
		t.Fatalf("created %+v", a)
	}
	decide := func(id string, d nodes.JoinRequestDecision) (nodes.JoinRequest, error) {
		var r nodes.JoinRequest
		err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			r, err = nodes.DecideJoinRequest(ctx, tx, "acme", pool, id, d)
			return err
		})
		return r, err
	}
	r, err := decide(a.ID, nodes.JoinRequestDecision{State: nodes.JoinRequestApproved, NodeID: node, Certificate: "CERT", DecidedBy: "idn_x"})
	if err != nil || r.State != nodes.JoinRequestApproved || r.NodeID != node || r.Certificate != "CERT" || r.DecidedAt == nil {
		t.Fatalf("approve = %+v, %v", r, err)
	}
	if _, err := decide(a.ID, nodes.JoinRequestDecision{State: nodes.JoinRequestRejected}); core.AsError(err).Code != core.CodeInvalidState {
		t.Fatalf("decide twice = %v", err)
	}
	// b expires: it reads expired and cannot be decided.
	if _, err := s.Pool.Exec(ctx, `UPDATE join_requests SET expires_at = now() - interval '1 s' WHERE id = $1`, b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := decide(b.ID, nodes.JoinRequestDecision{State: nodes.JoinRequestRejected}); core.AsError(err).Details["reason"] != "expired" {
		t.Fatalf("decide expired = %v", err)
	}
	c := create()
	if r, err := decide(c.ID, nodes.JoinRequestDecision{State: nodes.JoinRequestRejected, DecidedBy: "idn_x"}); err != nil || r.State != "rejected" {
		t.Fatalf("reject = %+v, %v", r, err)
	}
	var byState map[string]int
	err = s.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		all, err := nodes.ListJoinRequests(ctx, tx, "acme", pool, "", store.PageQuery{Limit: 100})
		if err != nil {
			return err
		}
		byState = map[string]int{}
		for _, r := range all {
			byState[r.State]++
		}
		exp, err := nodes.ListJoinRequests(ctx, tx, "acme", pool, "expired", store.PageQuery{Limit: 100})
		if err != nil || len(exp) != 1 || exp[0].ID != b.ID {
			return errors.Join(err, errors.New("expired filter"))
		}
		other, err := nodes.ListJoinRequests(ctx, tx, "globex", pool, "", store.PageQuery{Limit: 100})
		if err != nil || len(other) != 0 {
			return errors.Join(err, errors.New("another tenant sees the requests"))
		}
		if _, err := nodes.GetJoinRequest(ctx, tx, "globex", pool, a.ID, false); core.AsError(err).Code != core.CodeNotFound {
			return errors.Join(err, errors.New("another tenant reads a request"))
		}
		return nil
	})
	if err != nil || byState["approved"] != 1 || byState["expired"] != 1 || byState["rejected"] != 1 {
		t.Fatalf("list = %v, %v", byState, err)
	}
	if _, err := nodes.GetJoinRequestBySecret(ctx, s.Pool, a.ID, "wrong"); core.AsError(err).Code != core.CodeUnauthn {
		t.Fatalf("wrong secret = %v", err)
	}
}

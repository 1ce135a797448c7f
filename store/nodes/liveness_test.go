package nodes_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
)

// livenessNodes inserts n nodes of pool and starts a session on each,
// answering their ids and epochs.
func livenessNodes(t *testing.T, s *store.Store, tenant, pool string, n int) ([]string, []int64) {
	t.Helper()
	ctx := context.Background()
	ids, epochs := make([]string, n), make([]int64, n)
	for i := range n {
		ids[i] = core.NewID("node")
		if _, err := s.Pool.Exec(ctx, `INSERT INTO nodes (id, tenant_id, pool_id, name) VALUES ($1, $2, $3, $1)`,
			ids[i], tenant, pool); err != nil {
			t.Fatal(err)
		}
		if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			w, err := nodes.StartSession(ctx, tx, ids[i], "bcd/test", time.Minute, 0)
			epochs[i] = w.Epoch
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	return ids, epochs
}

func leaseOf(t *testing.T, s *store.Store, nodeID string) time.Time {
	t.Helper()
	var at time.Time
	if err := s.Pool.QueryRow(context.Background(), `SELECT expires_at FROM node_liveness WHERE node_id = $1`,
		nodeID).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

func TestRecordHeartbeatsRenewsEveryHeldLeaseInOneStatement(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	pool := joinPool(t, s, "acme")
	ids, epochs := livenessNodes(t, s, "acme", pool, 5)
	// Node 3 is not connected (the sweep got there first) and node 4's
	// clock is off: both need the wide row repaired.
	if _, err := s.Pool.Exec(ctx, `UPDATE nodes SET connectivity = 'unreachable' WHERE id = $1`, ids[3]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, `UPDATE node_liveness SET expires_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	// The wide row's version: a heartbeat must not write it.
	xminOf := func(id string) string {
		t.Helper()
		var x string
		if err := s.Pool.QueryRow(ctx, `SELECT xmin::text FROM nodes WHERE id = $1`, id).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	wideBefore := xminOf(ids[0])
	// Node 0's session has its identity checked with the batch, and so
	// has node 2's, whose serial is not recorded.
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := nodes.RecordNodeIdentity(ctx, tx, nodes.NodeIdentity{NodeID: ids[0], Serial: "aa01", Certificate: "PEM",
			ExpiresAt: time.Now().Add(time.Hour)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	beats := []nodes.Beat{
		{NodeID: ids[0], Epoch: epochs[0], Serial: "aa01"},
		{NodeID: ids[1], Epoch: epochs[1] + 7}, // an epoch the node never had: superseded
		{NodeID: ids[2], Epoch: epochs[2], Skew: time.Second, Serial: "ffff"},
		{NodeID: ids[3], Epoch: epochs[3]},
		{NodeID: ids[4], Epoch: epochs[4], Skew: time.Minute},
		{NodeID: core.NewID("node"), Epoch: 1}, // no such node
	}
	var res []nodes.BeatResult
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		if err := nodes.HeartbeatTx(ctx, tx); err != nil {
			return err
		}
		res, err = nodes.RecordHeartbeats(ctx, tx, time.Minute, beats)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := []nodes.BeatResult{
		{Recorded: true, Generation: 1, IdentityValid: true}, {}, {Recorded: true, Generation: 1},
		{Recorded: true, Generation: 1, NeedsRepair: true, IdentityValid: true},
		{Recorded: true, Generation: 1, NeedsRepair: true, IdentityValid: true}, {},
	}
	if len(res) != len(want) {
		t.Fatalf("%d results for %d beats", len(res), len(beats))
	}
	for i := range want {
		if res[i] != want[i] {
			t.Errorf("beat %d: %+v, want %+v", i, res[i], want[i])
		}
	}
	if xminOf(ids[0]) != wideBefore {
		t.Error("a heartbeat wrote the nodes row")
	}
	for i, id := range ids {
		renewed := leaseOf(t, s, id).After(time.Now())
		if renewed != (i != 1) {
			t.Errorf("node %d: lease renewed %v", i, renewed)
		}
	}

	// The repair brings the wide row in step, in the session's epoch only.
	for _, i := range []int{3, 4} {
		if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			return nodes.RepairLiveness(ctx, tx, ids[i], epochs[i], beats[i].Skew)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return nodes.RepairLiveness(ctx, tx, ids[1], epochs[1]+7, 0)
	}); err != nodes.ErrSuperseded {
		t.Fatalf("repair in a stale epoch: %v, want ErrSuperseded", err)
	}
	var connectivity string
	var skewed bool
	if err := s.Pool.QueryRow(ctx, `SELECT connectivity FROM nodes WHERE id = $1`, ids[3]).Scan(&connectivity); err != nil || connectivity != "connected" {
		t.Fatalf("repaired node: %q, %v", connectivity, err)
	}
	if err := s.Pool.QueryRow(ctx, `SELECT conditions @> '[{"type": "ClockSkew"}]' FROM nodes WHERE id = $1`, ids[4]).Scan(&skewed); err != nil || !skewed {
		t.Fatalf("skewed node has ClockSkew: %v, %v", skewed, err)
	}
	// Once repaired, the same heartbeats need nothing more.
	if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		res, err = nodes.RecordHeartbeats(ctx, tx, time.Minute, beats[3:5])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if res[0].NeedsRepair || res[1].NeedsRepair {
		t.Fatalf("after the repair: %+v", res)
	}
}

func TestSweepDeclaresASilentNodeLost(t *testing.T) {
	ctx := context.Background()
	s := testenv.Store(t)
	pool := joinPool(t, s, "acme")
	ids, _ := livenessNodes(t, s, "acme", pool, 2)
	// Node 0 fell silent longer ago than the default lostAfter; node 1
	// heartbeats.
	if _, err := s.Pool.Exec(ctx, `UPDATE node_liveness SET expires_at = now() - interval '1 hour' WHERE node_id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	sweep := func(fn func(tx store.Tx) (int, error)) int {
		t.Helper()
		var n int
		if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			n, err = fn(tx)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := sweep(func(tx store.Tx) (int, error) { return nodes.SweepUnreachable(ctx, tx) }); n != 1 {
		t.Fatalf("unreachable sweep changed %d nodes, want 1", n)
	}
	if n := sweep(func(tx store.Tx) (int, error) { return nodes.SweepLost(ctx, tx, slog.Default()) }); n != 1 {
		t.Fatalf("lost sweep changed %d nodes, want 1", n)
	}
	for i, want := range []string{"lost", "connected"} {
		var got string
		if err := s.Pool.QueryRow(ctx, `SELECT connectivity FROM nodes WHERE id = $1`, ids[i]).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("node %d: %s, want %s", i, got, want)
		}
	}
}

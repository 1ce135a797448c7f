package agentgateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// sessionNodes inserts n nodes, each taken by a session, and answers the
// beats of those sessions.
func sessionNodes(t *testing.T, s *store.Store, n int) []domain.Beat {
	t.Helper()
	ctx := context.Background()
	site, pool := core.NewID("site"), core.NewID("pool")
	if _, err := s.Pool.Exec(ctx, `INSERT INTO sites (id, tenant_id, name, region, iam_region, kind, created_by)
		VALUES ($1, 'acme', $1, 'eu', 'eu-west', 'custom', 'idn_x')`, site); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, `INSERT INTO pools (id, tenant_id, site_id, name, class, gpu_model, gpu_memory_gb, agent, created_by)
		VALUES ($1, 'acme', $2, $1, 'metal-host', 'H100', 80, 'bcd', 'idn_x')`, pool, site); err != nil {
		t.Fatal(err)
	}
	beats := make([]domain.Beat, n)
	for i := range beats {
		id := core.NewID("node")
		if _, err := s.Pool.Exec(ctx, `INSERT INTO nodes (id, tenant_id, pool_id, name) VALUES ($1, 'acme', $2, $1)`, id, pool); err != nil {
			t.Fatal(err)
		}
		if err := s.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			w, err := domain.StartSession(ctx, tx, id, "bcd/test", time.Minute, 0)
			beats[i] = domain.Beat{NodeID: id, Epoch: w.Epoch}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Every lease lapsed: a recorded heartbeat is one whose lease is in
	// the future again.
	if _, err := s.Pool.Exec(ctx, `UPDATE node_liveness SET expires_at = now() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	return beats
}

// beatConnOf is the batcher's writer on s, closed when the test ends.
func beatConnOf(t *testing.T, s *store.Store) *beatConn {
	c := newBeatConn(s.Pool.Config().ConnConfig, time.Minute)
	t.Cleanup(c.close)
	return c
}

func renewed(t *testing.T, s *store.Store, nodeID string) bool {
	t.Helper()
	var ok bool
	if err := s.Pool.QueryRow(context.Background(), `SELECT expires_at > now() FROM node_liveness WHERE node_id = $1`,
		nodeID).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// countingWriter wraps the store's writer, recording each call's size and
// failing the first failFirst calls (fail < 0: every call).
type countingWriter struct {
	mu        sync.Mutex
	calls     []int
	failFirst int
	next      beatWriter
}

func (w *countingWriter) write(ctx context.Context, beats []domain.Beat) ([]domain.BeatResult, error) {
	w.mu.Lock()
	w.calls = append(w.calls, len(beats))
	fail := w.failFirst < 0 || len(w.calls) <= w.failFirst
	w.mu.Unlock()
	if fail {
		return nil, errors.New("the database is away")
	}
	return w.next(ctx, beats)
}

func (w *countingWriter) sizes() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int(nil), w.calls...)
}

// submitAll submits every beat from its own goroutine, as sessions do,
// flushes once all are pending, and answers each outcome in order. The
// batcher's own flush interval is an hour: the test flushes.
func submitAll(t *testing.T, w beatWriter, beats []domain.Beat) ([]domain.BeatResult, []error) {
	t.Helper()
	b := newHeartbeatBatcher(time.Hour, w, slog.New(slog.NewTextHandler(io.Discard, nil)))
	res, errs := make([]domain.BeatResult, len(beats)), make([]error, len(beats))
	var wg sync.WaitGroup
	for i, beat := range beats {
		wg.Go(func() { res[i], errs[i] = b.submit(context.Background(), beat) })
	}
	testutil.Eventually(t, 10*time.Second, "every heartbeat to be pending", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.pending) == len(beats)
	})
	b.flush()
	wg.Wait()
	return res, errs
}

func TestHeartbeatBatcherWritesManySessionsInOneStatement(t *testing.T) {
	s := testenv.Store(t)
	beats := sessionNodes(t, s, 50)
	stale := beats[7]
	stale.Epoch += 3 // a superseded session's heartbeat
	all := append(append([]domain.Beat(nil), beats...), stale)
	w := &countingWriter{next: beatConnOf(t, s).write}
	res, errs := submitAll(t, w.write, all)
	if got := w.sizes(); len(got) != 1 || got[0] != len(all) {
		t.Fatalf("writes %v, want one of %d heartbeats", got, len(all))
	}
	for i := range all {
		if errs[i] != nil {
			t.Fatalf("heartbeat %d: %v", i, errs[i])
		}
		if want := i < len(beats); res[i].Recorded != want {
			t.Errorf("heartbeat %d: recorded %v, want %v", i, res[i].Recorded, want)
		}
	}
	for _, b := range beats {
		if !renewed(t, s, b.NodeID) {
			t.Errorf("node %s: lease not renewed", b.NodeID)
		}
	}
}

func TestHeartbeatBatcherRetriesAFailedWrite(t *testing.T) {
	s := testenv.Store(t)
	beats := sessionNodes(t, s, 10)
	w := &countingWriter{failFirst: 1, next: beatConnOf(t, s).write}
	res, errs := submitAll(t, w.write, beats)
	if got := w.sizes(); len(got) != 2 || got[0] != len(beats) || got[1] != len(beats) {
		t.Fatalf("writes %v, want the batch of %d twice", got, len(beats))
	}
	for i, b := range beats {
		if errs[i] != nil || !res[i].Recorded || !renewed(t, s, b.NodeID) {
			t.Errorf("heartbeat %d: %+v, %v; want recorded", i, res[i], errs[i])
		}
	}
}

func TestHeartbeatBatcherReportsAWriteThatKeepsFailing(t *testing.T) {
	s := testenv.Store(t)
	beats := sessionNodes(t, s, 10)
	w := &countingWriter{failFirst: -1, next: beatConnOf(t, s).write}
	res, errs := submitAll(t, w.write, beats)
	if got := w.sizes(); len(got) != heartbeatWriteAttempts {
		t.Fatalf("writes %v, want %d attempts", got, heartbeatWriteAttempts)
	}
	for i, b := range beats {
		if !errors.Is(errs[i], errHeartbeatNotRecorded) || res[i].Recorded {
			t.Errorf("heartbeat %d: %+v, %v; want errHeartbeatNotRecorded", i, res[i], errs[i])
		}
		if renewed(t, s, b.NodeID) {
			t.Errorf("node %s: lease renewed by a failed write", b.NodeID)
		}
	}
}

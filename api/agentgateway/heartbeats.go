package agentgateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/nodes"
)

// Heartbeat batching (docs/agent-heartbeats.md): the sessions of a process
// hand their heartbeats to one batcher, which records all that arrived in
// an interval in one statement (store/nodes.RecordHeartbeats). A session
// waits for its heartbeat's outcome, so a heartbeat is handled (and
// counted in bc_agent_heartbeat_seconds) only once its lease renewal is
// committed.

// Defaults and limits of the batcher.
const (
	// DefaultHeartbeatFlush is how long a heartbeat waits for others to
	// join its batch.
	DefaultHeartbeatFlush = 250 * time.Millisecond
	// heartbeatBatchMax bounds one statement's rows; a flush with more
	// writes several.
	heartbeatBatchMax = 5000
	// heartbeatWriteTimeout bounds one batch write, retries included.
	heartbeatWriteTimeout = 10 * time.Second
	// heartbeatWriteAttempts is how often a failed batch is written
	// before each of its heartbeats is answered with the error.
	heartbeatWriteAttempts = 3
)

// errHeartbeatNotRecorded wraps a batch write's failure, as each of its
// sessions sees it.
var errHeartbeatNotRecorded = errors.New("the heartbeat was not recorded")

// beatWriter records one batch; the gateway's is beatConn.write.
type beatWriter func(ctx context.Context, beats []domain.Beat) ([]domain.BeatResult, error)

type pendingBeat struct {
	beat domain.Beat
	done chan beatOutcome // buffered: the batcher never waits for a session
}

type beatOutcome struct {
	res domain.BeatResult
	err error
}

// heartbeatBatcher collects heartbeats and writes them a flush interval
// after the first of a batch arrived, one batch at a time.
type heartbeatBatcher struct {
	every time.Duration
	write beatWriter
	log   *slog.Logger

	mu      sync.Mutex
	pending []*pendingBeat
	armed   bool // a flush is scheduled for pending
	// writing serializes the writes: one statement in flight per process.
	writing sync.Mutex
}

func newHeartbeatBatcher(every time.Duration, write beatWriter, log *slog.Logger) *heartbeatBatcher {
	return &heartbeatBatcher{every: every, write: write, log: log}
}

// beatConn is the batcher's own database connection. Heartbeats do not
// share the pool: while thousands of sessions start, their hellos and
// first deliveries can hold every pooled connection for seconds, and a
// batch waiting behind them would let leases lapse. The connection is
// opened on the first write, dropped after a failed one (the retry opens
// another) and closed when the process holds no session (close).
type beatConn struct {
	config *pgx.ConnConfig
	lease  time.Duration
	mu     sync.Mutex
	conn   *pgx.Conn
}

func newBeatConn(config *pgx.ConnConfig, lease time.Duration) *beatConn {
	return &beatConn{config: config, lease: lease}
}

// write records one batch in one transaction, without waiting for the WAL
// flush (a heartbeat is soft state).
func (c *beatConn) write(ctx context.Context, beats []domain.Beat) (out []domain.BeatResult, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		if c.conn, err = pgx.ConnectConfig(ctx, c.config.Copy()); err != nil {
			return nil, fmt.Errorf("heartbeat connection: %w", err)
		}
	}
	err = pgx.BeginTxFunc(ctx, c.conn, store.ReadWrite, func(tx pgx.Tx) (err error) {
		if err := domain.HeartbeatTx(ctx, tx); err != nil {
			return err
		}
		out, err = domain.RecordHeartbeats(ctx, tx, c.lease, beats)
		return err
	})
	if err != nil {
		c.closeLocked()
	}
	return out, err
}

func (c *beatConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeLocked()
}

func (c *beatConn) closeLocked() {
	if c.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.conn.Close(ctx)
	c.conn = nil
}

// submit hands a heartbeat to the next batch and waits for its outcome.
// An error wrapping errHeartbeatNotRecorded means the write failed (after
// retries) and nothing is known to be recorded; ctx ending stops the wait,
// not the write.
func (b *heartbeatBatcher) submit(ctx context.Context, beat domain.Beat) (domain.BeatResult, error) {
	p := &pendingBeat{beat: beat, done: make(chan beatOutcome, 1)}
	b.mu.Lock()
	b.pending = append(b.pending, p)
	if !b.armed {
		b.armed = true
		time.AfterFunc(b.every, b.flush)
	}
	b.mu.Unlock()
	select {
	case o := <-p.done:
		return o.res, o.err
	case <-ctx.Done():
		return domain.BeatResult{}, context.Cause(ctx)
	}
}

// flush writes what is pending, in statements of at most
// heartbeatBatchMax rows, and answers each heartbeat.
func (b *heartbeatBatcher) flush() {
	b.writing.Lock()
	defer b.writing.Unlock()
	b.mu.Lock()
	batch := b.pending
	b.pending, b.armed = nil, false
	b.mu.Unlock()
	for len(batch) > 0 {
		n := min(len(batch), heartbeatBatchMax)
		b.writeBatch(batch[:n])
		batch = batch[n:]
	}
}

func (b *heartbeatBatcher) writeBatch(batch []*pendingBeat) {
	beats := make([]domain.Beat, len(batch))
	for i, p := range batch {
		beats[i] = p.beat
	}
	ctx, cancel := context.WithTimeout(context.Background(), heartbeatWriteTimeout)
	defer cancel()
	var res []domain.BeatResult
	var err error
	for attempt := 1; attempt <= heartbeatWriteAttempts; attempt++ {
		if res, err = b.write(ctx, beats); err == nil && len(res) != len(beats) {
			err = fmt.Errorf("%d results for %d heartbeats", len(res), len(beats))
		}
		if err == nil || ctx.Err() != nil {
			break
		}
		b.log.Warn("agent heartbeats: batch write failed; retrying", "heartbeats", len(beats), "attempt", attempt, "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
	if err != nil {
		b.log.Error("agent heartbeats: batch not recorded", "heartbeats", len(beats), "error", err)
		err = fmt.Errorf("%w: %w", errHeartbeatNotRecorded, err)
		for _, p := range batch {
			p.done <- beatOutcome{err: err}
		}
		return
	}
	for i, p := range batch {
		p.done <- beatOutcome{res: res[i]}
	}
}

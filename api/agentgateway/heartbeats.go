package agentgateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

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
	DefaultHeartbeatFlush = 500 * time.Millisecond
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

// beatWriter records one batch; the default is recordBeats.
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

// recordBeats is the batcher's writer over the store: one transaction,
// without waiting for the WAL flush (a heartbeat is soft state).
func recordBeats(s *store.Store, lease time.Duration) beatWriter {
	return func(ctx context.Context, beats []domain.Beat) (out []domain.BeatResult, err error) {
		err = s.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
			if err := domain.HeartbeatTx(ctx, tx); err != nil {
				return err
			}
			out, err = domain.RecordHeartbeats(ctx, tx, lease, beats)
			return err
		})
		return out, err
	}
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

package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// readBegin starts a Read's transaction.
const readBegin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

// Batch is a read's statements, queued with their scan callbacks before any
// of them runs: b.Queue(sql, args...).QueryRow(scan) or .Query(each).
type Batch = pgx.Batch

// Read runs the statements queue puts in a batch in one read-only
// transaction sent as one pipeline: BEGIN (repeatable read, read only),
// the statements and COMMIT reach the database together, so the read costs
// one round trip where InTx costs two more. Repeatable read gives every
// statement of the read one snapshot: two rows a writer changes in one
// transaction are never read half before and half after its commit. The
// statements cannot depend on each other's results (a read that needs that
// uses InTx). The callbacks run in order
// once the answers arrive; the first error (a statement's, or one a
// callback returns) is Read's.
func (s *Store) Read(ctx context.Context, queue func(b *Batch)) (err error) {
	b := &pgx.Batch{}
	b.Queue(readBegin)
	queue(b)
	b.Queue("COMMIT")
	conn, err := s.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("store: read: %w", err)
	}
	defer conn.Release()
	err = conn.SendBatch(ctx, b).Close()
	// A statement that failed leaves the transaction aborted (the rest of
	// the pipeline was skipped up to its end): roll it back here, so the
	// connection goes back to the pool idle instead of being closed.
	if pg := conn.Conn().PgConn(); !pg.IsClosed() && pg.TxStatus() != 'I' {
		if _, rbErr := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) {
			err = errors.Join(err, rbErr)
		}
	}
	return err
}

// QueueRow queues in b a statement that reads one row, read by scan (whose
// error, NOT_FOUND for no row, is the read's); the answer is valid once b
// has run.
func QueueRow[T any](b *Batch, scan func(pgx.Row) (T, error), sql string, args ...any) func() (T, error) {
	var v T
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) (err error) {
		v, err = scan(row)
		return err
	})
	return func() (T, error) { return v, nil }
}

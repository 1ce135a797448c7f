// Package store holds the PostgreSQL side of Better Compute: the connection
// pool, transactions and the schema migrations.
package store

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Store is the database handle every repository works through.
type Store struct {
	Pool *pgxpool.Pool
}

// Open connects to url and checks the connection.
func Open(ctx context.Context, url string, opts ...func(*pgxpool.Config)) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("store: bad database url: %w", err)
	}
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns()
	}
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: connect: %w", err)
	}
	return &Store{Pool: pool}, nil
}

// DefaultMaxConns is the pool's size when the URL names no pool_max_conns:
// pgx's own default (one connection per core, at least four) leaves calls
// queueing for a connection while others wait on a row lock or a commit's
// flush, which costs no CPU; four per core (at least sixteen) is still far below the
// clusters' max_connections once Temporal's pools are counted.
func DefaultMaxConns() int32 { return int32(max(16, 4*runtime.NumCPU())) }

// Close releases every connection.
func (s *Store) Close() { s.Pool.Close() }

// Ping checks that the database answers a query.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	return s.Pool.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// InTx runs fn in one transaction, committed when fn returns nil and rolled
// back otherwise (a panic included).
func (s *Store) InTx(ctx context.Context, opts pgx.TxOptions, fn func(Tx) error) (err error) {
	tx, err := s.Pool.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			panic(p)
		}
		if err != nil {
			if rbErr := tx.Rollback(context.WithoutCancel(ctx)); rbErr != nil && !errors.Is(rbErr, pgx.ErrTxClosed) {
				err = errors.Join(err, rbErr)
			}
		}
	}()
	if err = fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Tx is a transaction, as handlers and repositories see it.
type Tx = pgx.Tx

// Transaction modes: reads run read-only, everything else read-write.
var (
	ReadOnly  = pgx.TxOptions{AccessMode: pgx.ReadOnly}
	ReadWrite = pgx.TxOptions{AccessMode: pgx.ReadWrite}
)

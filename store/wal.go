package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// LSN is a PostgreSQL WAL position; positions compare as numbers. Its text
// form is PostgreSQL's: two hexadecimal halves, "16/B374D848".
type LSN uint64

// ParseLSN reads PostgreSQL's text form of an LSN.
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("store: bad LSN %q", s)
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("store: bad LSN %q", s)
	}
	return LSN(h<<32 | l), nil
}

func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// MarshalText and UnmarshalText carry an LSN in JSON as its text form.
func (l LSN) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

func (l *LSN) UnmarshalText(b []byte) error {
	v, err := ParseLSN(string(b))
	*l = v
	return err
}

// WALPosition is how far this database's data goes: on a streaming replica
// the position it has replayed, on a primary the position it has flushed —
// past every transaction that committed synchronously (a replica can only
// ever receive flushed WAL, so a position beyond it might never be reached).
// Callers that compare positions commit synchronously (SyncCommit).
func (s *Store) WALPosition(ctx context.Context) (LSN, error) {
	var text string
	// COALESCE evaluates lazily: a replica never runs the primary's function,
	// which would fail there.
	err := s.Pool.QueryRow(ctx, `SELECT COALESCE(pg_last_wal_replay_lsn(), pg_current_wal_flush_lsn())::text`).Scan(&text)
	if err != nil {
		return 0, fmt.Errorf("store: WAL position: %w", err)
	}
	return ParseLSN(text)
}

// SyncCommit makes tx commit synchronously whatever the server's default:
// when it returns, its commit record is flushed, so WALPosition read after
// it covers it.
func SyncCommit(ctx context.Context, tx Tx) error {
	_, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`)
	return err
}

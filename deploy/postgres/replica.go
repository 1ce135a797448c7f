package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/store"
)

// ReplicaOptions says where a streaming replica lives and how it listens. It
// listens on its primary's host and has its primary's superuser.
type ReplicaOptions struct {
	// DataDir receives the base backup. It must be missing or empty, or hold
	// a replica an earlier StartReplica made, which then restarts and resumes
	// streaming.
	DataDir string
	// Port to listen on; 0 picks a free port.
	Port int
	// Settings are extra postgresql.conf settings on top of the primary's
	// Settings, which the replica inherits: a hot standby refuses to start
	// with, say, fewer max_connections than its primary.
	Settings map[string]string
}

// StartReplica makes a streaming replica of c, a hot standby that serves
// read-only queries, with c's superuser and password (and pg_hba.conf): it
// takes a base backup of c with pg_basebackup (through c's unix socket, with
// the password; the defaults wal_level=replica and max_wal_senders=10
// suffice) and
// starts it like Start does: a child process that dies with its parent,
// stopped by Stop. The replica uses no replication slot, so one that is
// stopped for long may fall too far behind to resume.
func (c *Cluster) StartReplica(ctx context.Context, o ReplicaOptions) (*Cluster, error) {
	settings := make(map[string]string, len(c.opts.Settings)+len(o.Settings))
	for k, v := range c.opts.Settings {
		settings[k] = v
	}
	for k, v := range o.Settings {
		settings[k] = v
	}
	r, err := prepare(ctx, Options{
		DataDir:  o.DataDir,
		Host:     c.opts.Host,
		Port:     o.Port,
		User:     c.opts.User,
		Password: c.opts.Password,
		Settings: settings,
	}, c.bindir)
	if err != nil {
		return nil, err
	}
	_, err = os.Stat(filepath.Join(r.opts.DataDir, "PG_VERSION"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := r.baseBackup(ctx, c); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	default:
		if _, err := os.Stat(filepath.Join(r.opts.DataDir, "standby.signal")); err != nil {
			return nil, fmt.Errorf("postgres: %s holds a cluster that is not a replica", r.opts.DataDir)
		}
	}
	if err := r.takeOver(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// baseBackup copies primary into r's data directory and writes the standby
// configuration (-R: standby.signal and primary_conninfo).
func (r *Cluster) baseBackup(ctx context.Context, primary *Cluster) error {
	cmd := r.command(ctx, filepath.Join(r.bindir, "pg_basebackup"),
		"-D", r.opts.DataDir, "-R", "-X", "stream",
		"-h", primary.opts.SocketDir, "-p", strconv.Itoa(primary.opts.Port), "-U", primary.opts.User,
		"--checkpoint=fast", "--no-sync", "--no-password")
	// -R writes the password it connected with into primary_conninfo
	// (postgresql.auto.conf, private to the server's OS user), which the
	// replica's stream then uses.
	cmd.Env = append(cmd.Env, "PGPASSWORD="+primary.opts.Password)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("postgres: pg_basebackup failed: %w\n%s", err, out)
	}
	return nil
}

// LSN is a position in the write-ahead log (store.LSN: PostgreSQL's text
// form, numeric comparison).
type LSN = store.LSN

// CurrentLSN is a primary's WAL write position (pg_current_wal_lsn): what a
// replica can receive. A commit made with synchronous_commit=off may reach it
// only when the WAL writer next runs (wal_writer_delay, 200ms by default).
func (c *Cluster) CurrentLSN(ctx context.Context) (LSN, error) {
	return c.lsn(ctx, "pg_current_wal_lsn()")
}

// ReplayLSN is the last WAL position a replica has replayed
// (pg_last_wal_replay_lsn): what its queries see.
func (c *Cluster) ReplayLSN(ctx context.Context) (LSN, error) {
	return c.lsn(ctx, "pg_last_wal_replay_lsn()")
}

// ReceiveLSN is the last WAL position a replica has received and flushed
// (pg_last_wal_receive_lsn), replayed or not.
func (c *Cluster) ReceiveLSN(ctx context.Context) (LSN, error) {
	return c.lsn(ctx, "pg_last_wal_receive_lsn()")
}

func (c *Cluster) lsn(ctx context.Context, fn string) (LSN, error) {
	var s *string
	if err := c.queryRow(ctx, "SELECT "+fn+"::text", &s); err != nil {
		return 0, err
	}
	if s == nil {
		return 0, fmt.Errorf("postgres: %s is null: the server is not a replica", fn)
	}
	return store.ParseLSN(*s)
}

// IsReplica reports whether the server is in recovery, that is, a standby.
func (c *Cluster) IsReplica(ctx context.Context) (bool, error) {
	var b bool
	err := c.queryRow(ctx, "SELECT pg_is_in_recovery()", &b)
	return b, err
}

// PauseReplay stops a replica applying WAL (it keeps receiving it) and waits,
// up to a minute, until replay has actually paused, so ReplayLSN holds still
// from its return. Replay stays paused until ResumeReplay, also across the
// replica's clients.
func (c *Cluster) PauseReplay(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_wal_replay_pause()"); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var state string
		err := conn.QueryRow(ctx, "SELECT pg_get_wal_replay_pause_state()").Scan(&state)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42883" {
			return nil // before PostgreSQL 14: the pause is requested, not confirmed
		}
		if err != nil || state == "paused" {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres: replay pause still %q after a minute", state)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// ResumeReplay lets a paused replica apply WAL again.
func (c *Cluster) ResumeReplay(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SELECT pg_wal_replay_resume()")
	return err
}

func (c *Cluster) queryRow(ctx context.Context, sql string, dest any) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dest)
}

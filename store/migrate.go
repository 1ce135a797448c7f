package store

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/better-compute/better-compute/migrations"
)

// Migrator applies the embedded migrations to one database. A PostgreSQL
// session lock serialises concurrent migrators (several replicas starting).
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
}

// NewMigrator opens a migrator on the database at url.
func NewMigrator(url string) (*Migrator, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("store: bad database url: %w", err)
	}
	db := stdlib.OpenDB(*cfg)
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		db.Close()
		return nil, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, goose.WithSessionLocker(locker))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("store: migrations: %w", err)
	}
	return &Migrator{db: db, provider: p}, nil
}

// Close releases the migrator's connection.
func (m *Migrator) Close() error { return m.db.Close() }

// Up applies every pending migration and returns how many it applied.
func (m *Migrator) Up(ctx context.Context) (int, error) {
	res, err := m.provider.Up(ctx)
	if err != nil {
		return len(res), fmt.Errorf("store: migrate up: %w", err)
	}
	return len(res), nil
}

// Down rolls back the newest applied migration.
func (m *Migrator) Down(ctx context.Context) error {
	if _, err := m.provider.Down(ctx); err != nil {
		return fmt.Errorf("store: migrate down: %w", err)
	}
	return nil
}

// Version is the newest applied migration (0 when none).
func (m *Migrator) Version(ctx context.Context) (int64, error) {
	return m.provider.GetDBVersion(ctx)
}

// WriteStatus prints one line per migration: version, state, applied at, file.
func (m *Migrator) WriteStatus(ctx context.Context, w io.Writer) error {
	status, err := m.provider.Status(ctx)
	if err != nil {
		return fmt.Errorf("store: migrate status: %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tSTATE\tAPPLIED AT\tFILE")
	for _, s := range status {
		applied := "-"
		if !s.AppliedAt.IsZero() {
			applied = s.AppliedAt.UTC().Format("2006-01-02 15:04:05Z")
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Source.Version, s.State, applied, s.Source.Path)
	}
	return tw.Flush()
}

// MigrateUp is Up on a fresh migrator: what start-up and tests call.
func MigrateUp(ctx context.Context, url string) error {
	m, err := NewMigrator(url)
	if err != nil {
		return err
	}
	defer m.Close()
	_, err = m.Up(ctx)
	return err
}

// Latest is the newest migration this binary carries.
func (m *Migrator) Latest() (int64, error) {
	sources := m.provider.ListSources()
	if len(sources) == 0 {
		return 0, nil
	}
	return sources[len(sources)-1].Version, nil
}

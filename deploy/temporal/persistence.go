package temporal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/metrics"
	"go.temporal.io/server/common/persistence/sql"
	"go.temporal.io/server/common/persistence/sql/sqlplugin"
	"go.temporal.io/server/common/persistence/sql/sqlplugin/postgresql"
	"go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/resolver"
	pgschema "go.temporal.io/server/schema/postgresql/v12"
	sqliteschema "go.temporal.io/server/schema/sqlite"
	schematool "go.temporal.io/server/tools/common/schema"
)

// PostgresStore points at an existing PostgreSQL server that holds Temporal's
// data. The two databases are created when missing (through the "postgres"
// maintenance database, so the user needs CREATEDB for that first start) and
// their schemas are installed or upgraded from the schema embedded in the
// server module.
type PostgresStore struct {
	Host     string // default "127.0.0.1"
	Port     int    // default 5432
	User     string // default "postgres"
	Password string // may be empty (trust or peer authentication)

	Database           string // default "temporal"
	VisibilityDatabase string // default "temporal_visibility"

	// SSLMode is passed to the driver as sslmode ("disable", "require", ...);
	// empty keeps the driver's default ("prefer").
	SSLMode string
}

const (
	// The temporal-sql-tool names of the embedded schema directories.
	pgMainSchema       = "postgresql/v12/temporal"
	pgVisibilitySchema = "postgresql/v12/visibility"

	// Connection pool sizes per service and store. Four services each open a
	// pool to both databases, so keep well under PostgreSQL's default
	// max_connections of 100.
	pgMainMaxConns       = 10
	pgVisibilityMaxConns = 4
)

func (p PostgresStore) withDefaults() PostgresStore {
	if p.Host == "" {
		p.Host = "127.0.0.1"
	}
	if p.Port == 0 {
		p.Port = 5432
	}
	if p.User == "" {
		p.User = "postgres"
	}
	if p.Database == "" {
		p.Database = "temporal"
	}
	if p.VisibilityDatabase == "" {
		p.VisibilityDatabase = "temporal_visibility"
	}
	return p
}

func (p PostgresStore) addr() string {
	return net.JoinHostPort(p.Host, strconv.Itoa(p.Port))
}

// sqlConfig is the server's view of one of the two databases.
func (p PostgresStore) sqlConfig(database string, maxConns int) *config.SQL {
	c := &config.SQL{
		PluginName:      postgresql.PluginNamePGX,
		DatabaseName:    database,
		ConnectAddr:     p.addr(),
		ConnectProtocol: "tcp",
		User:            p.User,
		Password:        p.Password,
		MaxConns:        maxConns,
		MaxIdleConns:    maxConns,
		MaxConnLifetime: time.Hour,
	}
	if p.SSLMode != "" {
		c.ConnectAttributes = map[string]string{"sslmode": p.SSLMode}
	}
	return c
}

// prepare creates the databases if needed and brings both schemas to the
// version this server expects. It returns the two data store configs.
func (p PostgresStore) prepare(ctx context.Context, logger log.Logger) (main, visibility *config.SQL, err error) {
	if err := p.createDatabases(ctx); err != nil {
		return nil, nil, err
	}
	main = p.sqlConfig(p.Database, pgMainMaxConns)
	if err := ensureSchema(main, pgMainSchema, pgschema.Version, logger); err != nil {
		return nil, nil, err
	}
	visibility = p.sqlConfig(p.VisibilityDatabase, pgVisibilityMaxConns)
	if err := ensureSchema(visibility, pgVisibilitySchema, pgschema.VisibilityVersion, logger); err != nil {
		return nil, nil, err
	}
	return main, visibility, nil
}

func (p PostgresStore) createDatabases(ctx context.Context) error {
	u := url.URL{
		Scheme: "postgres",
		User:   url.UserPassword(p.User, p.Password),
		Host:   p.addr(),
		Path:   "/postgres",
	}
	if p.SSLMode != "" {
		u.RawQuery = url.Values{"sslmode": {p.SSLMode}}.Encode()
	}
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return fmt.Errorf("connect to postgres maintenance database at %s: %w", p.addr(), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	for _, name := range []string{p.Database, p.VisibilityDatabase} {
		var exists bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists)
		if err != nil {
			return fmt.Errorf("look up database %q: %w", name, err)
		}
		if exists {
			continue
		}
		_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: created concurrently
			err = nil
		}
		if err != nil {
			return fmt.Errorf("create database %q: %w", name, err)
		}
	}
	return nil
}

// ensureSchema does what `temporal-sql-tool setup-schema -v 0.0` followed by
// `update-schema -d <versioned dir>` do, skipping both when the database is
// already at the wanted version.
func ensureSchema(cfg *config.SQL, schemaName, want string, logger log.Logger) error {
	db, err := sql.NewSQLAdminDB(sqlplugin.DbKindUnknown, cfg, resolver.NewNoopResolver(), logger, metrics.NoopMetricsHandler)
	if err != nil {
		return fmt.Errorf("open database %q for schema setup: %w", cfg.DatabaseName, err)
	}
	defer func() { _ = db.Close() }()
	tool := schemaDB{db: db, name: cfg.DatabaseName}

	current, err := db.ReadSchemaVersion(cfg.DatabaseName)
	if err != nil {
		// No version table (or no row) yet: a fresh database.
		setup := schematool.NewSetupSchemaTask(tool, &schematool.SetupConfig{InitialVersion: "0.0"}, logger)
		if err := setup.Run(); err != nil {
			return fmt.Errorf("set up schema version tables in %q: %w", cfg.DatabaseName, err)
		}
		current = "0.0"
	}
	if current == want {
		return nil
	}
	update := schematool.NewUpdateSchemaTask(tool, &schematool.UpdateConfig{
		DBName:     cfg.DatabaseName,
		SchemaName: schemaName,
	}, logger)
	if err := update.Run(); err != nil {
		return fmt.Errorf("update schema of %q from version %s: %w", cfg.DatabaseName, current, err)
	}
	return nil
}

// schemaDB adapts the server's admin connection to the schema tool's DB
// interface (the same thing tools/sql.Connection does, minus its panic on
// Close errors).
type schemaDB struct {
	db   sqlplugin.AdminDB
	name string
}

var _ schematool.DB = schemaDB{}

func (s schemaDB) Exec(stmt string, args ...any) error { return s.db.Exec(stmt, args...) }
func (s schemaDB) CreateSchemaVersionTables() error    { return s.db.CreateSchemaVersionTables() }
func (s schemaDB) ReadSchemaVersion() (string, error)  { return s.db.ReadSchemaVersion(s.name) }
func (s schemaDB) Close()                              { _ = s.db.Close() }
func (s schemaDB) Type() string                        { return "sql" }

func (s schemaDB) UpdateSchemaVersion(newVersion, minCompatibleVersion string) error {
	return s.db.UpdateSchemaVersion(s.name, newVersion, minCompatibleVersion)
}

func (s schemaDB) WriteSchemaUpdateLog(oldVersion, newVersion, manifestMD5, desc string) error {
	return s.db.WriteSchemaUpdateLog(oldVersion, newVersion, manifestMD5, desc)
}

func (s schemaDB) DropAllTables() error {
	tables, err := s.db.ListTables(s.name)
	if err != nil {
		return err
	}
	for _, t := range tables {
		if err := s.db.DropTable(t); err != nil {
			return err
		}
	}
	return nil
}

// sqliteConfig returns the single SQLite store used for both execution and
// visibility data. An empty file means a private in-memory database.
func sqliteConfig(file string) (*config.SQL, error) {
	if file == "" {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("name in-memory sqlite database: %w", err)
		}
		// The plugin installs the schema itself for in-memory databases.
		// The name must be unique in the process: in-memory databases with
		// the same name are shared.
		return &config.SQL{
			PluginName:        sqlite.PluginName,
			DatabaseName:      "temporal-" + hex.EncodeToString(b[:]),
			ConnectAttributes: map[string]string{"mode": "memory", "cache": "shared"},
		}, nil
	}
	// WAL with synchronous=NORMAL survives a crash of this process but may
	// lose the last commits on power loss; fine for dev data, and about 2x
	// the throughput of SQLite's default rollback journal.
	c := &config.SQL{
		PluginName:   sqlite.PluginName,
		DatabaseName: file,
		ConnectAttributes: map[string]string{
			"mode":         "rwc",
			"journal_mode": "wal",
			"synchronous":  "normal",
		},
	}
	fi, err := os.Stat(file)
	switch {
	case errors.Is(err, os.ErrNotExist) || (err == nil && fi.Size() == 0):
		if err := sqliteschema.SetupSchema(c); err != nil {
			return nil, fmt.Errorf("set up sqlite schema in %s: %w", file, err)
		}
	case err != nil:
		return nil, fmt.Errorf("stat sqlite file: %w", err)
	}
	return c, nil
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/deploy/temporal"
)

// temporalOptions are the flags of `better-compute temporal`.
type temporalOptions struct {
	address            string
	ui                 string
	namespaces         []string
	retention          time.Duration
	postgresURL        string
	visibilityDatabase string
	sqliteFile         string
	historyShards      int32
	logLevel           string
}

// temporalCmd runs the embedded Temporal server on its own, as `temporal
// server start-dev` does, so that API replicas and workers in other
// processes (or on other machines) can share one Temporal without a
// Temporal cluster to install.
func temporalCmd() *cobra.Command {
	var o temporalOptions
	cmd := &cobra.Command{
		Use:   "temporal",
		Short: "Run the embedded Temporal server alone (frontend, history, matching, worker; optional web UI)",
		Long: `Run the embedded Temporal server alone, as "temporal server start-dev" does.

Persistence is PostgreSQL with --postgres-url (or BC_TEMPORAL_POSTGRES_URL): the
server creates the database named in the URL and its visibility database when
missing (the user needs CREATEDB on that first start) and installs or upgrades
their schemas. Without it, --sqlite-file keeps the data in a SQLite file, and
with neither the data lives in memory and is gone when the process ends.

The namespaces are registered when missing. Once the server answers, the
addresses are printed on stdout, one "name value" pair a line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTemporal(cmd.Context(), cmd, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.address, "address", "127.0.0.1:7233", "frontend gRPC address (IP literal or localhost, and a port; port 0 picks a free one)")
	f.StringVar(&o.ui, "ui", "", `Temporal web UI address, e.g. 127.0.0.1:8233 (empty: no UI)`)
	f.StringSliceVar(&o.namespaces, "namespace", []string{"default", devstack.Namespace}, "namespaces to register (repeat or comma-separate)")
	f.DurationVar(&o.retention, "retention", 7*24*time.Hour, "retention of newly registered namespaces")
	f.StringVar(&o.postgresURL, "postgres-url", "", "PostgreSQL URL of Temporal's database, e.g. postgres://temporal:pw@db:5432/temporal?sslmode=require (env BC_TEMPORAL_POSTGRES_URL)")
	f.StringVar(&o.visibilityDatabase, "visibility-database", "", `the visibility database on the same server (default: the URL's database + "_visibility")`)
	f.StringVar(&o.sqliteFile, "sqlite-file", "", "SQLite file for the data when no --postgres-url is given (empty: in memory)")
	f.Int32Var(&o.historyShards, "history-shards", 4, "history shards; fixed by the first start of a database")
	f.StringVar(&o.logLevel, "log-level", "warn", "the server's log level: debug, info, warn or error")
	return cmd
}

func runTemporal(ctx context.Context, cmd *cobra.Command, o temporalOptions) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(strings.ToUpper(o.logLevel))); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)
	}
	if !cmd.Flags().Changed("postgres-url") {
		o.postgresURL = os.Getenv("BC_TEMPORAL_POSTGRES_URL")
	}
	opts := temporal.Options{
		FrontendAddr:       o.address,
		UIAddr:             o.ui,
		Namespaces:         o.namespaces,
		NamespaceRetention: o.retention,
		SQLiteFile:         o.sqliteFile,
		HistoryShards:      o.historyShards,
		Logger:             slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		LogLevel:           level,
	}
	if o.postgresURL != "" {
		if o.sqliteFile != "" {
			return fmt.Errorf("--postgres-url and --sqlite-file exclude each other")
		}
		pg, err := postgresStore(o.postgresURL, o.visibilityDatabase)
		if err != nil {
			return err
		}
		opts.Postgres = &pg
	}
	srv, err := temporal.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer srv.Stop()
	fmt.Printf("frontend %s\nhttp %s\n", srv.FrontendAddr(), srv.FrontendHTTPAddr())
	if srv.UIURL() != "" {
		fmt.Printf("ui %s\n", srv.UIURL())
	}
	fmt.Printf("namespaces %s\n", strings.Join(o.namespaces, ","))
	<-ctx.Done()
	return nil
}

// postgresStore reads Temporal's PostgreSQL settings from a connection URL
// (or key=value string) as libpq reads it, defaults and PG* variables
// included. Without a database in it, the database is "temporal".
func postgresStore(rawURL, visibilityDatabase string) (temporal.PostgresStore, error) {
	c, err := pgconn.ParseConfig(rawURL)
	if err != nil {
		return temporal.PostgresStore{}, fmt.Errorf("--postgres-url: %w", err)
	}
	if c.Database == "" {
		c.Database = "temporal"
	}
	if visibilityDatabase == "" {
		visibilityDatabase = c.Database + "_visibility"
	}
	pg := temporal.PostgresStore{Host: c.Host, Port: int(c.Port), User: c.User, Password: c.Password,
		Database: c.Database, VisibilityDatabase: visibilityDatabase}
	// The server's driver takes sslmode alone: "disable" when the URL asks
	// for no TLS, else what the URL says (the driver's default: prefer).
	if c.TLSConfig == nil {
		pg.SSLMode = "disable"
	} else if u, err := url.Parse(rawURL); err == nil {
		pg.SSLMode = u.Query().Get("sslmode")
	}
	return pg, nil
}

package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/internal/buildinfo"
	"github.com/better-compute/better-compute/store"
)

func migrateCmd() *cobra.Command {
	var cfg config
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, roll back or show the database schema migrations",
	}
	cfg.bind(cmd.PersistentFlags(), false)
	run := func(fn func(cmd *cobra.Command, m *store.Migrator) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, _ []string) error {
			if err := cfg.load(cmd, false); err != nil {
				return err
			}
			m, err := store.NewMigrator(cfg.DatabaseURL)
			if err != nil {
				return err
			}
			defer m.Close()
			return fn(cmd, m)
		}
	}
	cmd.AddCommand(
		&cobra.Command{Use: "up", Short: "Apply every pending migration", Args: cobra.NoArgs,
			RunE: run(func(cmd *cobra.Command, m *store.Migrator) error {
				n, err := m.Up(cmd.Context())
				if err != nil {
					return err
				}
				v, err := m.Version(cmd.Context())
				fmt.Fprintf(os.Stdout, "applied %d migration(s); schema version %d\n", n, v)
				return err
			})},
		&cobra.Command{Use: "down", Short: "Roll back the newest migration", Args: cobra.NoArgs,
			RunE: run(func(cmd *cobra.Command, m *store.Migrator) error {
				if err := m.Down(cmd.Context()); err != nil {
					return err
				}
				v, err := m.Version(cmd.Context())
				fmt.Fprintf(os.Stdout, "rolled back one migration; schema version %d\n", v)
				return err
			})},
		&cobra.Command{Use: "status", Short: "List the migrations and whether each is applied", Args: cobra.NoArgs,
			RunE: run(func(cmd *cobra.Command, m *store.Migrator) error {
				return m.WriteStatus(cmd.Context(), os.Stdout)
			})},
	)
	return cmd
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(*cobra.Command, []string) {
			i := buildinfo.Get()
			fmt.Printf("better-compute %s (commit %s, %s)\n", i.Version, i.Commit, i.GoVersion)
		},
	}
}

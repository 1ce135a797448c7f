package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/controlplane"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/workers"
)

// doctorCmd checks configuration and health, naming each finding by its
// code (catalog.undeclared, catalog.unused, database, migrations, temporal,
// temporal.searchAttributes).
// It exits non-zero when a check fails; warnings alone do not fail it.
func doctorCmd() *cobra.Command {
	var cfg config
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the configuration, the catalog and registry, the database and Temporal",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			failed := 0
			report := func(level, code, msg string) {
				fmt.Printf("%-5s %-20s %s\n", level, code, msg)
				if level == "FAIL" {
					failed++
				}
			}
			catalog, err := core.DefaultCatalog()
			if err != nil {
				report("FAIL", "catalog", err.Error())
				return fmt.Errorf("%d check(s) failed", failed)
			}
			registry, err := api.BuildRegistry(api.Domains)
			if err == nil {
				var warnings []core.Warning
				if warnings, err = core.CheckRegistry(catalog, registry); err == nil {
					for _, w := range warnings {
						report("WARN", w.Code, w.Subject+": "+w.Message)
					}
					report("OK", "registry", fmt.Sprintf("%d methods match the catalog", registry.Len()))
				}
			}
			if err != nil {
				report("FAIL", "registry", err.Error())
			}
			if err := cfg.load(cmd, false); err != nil {
				report("FAIL", "config", err.Error())
				return fmt.Errorf("%d check(s) failed", failed)
			}
			if remote, err := cfg.remoteIAM(); err != nil {
				report("FAIL", "iam", err.Error())
			} else {
				for _, w := range controlplane.ConfigWarnings(controlplane.Config{RemoteIAM: remote}) {
					report("WARN", w.Code, w.Subject+": "+w.Message)
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 20*time.Second)
			defer cancel()
			checkDatabase(ctx, cfg.DatabaseURL, report)
			logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
			if tc, err := workers.Dial(ctx, cfg.Temporal, logger); err != nil {
				report("FAIL", "temporal", err.Error())
			} else {
				report("OK", "temporal", "frontend "+cfg.Temporal.Address+" answers, namespace "+cfg.Temporal.Namespace)
				switch missing, err := workers.MissingSearchAttributes(ctx, tc, cfg.Temporal.Namespace); {
				case err != nil:
					report("FAIL", "temporal.searchAttributes", err.Error())
				case len(missing) > 0:
					report("FAIL", "temporal.searchAttributes", fmt.Sprintf("namespace %s lacks the Keyword search attributes %s: "+
						"workflow starts are refused until they exist (docs/temporal.md)", cfg.Temporal.Namespace, strings.Join(missing, ", ")))
				default:
					report("OK", "temporal.searchAttributes", "defined")
				}
				tc.Close()
			}
			if failed > 0 {
				return fmt.Errorf("%d check(s) failed", failed)
			}
			return nil
		},
	}
	cfg.bind(cmd.Flags(), false)
	return cmd
}

func checkDatabase(ctx context.Context, url string, report func(level, code, msg string)) {
	st, err := store.Open(ctx, url)
	if err != nil {
		report("FAIL", "database", err.Error())
		return
	}
	st.Close()
	report("OK", "database", "reachable")
	m, err := store.NewMigrator(url)
	if err != nil {
		report("FAIL", "migrations", err.Error())
		return
	}
	defer m.Close()
	have, err := m.Version(ctx)
	if err != nil {
		report("FAIL", "migrations", err.Error())
		return
	}
	want, err := m.Latest()
	switch {
	case err != nil:
		report("FAIL", "migrations", err.Error())
	case have < want:
		report("FAIL", "migrations", fmt.Sprintf("schema version %d, the binary has %d: run `better-compute migrate up`", have, want))
	default:
		report("OK", "migrations", fmt.Sprintf("schema version %d", have))
	}
}

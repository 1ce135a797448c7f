package main

import (
	"fmt"
	"net"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/internal/controlplane"
	"github.com/better-compute/better-compute/store"
)

// iamHostCmd serves the embedded IAM over HTTP for API servers that use the
// remote IAM. It reads compute's tables from --database-url (normally a
// streaming replica) and keeps IAM's own tables in --iam-database-url.
// Only API servers may reach it: it trusts the X-Forwarded-For they send.
func iamHostCmd() *cobra.Command {
	var cfg config
	var listen, iamDatabaseURL string
	cmd := &cobra.Command{
		Use:   "iam-host",
		Short: "Serve IAM over HTTP (the remote IAM of API servers), reading compute's tables from a replica",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.load(cmd, false); err != nil {
				return err
			}
			if !cmd.Flags().Changed("iam-database-url") {
				iamDatabaseURL = envOr("BC_IAM_DATABASE_URL", cfg.DatabaseURL)
			}
			if !cmd.Flags().Changed("iam-listen") {
				listen = envOr("BC_IAM_LISTEN", listen)
			}
			logger, err := jsonLogger(cfg.LogLevel)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			compute, err := store.Open(ctx, cfg.DatabaseURL)
			if err != nil {
				return err
			}
			defer compute.Close()
			iamStore, err := store.Open(ctx, iamDatabaseURL)
			if err != nil {
				return err
			}
			defer iamStore.Close()
			var secret []byte
			if cfg.IAMRefreshSecretFile != "" {
				if secret, err = readSecret(cfg.IAMRefreshSecretFile); err != nil {
					return err
				}
			} else {
				logger.Warn("no refresh secret: signed refreshes are refused", "warning", controlplane.WarnIAMRefresh)
			}
			host, err := controlplane.NewHost(ctx, controlplane.HostConfig{
				IAMStore: iamStore, ComputeStore: compute, RootTenant: cfg.RootTenant, RefreshSecret: secret, Logger: logger,
			})
			if err != nil {
				return err
			}
			defer host.Close()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			srv := httpx.NewServer(host.Handler, httpx.Timeouts{})
			go func() {
				<-ctx.Done()
				_ = srv.Close()
			}()
			logger.Info("iam host listening", "addr", ln.Addr().String())
			if err := srv.Serve(ln); err != nil && ctx.Err() == nil {
				return err
			}
			return nil
		},
	}
	cfg.bind(cmd.Flags(), false)
	cmd.Flags().StringVar(&listen, "iam-listen", "127.0.0.1:8181", "address the IAM host listens on (env BC_IAM_LISTEN)")
	cmd.Flags().StringVar(&iamDatabaseURL, "iam-database-url", "", "PostgreSQL URL of IAM's own tables, writable (env BC_IAM_DATABASE_URL; default: --database-url)")
	return cmd
}

package main

import (
	"fmt"
	"net"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/internal/controlplane"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/workers"
)

func serveCmd() *cobra.Command {
	var cfg config
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the HTTP API against an existing PostgreSQL and Temporal",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.load(cmd, true); err != nil {
				return err
			}
			logger, err := jsonLogger(cfg.LogLevel)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			st, err := store.Open(ctx, cfg.DatabaseURL)
			if err != nil {
				return err
			}
			defer st.Close()
			tc, err := workers.Dial(ctx, cfg.Temporal, logger)
			if err != nil {
				return err
			}
			defer tc.Close()
			ln, err := net.Listen("tcp", cfg.Listen)
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			cp, err := controlplane.New(ctx, controlplane.Config{
				Store: st, Temporal: tc, TaskQueue: workers.ControlPlaneQueue, RootTenant: cfg.RootTenant, Logger: logger,
			})
			if err != nil {
				return err
			}
			defer cp.Close()
			for _, w := range cp.Warnings {
				logger.Warn(w.Message, "warning", w.Code, "subject", w.Subject)
			}
			logger.Info("api listening", "addr", ln.Addr().String())
			return cp.API.Serve(ctx, ln)
		},
	}
	cfg.bind(cmd.Flags(), true)
	return cmd
}

func workerCmd() *cobra.Command {
	var cfg config
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run the control-plane Temporal worker against an existing PostgreSQL and Temporal",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.load(cmd, false); err != nil {
				return err
			}
			logger, err := jsonLogger(cfg.LogLevel)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			st, err := store.Open(ctx, cfg.DatabaseURL)
			if err != nil {
				return err
			}
			defer st.Close()
			tc, err := workers.Dial(ctx, cfg.Temporal, logger)
			if err != nil {
				return err
			}
			defer tc.Close()
			w := workers.NewControlPlane(tc, workers.Deps{Store: st})
			if err := w.Start(); err != nil {
				return fmt.Errorf("worker: %w", err)
			}
			logger.Info("worker running", "taskQueue", workers.ControlPlaneQueue)
			<-ctx.Done()
			w.Stop()
			return nil
		},
	}
	cfg.bind(cmd.Flags(), false)
	return cmd
}

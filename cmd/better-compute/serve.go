package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/internal/controlplane"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/blobs"
	"github.com/better-compute/better-compute/store/secrets"
	"github.com/better-compute/better-compute/workers"
)

// backends are what production mode connects to: it never starts them.
type backends struct {
	logger   *slog.Logger
	store    *store.Store
	temporal client.Client
}

func (b *backends) close() {
	if b.temporal != nil {
		b.temporal.Close()
	}
	if b.store != nil {
		b.store.Close()
	}
}

// connect loads the configuration, then opens the database and dials Temporal.
func connect(cmd *cobra.Command, cfg *config, withListen bool) (*backends, error) {
	if err := cfg.load(cmd, withListen); err != nil {
		return nil, err
	}
	b := &backends{}
	var err error
	if b.logger, err = jsonLogger(cfg.LogLevel); err != nil {
		return nil, err
	}
	ctx := cmd.Context()
	if b.store, err = store.Open(ctx, cfg.DatabaseURL); err != nil {
		return nil, err
	}
	if b.temporal, err = workers.Dial(ctx, cfg.Temporal, b.logger); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func serveCmd() *cobra.Command {
	var cfg config
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the HTTP API against an existing PostgreSQL and Temporal",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := connect(cmd, &cfg, true)
			if err != nil {
				return err
			}
			defer b.close()
			ln, err := net.Listen("tcp", cfg.Listen)
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			remote, err := cfg.remoteIAM()
			if err != nil {
				return err
			}
			agents, err := cfg.agents()
			if err != nil {
				return err
			}
			maxAhead, err := time.ParseDuration(cfg.ReservationMaxAhead)
			if err != nil || maxAhead <= 0 {
				return fmt.Errorf("--reservation-max-ahead %q: want a positive duration such as 8760h", cfg.ReservationMaxAhead)
			}
			keys, err := cfg.secretsKeys(b.logger)
			if err != nil {
				return err
			}
			var blobStore blobs.Store
			if cfg.BlobDir != "" {
				if blobStore, err = blobs.NewDir(cfg.BlobDir); err != nil {
					return err
				}
			}
			cp, err := controlplane.New(cmd.Context(), controlplane.Config{
				Store: b.store, Temporal: b.temporal, TaskQueue: workers.ControlPlaneQueue, RootTenant: cfg.RootTenant,
				Logger: b.logger, RemoteIAM: remote, NodeCA: agents.ca, AgentEndpoint: agents.endpoint,
				TemporalAddress: cfg.Temporal.Address, TemporalNamespace: cfg.Temporal.Namespace,
				ReservationMaxAhead: maxAhead, PublicURL: cfg.PublicURL, SecretsKeys: keys,
				Blobs: blobStore, WebhookLoopback: cfg.webhookLoopback(),
				Console: controlplane.ConsoleConfig{InsecureCookies: cfg.ConsoleInsecureCookies == "true", TemporalUI: cfg.TemporalUIURL},
			})
			if err != nil {
				return err
			}
			defer cp.Close()
			for _, w := range cp.Warnings {
				b.logger.Warn(w.Message, "warning", w.Code, "subject", w.Subject)
			}
			if agents.listen != "" {
				aln, err := net.Listen("tcp", agents.listen)
				if err != nil {
					return fmt.Errorf("agent listener: %w", err)
				}
				agentsDone := make(chan struct{})
				go func() {
					defer close(agentsDone)
					if err := cp.ServeAgents(cmd.Context(), aln, agents.hosts); err != nil && !errors.Is(err, http.ErrServerClosed) {
						b.logger.Error("agent listener", "error", err)
					}
				}()
				// The sessions mark their nodes disconnected while the
				// store is still open.
				defer func() { <-agentsDone }()
				b.logger.Info("agent listener", "addr", aln.Addr().String(), "endpoint", agents.endpoint)
			}
			b.logger.Info("api listening", "addr", ln.Addr().String())
			return cp.API.Serve(cmd.Context(), ln)
		},
	}
	cfg.bind(cmd.Flags(), true)
	return cmd
}

func workerCmd() *cobra.Command {
	var cfg config
	var metricsAddr string
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run the control-plane Temporal worker against an existing PostgreSQL and Temporal",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := connect(cmd, &cfg, false)
			if err != nil {
				return err
			}
			defer b.close()
			metrics, stopMetrics, err := workerMetrics(cmd.Context(), metricsAddr, b.logger)
			if err != nil {
				return err
			}
			defer stopMetrics()
			keys, err := cfg.secretsKeys(b.logger)
			if err != nil {
				return err
			}
			providerFactory, err := controlplane.ProviderFactory(b.store, b.logger.With("component", "providers"))
			if err != nil {
				return err
			}
			var blobStore blobs.Store
			if cfg.BlobDir != "" {
				if blobStore, err = blobs.NewDir(cfg.BlobDir); err != nil {
					return err
				}
			}
			w := workers.NewControlPlane(b.temporal, workers.Deps{Store: b.store, Metrics: metrics,
				Providers: providerFactory, Secrets: secrets.NewVault(keys, cfg.RootTenant), Blobs: blobStore,
				Webhooks: workers.WebhooksTuning{AllowLoopback: cfg.webhookLoopback()}})
			if err := w.Start(); err != nil {
				return fmt.Errorf("worker: %w", err)
			}
			if err := workers.EnsureSchedules(cmd.Context(), b.temporal); err != nil {
				w.Stop()
				return err
			}
			b.logger.Info("worker running", "taskQueue", workers.ControlPlaneQueue)
			<-cmd.Context().Done()
			w.Stop()
			return nil
		},
	}
	cfg.bind(cmd.Flags(), false)
	cmd.Flags().StringVar(&metricsAddr, "metrics-listen", "", "serve the worker's Prometheus /metrics on this address (host:port; empty: none)")
	return cmd
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/cli"
)

func devCmd() *cobra.Command {
	var o devstack.Options
	var verbose bool
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole system on this machine: PostgreSQL, Temporal and its UI, the API and a worker",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			if o.CLIConfig == "" {
				if o.CLIConfig, err = cli.DefaultConfigPath(os.Getenv); err != nil {
					return err
				}
			} else if o.CLIConfig == "-" {
				o.CLIConfig = ""
			}
			ctx := cmd.Context()
			started := time.Now()
			stack, err := devstack.Start(ctx, o)
			if err != nil {
				return err
			}
			fmt.Print(stack.Banner())
			fmt.Printf("  (ready in %.1fs)\n\n", time.Since(started).Seconds())
			<-ctx.Done()
			fmt.Fprintln(os.Stderr, "stopping…")
			stopCtx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			stack.Stop(stopCtx)
			return nil
		},
	}
	d := devstack.Defaults()
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", d.Dir, "where the dev stack keeps its data")
	f.BoolVar(&o.Reset, "reset", false, "wipe the data directory (and the PostgreSQL data, wherever it is) first")
	f.StringVar(&o.APIAddr, "api", d.APIAddr, "API listen address")
	f.IntVar(&o.PostgresPort, "postgres-port", d.PostgresPort, "PostgreSQL port")
	f.StringVar(&o.TemporalAddr, "temporal", d.TemporalAddr, "Temporal frontend address")
	f.StringVar(&o.UIAddr, "temporal-ui", d.UIAddr, `Temporal Web UI address ("-" for none)`)
	f.StringVar(&o.AgentAddr, "agent-listen", d.AgentAddr, "agent listener address (mutual TLS)")
	f.StringVar(&o.ProviderAddr, "provider-listen", d.ProviderAddr, `the fake DigitalOcean API's address ("-" for none)`)
	f.StringVar(&o.DemoImage, "demo-image", d.DemoImage, "the instance image registered for the demo (make testimage makes it)")
	f.IntVar(&o.Agents, "agents", d.Agents, "simulated bcd node agents joining the demo pool (-1 for none)")
	f.StringVar(&o.CLIConfig, "cli-config", "", `the CLI configuration to write the contexts dev and dev-admin into (default $BC_CONFIG or the user's; "-" for none)`)
	f.BoolVar(&verbose, "verbose", false, "debug logs")
	return cmd
}

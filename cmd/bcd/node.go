package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/agent/inventory"
	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/internal/buildinfo"
)

// nodeCommand is `bcd node`: the node agent's commands, from
// nodeSubcommands.
func nodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "The node agent: join a pool, then run the node's session",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(nodeSubcommands()...)
	return cmd
}

// nodeSubcommands are the commands of `bcd node`.
func nodeSubcommands() []*cobra.Command {
	return []*cobra.Command{nodeJoinCommand(), nodeRunCommand(), nodeFirstbootCommand()}
}

// nodeJoinCommand is `bcd node join`: it collects the inventory and joins
// the pool of the join token, keeping the identity in the state directory.
func nodeJoinCommand() *cobra.Command {
	var (
		o        join.Options
		inv      inventory.Options
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "join",
		Short: "Join this machine to a pool with a join token",
		Long: "Join this machine to the pool of a join token. The node's key, certificate and the node CA are kept\n" +
			"in the state directory (mode 0600). When the pool asks for approval, join waits for it.\n" +
			"With an identity already in the state directory it does nothing unless --force.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.APIURL == "" || o.StateDir == "" {
				return fmt.Errorf("--api and --state-dir are required")
			}
			if o.Token == "" {
				o.Token = os.Getenv("BCD_JOIN_TOKEN")
			}
			if !o.Force {
				if id, err := join.LoadIdentity(o.StateDir); err == nil {
					fmt.Printf("already joined as node %s (use --force to join again)\n", id.NodeID)
					return nil
				}
			}
			inv.AgentVersion = "bcd/" + buildinfo.Get().Version
			doc, err := inventory.Collect(cmd.Context(), inv)
			if err != nil {
				return err
			}
			o.Inventory, o.PollInterval = doc, interval
			fmt.Fprintln(os.Stderr, "joining; if the pool asks for approval this waits for it")
			id, err := join.Join(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Printf("joined as node %s; agent endpoint %s\n", id.NodeID, id.AgentEndpoint)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.APIURL, "api", "", "the API's base URL, e.g. https://compute.example.com")
	f.StringVar(&o.Token, "token", "", "the join token (bcjt_…; default $BCD_JOIN_TOKEN)")
	f.StringVar(&o.StateDir, "state-dir", "", "where the node's identity is kept")
	f.StringVar(&o.Name, "name", "", "the node's name, a DNS label (default the hostname)")
	f.BoolVar(&o.Force, "force", false, "join again even when the state directory holds an identity")
	f.DurationVar(&interval, "poll-interval", 5*time.Second, "how often to ask whether a pending join was approved")
	f.StringVar(&inv.Root, "root", "", "filesystem root to read /sys, /proc and /etc under (default /)")
	f.StringVar(&inv.SimulateGPUs, "simulate-gpus", "", "report simulated GPUs instead of NVML's, e.g. 8xH100-SXM5-80GB")
	f.StringVar(&inv.Seed, "seed", "", "seed of simulated GPU UUIDs (default the hostname)")
	return cmd
}

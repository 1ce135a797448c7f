package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/agent/firstboot"
	agentinv "github.com/better-compute/better-compute/agent/inventory"
	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/internal/buildinfo"
)

// nodeFirstbootCommand is `bcd node firstboot`: the installed system's
// first boot after a deploy. It joins with the seed's deploy-boot token and
// runs the node's session, as `bcd node join` then `bcd node run` would.
func nodeFirstbootCommand() *cobra.Command {
	var (
		seedDir, stateDir, cdiDir string
		inv                       agentinv.Options
		noGPUs                    bool
	)
	cmd := &cobra.Command{
		Use:   "firstboot",
		Short: "Join with a deploy's seed and run the node's session (the installed system's first boot)",
		Long: "Read the NoCloud seed a deploy wrote (a mounted FAT partition labelled CIDATA), join with its one-time\n" +
			"boot token and this machine's inventory, keeping the identity in the state directory, then run the node's\n" +
			"session against the seed's agent endpoint, else the one the join answered, until SIGTERM or SIGINT.\n" +
			"With an identity already in the state directory it sends no join.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if seedDir == "" || stateDir == "" {
				return fmt.Errorf("--seed and --state-dir are required")
			}
			if noGPUs {
				inv.GPUs = noGPUSource{}
			}
			seed, err := firstboot.ReadSeed(os.DirFS(seedDir))
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			collect := inv
			collect.AgentVersion = "bcd/" + buildinfo.Get().Version
			return firstboot.Run(ctx, firstboot.Options{
				Seed: seed, StateDir: stateDir,
				Logger:    slog.New(slog.NewTextHandler(os.Stderr, nil)).With("agent", "bcd-firstboot"),
				Inventory: func(ctx context.Context) (*inventory.NodeInventory, error) { return agentinv.Collect(ctx, collect) },
				Session: func(ctx context.Context, id join.Identity) error {
					return runNodeSession(ctx, id, nodeSessionFlags{stateDir: stateDir, cdiDir: cdiDir, inv: inv})
				},
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&seedDir, "seed", "", "the mounted seed filesystem (required)")
	f.StringVar(&stateDir, "state-dir", "", "where the node's identity is kept, e.g. on a tmpfs (required)")
	f.StringVar(&cdiDir, "cdi-dir", "", "where CDI specs are written (default /etc/cdi; <state-dir>/cdi with --simulate-gpus)")
	f.StringVar(&inv.Root, "root", "", "filesystem root to read /sys, /proc and /etc under (default /)")
	f.StringVar(&inv.SimulateGPUs, "simulate-gpus", "", "report simulated GPUs instead of NVML's, e.g. 8xH100-SXM5-80GB")
	f.BoolVar(&noGPUs, "no-gpus", false, "report no GPUs without asking NVML (a system with no NVIDIA driver, such as the test disk)")
	return cmd
}

// noGPUSource reports no GPUs: an installed system without the NVIDIA
// driver says so explicitly, rather than NVML's absence reading as none.
type noGPUSource struct{}

func (noGPUSource) GPUs(context.Context) (inventory.GPUs, error) {
	return inventory.GPUs{Devices: []inventory.GPU{}}, nil
}

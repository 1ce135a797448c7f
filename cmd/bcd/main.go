// Command bcd is the agent on every machine (`bcd node`) and on every site
// (`bcd site`). Today it reports its version and the machine's inventory;
// joining, the session and commands come with the rest of the agent.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/agent/inventory"
	"github.com/better-compute/better-compute/internal/buildinfo"
)

func main() {
	root := &cobra.Command{
		Use:           "bcd",
		Short:         "bcd: the Better Compute agent",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(*cobra.Command, []string) {
			i := buildinfo.Get()
			fmt.Printf("bcd %s (commit %s, %s)\n", i.Version, i.Commit, i.GoVersion)
		},
	})
	root.AddCommand(inventoryCommand())
	root.AddCommand(nodeCommand())
	root.AddCommand(siteCommand())
	root.AddCommand(ramdiskCommand())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "bcd:", err)
		os.Exit(1)
	}
}

// inventoryCommand prints the NodeInventory v1 document bcd would report.
func inventoryCommand() *cobra.Command {
	var o inventory.Options
	cmd := &cobra.Command{
		Use:   "inventory",
		Short: "Collect this machine's inventory (NodeInventory v1) and print it as JSON",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.AgentVersion = "bcd/" + buildinfo.Get().Version
			return inventory.Print(cmd.Context(), os.Stdout, o)
		},
	}
	cmd.Flags().StringVar(&o.Root, "root", "", "filesystem root to read /sys, /proc and /etc under (default /)")
	cmd.Flags().StringVar(&o.SimulateGPUs, "simulate-gpus", "", "report simulated GPUs instead of NVML's, e.g. 8xH100-SXM5-80GB")
	cmd.Flags().StringVar(&o.Seed, "seed", "", "seed of simulated GPU UUIDs (default the hostname)")
	return cmd
}

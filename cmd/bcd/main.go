// Command bcd is the agent on every machine (`bcd node`) and on every site
// (`bcd site`). Its agent commands come with the agent work; today it
// reports its version.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

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
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "bcd:", err)
		os.Exit(1)
	}
}

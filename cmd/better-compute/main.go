// Command better-compute is the control plane: the API server, the
// control-plane worker, migrations, and the one-machine dev stack.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := &cobra.Command{
		Use:           "better-compute",
		Short:         "Better Compute: a multi-tenant control plane for GPU fleets",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(devCmd(), serveCmd(), workerCmd(), temporalCmd(), migrateCmd(), iamCmd(), iamHostCmd(), doctorCmd(), versionCmd())
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "better-compute:", err)
		stop()
		os.Exit(1)
	}
}

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

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/internal/cli"
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
	root.AddCommand(devCmd(), serveCmd(), workerCmd(), temporalCmd(), migrateCmd(), iamCmd(), iamHostCmd(), doctorCmd(), versionCmd(), openapiCmd(), secretsRewrapCmd(),
		imageSignersCmd())
	// The API's own commands, one per method of the registry.
	reg, err := api.BuildRegistry(api.Domains)
	if err == nil {
		err = cli.Attach(root, cli.Options{Registry: reg})
	}
	addImagesPush(root, cli.Options{Registry: reg})
	if err != nil {
		fmt.Fprintln(os.Stderr, "better-compute:", err)
		os.Exit(cli.ExitGeneric)
	}
	if err := root.ExecuteContext(ctx); err != nil {
		code := cli.Report(os.Stderr, err)
		stop()
		os.Exit(code)
	}
}

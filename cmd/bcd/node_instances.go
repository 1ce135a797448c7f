package main

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/spf13/pflag"

	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/runtime"
)

// instanceFlags configure the node's instance runtime (docs/instance-runtime.md).
type instanceFlags struct {
	bridge, subnet string
	stopGrace      time.Duration
}

func (f *instanceFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.bridge, "instance-bridge", runtime.DefaultBridge, "the Linux bridge of the node's instance network")
	fs.StringVar(&f.subnet, "instance-subnet", runtime.DefaultSubnet, "the bridge's address and the instance network's prefix; containers get the other addresses")
	fs.DurationVar(&f.stopGrace, "instance-stop-grace", runtime.DefaultStopGrace, "how long a stopping instance gets after SIGTERM (a VM: the ACPI power-down) before it is killed")
}

// startInstanceRuntime builds the node's instance runtime and runs it in
// the background until ctx ends (it converges at once on the spec kept in
// the state directory); wait answers once it returned.
func startInstanceRuntime(ctx context.Context, id join.Identity, client *http.Client, stateDir, cdiDir string, f instanceFlags, log *slog.Logger) (rt *runtime.Runtime, wait func(), err error) {
	rt, err = runtime.New(runtime.Options{
		StateDir: stateDir, Endpoint: id.AgentEndpoint, Client: client, Bridge: f.bridge, Subnet: f.subnet,
		StopGrace: f.stopGrace, CDIDir: cdiDir, Logger: log,
	})
	if err != nil {
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := rt.Run(ctx); err != nil {
			log.Error("instance runtime", "error", err)
		}
	}()
	return rt, func() { <-done }, nil
}

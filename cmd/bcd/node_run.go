package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/agent/commands"
	agentinv "github.com/better-compute/better-compute/agent/inventory"
	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/selfupdate"
	"github.com/better-compute/better-compute/agent/session"
	"github.com/better-compute/better-compute/agent/tunnel"
	"github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/internal/buildinfo"
)

// nodeRunCommand is `bcd node run`: it loads the identity `bcd node join`
// kept and holds the node's session (heartbeats, inventory, commands) until
// SIGTERM or SIGINT, reconnecting as needed.
func nodeRunCommand() *cobra.Command {
	var (
		stateDir, cdiDir, endpoint string
		sshdDir                    string
		inv                        agentinv.Options
		instances                  instanceFlags
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the node's session with the control plane until stopped",
		Long: "Run the node's session over mutual TLS with the identity `bcd node join` kept in the state directory:\n" +
			"heartbeats, the inventory when it changed, the NodeSpec it converges on, and the node's commands, one at\n" +
			"a time. It reconnects with\n" +
			"backoff whenever the session ends, and stops on SIGTERM or SIGINT.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if stateDir == "" {
				return fmt.Errorf("--state-dir is required")
			}
			id, err := join.LoadIdentity(stateDir)
			if err != nil {
				return err
			}
			if endpoint != "" {
				id.AgentEndpoint = endpoint
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return runNodeSession(ctx, id, nodeSessionFlags{stateDir: stateDir, cdiDir: cdiDir, sshdDir: sshdDir, inv: inv,
				instances: instances})
		},
	}
	f := cmd.Flags()
	instances.register(f)
	f.StringVar(&stateDir, "state-dir", "", "where bcd node join kept the node's identity (required)")
	f.StringVar(&endpoint, "agent-endpoint", "", "the agent listener to connect to (default: the one told at join)")
	f.StringVar(&cdiDir, "cdi-dir", "", "where CDI specs are written (default /etc/cdi; <state-dir>/cdi with --simulate-gpus)")
	f.StringVar(&sshdDir, "sshd-dir", "", "where sshd's certificate trust is kept, with the sshd_config snippet to include (default "+
		"/etc/ssh/better-compute; <state-dir>/sshd with --simulate-gpus; none: not kept)")
	f.StringVar(&inv.Root, "root", "", "filesystem root to read /sys, /proc and /etc under (default /)")
	f.StringVar(&inv.SimulateGPUs, "simulate-gpus", "", "report simulated GPUs instead of NVML's, e.g. 8xH100-SXM5-80GB")
	f.StringVar(&inv.Seed, "seed", "", "seed of simulated GPU UUIDs (default the hostname)")
	return cmd
}

type nodeSessionFlags struct {
	stateDir, cdiDir string
	sshdDir          string
	inv              agentinv.Options
	// instances configure the instance runtime; zero: its defaults.
	instances instanceFlags
}

// runNodeSession holds the node's session with identity id until ctx ends:
// what `bcd node run` and `bcd node firstboot` do once joined.
func runNodeSession(ctx context.Context, id join.Identity, f nodeSessionFlags) error {
	inv := f.inv
	simulate := inv.SimulateGPUs != ""
	cdiDir := f.cdiDir
	if cdiDir == "" {
		cdiDir = "/etc/cdi"
		if simulate {
			cdiDir = filepath.Join(f.stateDir, "cdi")
		}
	}
	version := "bcd/" + buildinfo.Get().Version
	inv.AgentVersion = version
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	spec, err := nodespec.Open(f.stateDir)
	if err != nil {
		return err
	}
	client := session.NewHTTPClient(id)
	updater, err := newUpdater(id, f.stateDir, version, client, log)
	if err != nil {
		return err
	}
	// An update in flight: this is its new build (which must hold a
	// session in time) or the previous one put back; either answers it.
	pending, err := updater.Start()
	if err != nil {
		return fmt.Errorf("agent update: %w", err)
	}
	exec := &commands.Executor{StateDir: f.stateDir, CDIDir: cdiDir, Simulate: simulate, ObservedGeneration: spec.Observed,
		AgentUpdate: updater.Update}
	// The instance runtime converges at once on the instances of the spec
	// kept in the state directory, then on each spec the session applies.
	rtCtx, stopRuntime := context.WithCancel(ctx)
	rt, waitRuntime, err := startInstanceRuntime(rtCtx, id, client, f.stateDir, cdiDir, f.instances, log)
	if err != nil {
		stopRuntime()
		return err
	}
	// The runtime ends with the session (its instances keep running).
	defer waitRuntime()
	defer stopRuntime()
	log.Info("node session starting", "node", id.NodeID, "endpoint", id.AgentEndpoint, "version", version)
	return session.Run(ctx, session.Options{
		Identity: id, StateDir: f.stateDir, Executor: exec, AgentVersion: version, Logger: log, NodeSpec: spec, HTTPClient: client,
		OnSpec:    specHooks(sshTrust(ctx, sshdDirOf(f.sshdDir, f.stateDir, simulate), log), rt.OnSpec),
		OnSession: confirmUpdate(ctx, updater, pending, log, rt.OnSession),
		Inventory: func(ctx context.Context) (*inventory.NodeInventory, error) { return agentinv.Collect(ctx, inv) },
		OnTunnel:  (&tunnel.Opener{Endpoint: id.AgentEndpoint, Logger: log, Execer: rt}).Serve,
	})
}

// newUpdater is the agent.update of this build, replacing the executable
// it runs from.
func newUpdater(id join.Identity, stateDir, version string, client *http.Client, log *slog.Logger) (*selfupdate.Updater, error) {
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		return nil, fmt.Errorf("finding bcd's executable: %w", err)
	}
	return &selfupdate.Updater{StateDir: stateDir, Executable: exe, Version: version, Endpoint: id.AgentEndpoint, Client: client,
		Exec: syscall.Exec, Logger: log}, nil
}

// confirmUpdate answers the update in flight (pending, nil when none) on
// the first session: its result goes out, and the marker goes. Until then
// a new build is rolled back at its deadline. Then next runs.
func confirmUpdate(ctx context.Context, u *selfupdate.Updater, pending *selfupdate.Marker, log *slog.Logger,
	next func(context.Context, func(any) error)) func(context.Context, func(any) error) {
	if pending == nil {
		return next
	}
	watchCtx, confirmed := context.WithCancel(ctx)
	go u.Watch(watchCtx, *pending)
	var mu sync.Mutex
	answered := false
	return func(sessCtx context.Context, send func(any) error) {
		mu.Lock()
		if !answered {
			if err := send(pending.Result()); err != nil {
				log.Warn("agent update: sending its result (again on the next session)", "error", err.Error())
			} else {
				answered = true
				confirmed()
				if err := u.Confirmed(); err != nil {
					log.Warn("agent update: removing its marker", "error", err.Error())
				}
				log.Info("agent update answered", "seq", pending.Seq, "state", pending.State)
			}
		}
		mu.Unlock()
		if next != nil {
			next(sessCtx, send)
		}
	}
}

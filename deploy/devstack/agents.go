package devstack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/nodes"
	"github.com/better-compute/better-compute/api/sites"
)

// The dev stack's node agents: real `bcd node` processes with simulated
// GPUs that join the demo pool with a join token and then hold their
// sessions on the agent listener, as agents on real machines do.
const (
	agentGPUs     = "8xH100-SXM5-80GB"
	agentTokenTTL = 3600 // seconds
	// agentsReadyTimeout bounds the wait for the agents' nodes.
	agentsReadyTimeout = time.Minute
)

// agentProcess is one running `bcd node run`.
type agentProcess struct {
	name string
	cmd  *exec.Cmd
	done chan error
}

// bcdPath finds the bcd binary: Options.BCD, else `bcd` next to this
// executable (`make run` builds both into bin/), else none.
func (o Options) bcdPath() string {
	if o.BCD != "" {
		return o.BCD
	}
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(exe), "bcd")
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		return p
	}
	return ""
}

// startAgents runs the demo site's `bcd site` and Options.Agents simulated
// node agents, which join the demo pool once (their identities persist in
// Dir/agents).
func (s *Stack) startAgents(ctx context.Context) error {
	if s.opts.Agents <= 0 {
		return nil
	}
	bcd := s.opts.bcdPath()
	if bcd == "" {
		s.opts.Logger.Warn("no bcd binary next to better-compute (make build makes one): running no agents")
		return nil
	}
	if err := s.startSiteAgent(ctx, bcd); err != nil {
		return err
	}
	for i := 1; i <= s.opts.Agents; i++ {
		if err := s.startNodeAgent(ctx, bcd, fmt.Sprintf("dev-agent-%d", i), s.demo.PoolID); err != nil {
			return err
		}
	}
	if s.vps.HostPoolID == "" {
		return nil
	}
	// The VPS host: its instances' bridge and subnet are its own, so they
	// never meet the GPU agents' on this one machine.
	return s.startNodeAgent(ctx, bcd, hostAgent, s.vps.HostPoolID,
		"--instance-bridge", "bcbr-dev", "--instance-subnet", "10.213.9.1/24")
}

// hostAgent is the VPS host's `bcd node`.
const hostAgent = "dev-host-1"

// startNodeAgent runs one simulated `bcd node`, which joins poolID on its
// first run (with a join token of its own) and keeps its identity in
// Dir/agents/name.
func (s *Stack) startNodeAgent(ctx context.Context, bcd, name, poolID string, extra ...string) error {
	dir := filepath.Join(s.opts.Dir, "agents", name)
	if _, err := os.Stat(filepath.Join(dir, "identity.json")); errors.Is(err, os.ErrNotExist) {
		token, err := s.agentJoinToken(ctx, poolID)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		join := exec.CommandContext(ctx, bcd, "node", "join", "--api", s.apiURL, "--state-dir", dir,
			"--name", name, "--simulate-gpus", agentGPUs, "--seed", name)
		join.Env = append(os.Environ(), "BCD_JOIN_TOKEN="+token) // not in the process list
		if out, err := join.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: bcd node join: %w: %s", name, err, out)
		}
	}
	return s.startAgentProcess(name, filepath.Join(dir, "bcd.log"), append([]string{"node", "run", "--state-dir", dir,
		"--simulate-gpus", agentGPUs, "--seed", name, "--cdi-dir", filepath.Join(dir, "cdi"),
		// The listener's address may differ from the one told at join.
		"--agent-endpoint", s.agentURL}, extra...), nil)
}

// startSiteAgent runs the demo site's `bcd site`, with a site token made
// on the first run and kept (0600) in Dir/agents.
func (s *Stack) startSiteAgent(ctx context.Context, bcd string) error {
	dir := filepath.Join(s.opts.Dir, "agents")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tokenFile := filepath.Join(dir, "site-token")
	token, err := os.ReadFile(tokenFile)
	if errors.Is(err, os.ErrNotExist) {
		admin, err := s.AdminToken()
		if err != nil {
			return err
		}
		t, err := sites.CreateToken.Call(ctx, api.NewClient(s.apiURL, admin), sites.CreateTokenInput{TenantID: s.tokens.RootTenantID, SiteID: s.demo.SiteID, Name: "dev site agent"})
		if err != nil {
			return fmt.Errorf("site token for the dev site agent: %w", err)
		}
		token = []byte(t.Token)
		if err := writeFileAtomic(tokenFile, t.Token, 0o600); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	return s.startAgentProcess("dev-site", filepath.Join(dir, "site.log"),
		[]string{"site", "--api", s.apiURL, "--holder", "dev-site"}, []string{"BCD_SITE_TOKEN=" + string(token)})
}

// startAgentProcess starts bcd with args (and extra environment), its
// output appended to logFile, as a child that never outlives the stack.
func (s *Stack) startAgentProcess(name, logFile string, args, env []string) error {
	bcd := s.opts.bcdPath()
	logf, err := os.OpenFile(logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(bcd, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The agent never outlives the stack, even when the stack is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("%s: bcd %s: %w", name, args[0], err)
	}
	p := &agentProcess{name: name, cmd: cmd, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait(); logf.Close() }()
	s.agents = append(s.agents, p)
	return nil
}

// awaitAgents waits until the node agents' nodes are schedulable (joined,
// connected, their NodeSpec observed), so GPUs can be reserved once Start
// returns.
func (s *Stack) awaitAgents(ctx context.Context) error {
	want := 0
	for _, p := range s.agents {
		if strings.HasPrefix(p.name, "dev-agent-") {
			want++
		}
	}
	if want == 0 {
		return nil
	}
	admin, err := s.AdminToken()
	if err != nil {
		return err
	}
	c := api.NewClient(s.apiURL, admin)
	ctx, cancel := context.WithTimeout(ctx, agentsReadyTimeout)
	defer cancel()
	for {
		l, err := nodes.List.Call(ctx, c, nodes.ListInput{TenantID: s.tokens.RootTenantID, PoolID: s.demo.PoolID})
		ready := 0
		if err == nil {
			for _, n := range l.Items {
				if strings.HasPrefix(n.Name, "dev-agent-") && n.Schedulable {
					ready++
				}
			}
		}
		if ready >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d node agents schedulable after %s (logs in %s): %w", ready, want, agentsReadyTimeout,
				filepath.Join(s.opts.Dir, "agents"), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// agentJoinToken makes a one-use join token of the pool, as the root
// admin.
func (s *Stack) agentJoinToken(ctx context.Context, poolID string) (string, error) {
	admin, err := s.AdminToken()
	if err != nil {
		return "", err
	}
	t, err := nodes.CreateJoinToken.Call(ctx, api.NewClient(s.apiURL, admin), nodes.CreateJoinTokenInput{TenantID: s.tokens.RootTenantID,
		PoolID: poolID, Name: "dev agents", TTLSeconds: new(int64(agentTokenTTL)), MaxUses: new(int64(1))})
	if err != nil {
		return "", fmt.Errorf("join token for the dev agents: %w", err)
	}
	return t.Token, nil
}

// stopAgents stops the agents (SIGTERM, then SIGKILL after 5 s).
func (s *Stack) stopAgents() {
	for _, p := range s.agents {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range s.agents {
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	s.agents = nil
}

// agentSummary says which agents run, for the banner.
func (s *Stack) agentSummary() string {
	if len(s.agents) == 0 {
		return "no agents: build bcd next to better-compute"
	}
	return fmt.Sprintf("bcd site and %d simulated bcd node agents", len(s.agents)-1)
}

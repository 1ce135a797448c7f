package main

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/better-compute/better-compute/agent/nodespec"
	"github.com/better-compute/better-compute/agent/sshtrust"
)

// sshdDirNone turns the keeper of sshd's trust off.
const sshdDirNone = "none"

// sshdDirOf is where sshd's trust is kept: the flag's directory, else
// sshtrust.DefaultDir, or <state-dir>/sshd for a simulated node (which
// must not touch the machine's sshd).
func sshdDirOf(flag, stateDir string, simulate bool) string {
	switch {
	case flag != "":
		return flag
	case simulate:
		return filepath.Join(stateDir, "sshd")
	}
	return sshtrust.DefaultDir
}

// sshTrust runs the keeper of sshd's trust in dir until ctx ends and
// answers its NodeSpec hook (nil when dir is "none").
func sshTrust(ctx context.Context, dir string, log *slog.Logger) func(int64, nodespec.Spec) {
	if dir == sshdDirNone {
		return nil
	}
	k := sshtrust.NewKeeper(&sshtrust.Writer{Dir: dir}, log)
	go k.Run(ctx)
	return k.OnSpec
}

// specHooks fans each applied NodeSpec out to the parts of the agent that
// keep a section of it (sshd's trust, the instance runtime); nil hooks are
// skipped. Each hook converges in the background.
func specHooks(hooks ...func(int64, nodespec.Spec)) func(int64, nodespec.Spec) {
	var live []func(int64, nodespec.Spec)
	for _, h := range hooks {
		if h != nil {
			live = append(live, h)
		}
	}
	if len(live) == 0 {
		return nil
	}
	return func(generation int64, spec nodespec.Spec) {
		for _, h := range live {
			h(generation, spec)
		}
	}
}

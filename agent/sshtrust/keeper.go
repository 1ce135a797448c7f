package sshtrust

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/better-compute/better-compute/agent/nodespec"
)

// RetryEvery is how soon a spec that failed to be written is tried again
// (unless a newer one comes first).
const RetryEvery = 30 * time.Second

// Keeper writes the NodeSpec's SSH section in the background: OnSpec (the
// session's hook) never blocks, and only the latest spec is written.
type Keeper struct {
	w   *Writer
	log *slog.Logger

	mu      sync.Mutex
	pending *offer
	applied int64
	wake    chan struct{}
}

type offer struct {
	generation int64
	ssh        nodespec.SSH
}

// NewKeeper keeps w's directory; Run does the writing.
func NewKeeper(w *Writer, log *slog.Logger) *Keeper {
	if log == nil {
		log = slog.Default()
	}
	return &Keeper{w: w, log: log, wake: make(chan struct{}, 1)}
}

// OnSpec takes the spec of generation to write; a spec without an SSH
// section leaves the files as they are.
func (k *Keeper) OnSpec(generation int64, spec nodespec.Spec) {
	if spec.SSH == nil {
		return
	}
	k.mu.Lock()
	if k.pending == nil || generation >= k.pending.generation {
		k.pending = &offer{generation: generation, ssh: *spec.SSH}
	}
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// Applied is the generation whose SSH section the files last said (0:
// none written yet).
func (k *Keeper) Applied() int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.applied
}

// Run writes the snippet and the starting files, then each offered spec,
// until ctx ends.
func (k *Keeper) Run(ctx context.Context) {
	if err := k.w.Ensure(); err != nil {
		k.log.Error("sshtrust: preparing sshd's trust directory", "dir", k.w.Dir, "error", err)
	}
	retry := time.NewTimer(RetryEvery)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.wake:
		case <-retry.C:
		}
		k.mu.Lock()
		o := k.pending
		k.mu.Unlock()
		if o == nil {
			continue
		}
		err := k.w.Write(ctx, o.ssh)
		k.mu.Lock()
		if err == nil {
			k.applied = max(k.applied, o.generation)
			if k.pending == o {
				k.pending = nil
			}
		}
		k.mu.Unlock()
		if err != nil {
			k.log.Error("sshtrust: writing sshd's trust; it accepts no certificate until this succeeds",
				"generation", o.generation, "error", err)
			retry.Reset(RetryEvery)
			continue
		}
		k.log.Info("sshtrust: sshd's trust written", "generation", o.generation,
			"cas", len(o.ssh.TrustedUserCAKeys), "revoked", len(o.ssh.RevokedKeys), "users", len(o.ssh.AuthorizedPrincipals))
	}
}

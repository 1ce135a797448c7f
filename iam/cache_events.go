package iam

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/better-compute/better-compute/store"
)

// EventsChannel is where IAM's tables announce changes that cached answers
// must not outlive (migration 00006): "session:<id>", "identity:<id>",
// "decisions".
const EventsChannel = "iam_events"

// FollowEvents drops cached answers as IAM changes, in every process, until
// ctx ends: a revoked session, a disabled or regrouped identity, a changed
// relation or policy. It reconnects after a failure, and clears both caches
// whenever it (re)connects, since changes may have been missed meanwhile;
// connected, when not nil, runs after each (re)connection.
func (c *CachingPort) FollowEvents(ctx context.Context, s *store.Store, logger *slog.Logger, connected func()) {
	onConnect := func() {
		c.Clear()
		if connected != nil {
			connected()
		}
	}
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := s.Listen(ctx, EventsChannel, onConnect, c.ApplyEvent)
		if ctx.Err() != nil {
			return
		}
		logger.Warn("iam events: listener failed; reconnecting", "error", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 10*time.Second)
	}
}

// ApplyEvent drops what one IAM event makes stale. An event it does not
// know clears everything: failing towards a cache miss is always safe.
func (c *CachingPort) ApplyEvent(payload string) {
	kind, id, _ := strings.Cut(payload, ":")
	switch {
	case kind == "session" && id != "":
		c.DropSession(id)
	case kind == "identity" && id != "":
		c.DropIdentity(id)
	case kind == "decisions":
		c.DropDecisions()
	default:
		c.Clear()
	}
}

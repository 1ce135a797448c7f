// Package rollouts holds the rules of releases and rollouts that the API,
// the store and the workflow share (docs/rollouts.md): the release kinds,
// the rollout and rollout-node states, and how a selection is cut into
// waves.
package rollouts

import "math"

// Release kinds. Only bcd is served; the others are a seam (UNSUPPORTED).
const (
	KindBCD = "bcd"
)

// Kinds lists every kind releases.register accepts in its schema; only
// KindBCD is served.
var Kinds = []string{KindBCD, "profile", "driver", "firmware"}

// Rollout states.
const (
	Running         = "running"
	Paused          = "paused"
	PausedOnFailure = "pausedOnFailure"
	Aborting        = "aborting"
	Aborted         = "aborted"
	Succeeded       = "succeeded"
)

// Rollout node states.
const (
	NodePending    = "pending"
	NodeDraining   = "draining"
	NodeUpdating   = "updating"
	NodeChecking   = "checking"
	NodeSucceeded  = "succeeded"
	NodeFailed     = "failed"
	NodeSkipped    = "skipped"
	NodeRolledBack = "rolledBack"
)

// NodeDone reports whether a rollout node's state is final.
func NodeDone(state string) bool {
	switch state {
	case NodeSucceeded, NodeFailed, NodeSkipped, NodeRolledBack:
		return true
	}
	return false
}

// Wave is one wave of a rollout's plan: a percent of the selection or a
// count of nodes (one of the two).
type Wave struct {
	Percent float64 `json:"percent,omitempty" jsonschema:"minimum=0,maximum=100"`
	Count   int     `json:"count,omitempty" jsonschema:"minimum=0,maximum=100000"`
}

// Plan cuts n nodes into waves: the canary count first (when above zero),
// then each wave's count or ceil(percent × n), the last wave taking what is
// left; empty waves are dropped, and nodes left after the last wave join it.
// It answers each wave's size.
func Plan(n, canary int, waves []Wave) []int {
	var out []int
	left := n
	take := func(k int) {
		k = min(k, left)
		if k > 0 {
			out = append(out, k)
			left -= k
		}
	}
	take(canary)
	for _, w := range waves {
		if w.Count > 0 {
			take(w.Count)
		} else {
			take(int(math.Ceil(w.Percent / 100 * float64(n))))
		}
	}
	if left > 0 {
		if len(out) == 0 {
			out = append(out, left)
		} else {
			out[len(out)-1] += left
		}
	}
	return out
}

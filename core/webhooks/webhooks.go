// Package webhooks holds the webhook rules that need no I/O
// (docs/webhooks.md): the event types a subscription may name, how its
// patterns match, the retry schedule and the signing secret's form.
package webhooks

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/core"
	cloudresources "github.com/better-compute/better-compute/core/cloudresources"
	"github.com/better-compute/better-compute/core/reservations"
)

// EventType is a type of event a webhook may subscribe to.
type EventType struct {
	Type        string `json:"type"`
	Description string `json:"description"`
}

// PingType is the type of webhooks.ping's test event.
const PingType = "webhook.ping"

// EventTypes lists every event type the domains publish (store.PublishEvent
// callers), and the ping.
func EventTypes() []EventType {
	var out []EventType
	for _, s := range reservations.States {
		if s == reservations.Draft {
			continue // a draft is never published: it becomes pending or denied
		}
		out = append(out, EventType{"reservation." + string(s), "a reservation entered " + string(s)})
	}
	out = append(out,
		EventType{"reservation.extended", "a reservation's end moved"},
		EventType{"reservation.replaced", "a reservation's lost node was replaced"},
		EventType{"reservation.conditions", "a reservation's node raised or cleared a health condition"},
		EventType{"instance.created", "an instance was admitted"},
		EventType{"instance.running", "an instance is running"},
		EventType{"instance.stopped", "an instance stopped"},
		EventType{"instance.deleted", "an instance was deleted"},
		EventType{"instance.failed", "an instance failed"},
		EventType{"sandbox.created", "a sandbox was created"},
		EventType{"sandbox.extended", "a sandbox's deadline moved"},
		EventType{"sandbox.ended", "a sandbox ended"},
		EventType{"sandbox.snapshot.started", "a sandbox snapshot began"},
		EventType{"sandbox.snapshot.ready", "a sandbox snapshot is ready"},
		EventType{"sandbox.snapshot.failed", "a sandbox snapshot failed"},
		EventType{"sandbox.snapshot.deleted", "a sandbox snapshot was deleted"},
		EventType{"sandboxVolume.created", "a sandbox volume was created"},
		EventType{"sandboxVolume.resized", "a sandbox volume was resized"},
		EventType{"sandboxVolume.deleted", "a sandbox volume was deleted"},
	)
	for _, e := range []string{cloudresources.EventCreated, cloudresources.EventReady, cloudresources.EventFailed,
		cloudresources.EventUpdating, cloudresources.EventUpdated, cloudresources.EventDeleting, cloudresources.EventDeleted,
		cloudresources.EventAdopted, cloudresources.EventReleasing, cloudresources.EventReleased} {
		out = append(out, EventType{e, "a cloud resource is " + e[strings.LastIndex(e, ".")+1:]})
	}
	return append(out, EventType{PingType, "webhooks.ping's test event"})
}

// CheckPatterns refuses an empty list or a pattern that names no event
// type: a pattern is a type, a prefix ending in ".*" (reservation.*,
// sandbox.snapshot.*) or "*".
func CheckPatterns(patterns []string) error {
	if len(patterns) == 0 {
		return bad("eventTypes", "required", "eventTypes names at least one type or pattern")
	}
	types := EventTypes()
	for _, p := range patterns {
		if !slices.ContainsFunc(types, func(t EventType) bool { return Matches([]string{p}, t.Type) }) {
			return bad("eventTypes", "unknown", fmt.Sprintf("%q names no event type (webhooks.eventTypes lists them)", p))
		}
	}
	return nil
}

// Matches reports whether an event's type is one patterns want.
func Matches(patterns []string, typ string) bool {
	for _, p := range patterns {
		switch {
		case p == "*" || p == typ:
			return true
		case strings.HasSuffix(p, ".*") && strings.HasPrefix(typ, strings.TrimSuffix(p, "*")):
			return true
		}
	}
	return false
}

// The retry schedule: attempt n (1-based) failed, the next waits
// min(BaseDelay × 2^(n-1), MaxDelay), less up to a fifth at random (jitter,
// so receivers that fail together are not retried together). A delivery
// not delivered within Horizon of its first attempt is failed, and so is
// its webhook (state failing).
const (
	BaseDelay = 5 * time.Second
	MaxDelay  = time.Hour
	Horizon   = 72 * time.Hour
)

// RetryAfter is the wait after failed attempt n; jitter in [0, 1).
func RetryAfter(n int, jitter float64) time.Duration {
	d := float64(MaxDelay)
	if n < 30 {
		d = math.Min(float64(BaseDelay)*math.Pow(2, float64(n-1)), float64(MaxDelay))
	}
	return time.Duration(d * (1 - 0.2*jitter))
}

// RotationOverlap is how long a rotated-out secret still signs deliveries
// (both signatures are sent), so receivers can switch without a gap.
const RotationOverlap = 24 * time.Hour

// SecretPrefix starts every signing secret (the Standard Webhooks form:
// whsec_ then the base64 of the key).
const SecretPrefix = "whsec_"

// NewSecret is a fresh signing secret: 32 random bytes.
func NewSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return SecretPrefix + base64.StdEncoding.EncodeToString(b), nil
}

// States of a webhook: active delivers; failing had a delivery run out of
// its horizon (deliveries wait until it is enabled again); disabled was
// turned off by its owner (events still queue).
const (
	StateActive   = "active"
	StateFailing  = "failing"
	StateDisabled = "disabled"
)

// States of a delivery.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

func bad(field, reason, msg string) error {
	return core.Errorf(core.CodeInvalidInput, "%s", msg).WithDetails(map[string]any{"field": field, "reason": reason})
}

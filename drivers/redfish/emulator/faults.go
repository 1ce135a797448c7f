package emulator

import (
	"encoding/json"
	"fmt"
	"time"
)

// Always, as a fault's count, makes it apply to every request or write.
const Always = -1

// Faults is a BMC's switchable misbehaviour. Counts are of requests (or of
// writes, for AckNotApply) still to be affected: each affected one uses one
// up; Always affects every one until the fault is switched off.
type Faults struct {
	// AckNotApply acknowledges writes (power, boot override, virtual
	// media, BIOS) without applying them, as BMCs sometimes do.
	AckNotApply int
	// Unavailable answers requests with 503 and Retry-After.
	Unavailable int
	// RetryAfter is the Retry-After of a 503 (1 s when zero).
	RetryAfter time.Duration
	// Drop closes the connection without an answer.
	Drop int
	// SlowTasks, when positive, is how long tasks take instead of the
	// emulator's TaskDelay.
	SlowTasks time.Duration
}

// faultsJSON is the admin endpoint's form: durations as Go duration strings.
type faultsJSON struct {
	AckNotApply int    `json:"ackNotApply"`
	Unavailable int    `json:"unavailable"`
	RetryAfter  string `json:"retryAfter,omitempty"`
	Drop        int    `json:"drop"`
	SlowTasks   string `json:"slowTasks,omitempty"`
}

// MarshalJSON writes durations as strings ("1.5s").
func (f Faults) MarshalJSON() ([]byte, error) {
	j := faultsJSON{AckNotApply: f.AckNotApply, Unavailable: f.Unavailable, Drop: f.Drop}
	if f.RetryAfter > 0 {
		j.RetryAfter = f.RetryAfter.String()
	}
	if f.SlowTasks > 0 {
		j.SlowTasks = f.SlowTasks.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (f *Faults) UnmarshalJSON(b []byte) error {
	var j faultsJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	out := Faults{AckNotApply: j.AckNotApply, Unavailable: j.Unavailable, Drop: j.Drop}
	for _, d := range []struct {
		s   string
		dst *time.Duration
	}{{j.RetryAfter, &out.RetryAfter}, {j.SlowTasks, &out.SlowTasks}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil {
			return fmt.Errorf("faults: %w", err)
		}
		*d.dst = v
	}
	*f = out
	return nil
}

// take uses one of a fault's count up and reports whether it applies.
func take(n *int) bool {
	switch {
	case *n == Always || *n < 0:
		return true
	case *n > 0:
		*n--
		return true
	}
	return false
}

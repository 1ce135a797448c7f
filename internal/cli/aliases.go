package cli

import (
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/core/reservations"
)

// An alias is a flag of one method that writes a field in the words people
// use for it: --gpus 2 for devices {class gpu, count 2}.
type alias struct {
	Flag  string
	Short string // a one-letter shorthand, or ""
	Usage string
	// Field is the input field it sets; Set builds the value from the flag's.
	Field string
	Set   func(v string) (any, error)
}

// aliases are the ergonomic flags, by method. Every other flag is the
// method's own input field.
var aliases = map[string][]alias{
	"reservations.create": {
		{Flag: "pool", Usage: "the pool's id (poolId)", Field: "poolId", Set: func(v string) (any, error) { return v, nil }},
		{Flag: "gpus", Usage: "how many GPUs (devices {class gpu, count N})", Field: "devices", Set: gpus},
		{Flag: "for", Usage: "how long: 1h, 90m, 2d (duration)", Field: "duration", Set: seconds},
	},
	"reservations.extend": {
		{Flag: "for", Usage: "the new total length from the start: 1h, 90m, 2d (duration)", Field: "duration", Set: seconds},
	},
	// A value on the command line is in the shell's history and the
	// process list; from a file (or standard input) it is in neither.
	"secrets.put": {
		{Flag: "value-file", Usage: "read the value from this file, byte for byte ('-': standard input) (value)", Field: "value",
			Set: fileOf("value-file", 4*64<<10)},
	},
	// The fleet document is a file people keep in version control.
	"fleet.plan": {
		{Flag: "file", Short: "f", Usage: "read the fleet document (YAML or JSON) from this file ('-': standard input) (document)",
			Field: "document", Set: fileOf("file", 1<<20)},
	},
	"fleet.apply": {
		{Flag: "plan", Usage: "the plan's id (planId)", Field: "planId", Set: func(v string) (any, error) { return v, nil }},
	},
	"capacity.preview": {
		{Flag: "pool", Usage: "the pool's id (poolId)", Field: "poolId", Set: func(v string) (any, error) { return v, nil }},
		{Flag: "gpus", Usage: "how many GPUs (devices {class gpu, count N})", Field: "devices", Set: gpus},
		{Flag: "for", Usage: "how long: 1h, 90m, 2d (duration)", Field: "duration", Set: seconds},
	},
}

// parts are the methods whose answer holds a document people keep as a
// file: {flag, field}; the flag answers that field alone, so that
// `fleet export --document -o yaml > fleet.yaml` is what `fleet plan -f`
// reads.
var parts = map[string][2]string{
	"fleet.export": {"document", "document"},
}

// streamed are the methods whose answer is a stream of lines (rpc.Stream),
// copied to standard output as it comes, whatever -o says.
var streamed = map[string]bool{"usage.export": true}

// fileOf reads --flag's file, or standard input for "-", bounded by limit
// bytes (a secret's: 64 KiB of characters, at most 4 bytes each).
func fileOf(flag string, limit int) func(path string) (any, error) {
	return func(path string) (any, error) {
		var r io.Reader = os.Stdin
		if path != "-" {
			f, err := os.Open(path)
			if err != nil {
				return nil, usageErrorf("--%s: %v", flag, err)
			}
			defer f.Close()
			r = f
		}
		b, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
		switch {
		case err != nil:
			return nil, usageErrorf("--%s: %v", flag, err)
		case len(b) > limit:
			return nil, usageErrorf("--%s: more than %d bytes", flag, limit)
		}
		return string(b), nil
	}
}

func gpus(v string) (any, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 {
		return nil, usageErrorf("--gpus %q: want a whole number of GPUs", v)
	}
	return map[string]any{"class": "gpu", "count": n}, nil
}

func seconds(v string) (any, error) {
	n, err := parseSeconds(v)
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	return n, nil
}

// A waiter is how --wait follows a method's long work: it reads the
// resource with Get (IDField naming it) until Settled says the state (its
// StateField, default state) is one a person waits for.
type waiter struct {
	Get        string
	IDField    string
	StateField string
	Settled    func(obj map[string]any, now time.Time) bool
}

func (w waiter) state(obj map[string]any) string {
	if w.StateField != "" {
		return stringOf(obj[w.StateField])
	}
	return stringOf(obj["state"])
}

// waiters are the methods that take --wait.
var waiters = map[string]waiter{
	"reservations.create":  {Get: "reservations.get", IDField: "reservationId", Settled: reservationSettled},
	"reservations.release": {Get: "reservations.get", IDField: "reservationId", Settled: reservationEnded},
	"reservations.cancel":  {Get: "reservations.get", IDField: "reservationId", Settled: reservationEnded},
	"nodes.drain": {Get: "nodes.get", IDField: "nodeId", StateField: "drainState",
		Settled: func(obj map[string]any, _ time.Time) bool { return stringOf(obj["drainState"]) != "draining" }},
}

// reservationSettled: active, ended, waiting on a person, or booked for a
// start still ahead.
func reservationSettled(obj map[string]any, now time.Time) bool {
	s := reservations.State(stringOf(obj["state"]))
	switch {
	case reservations.Terminal(s), s == reservations.Active, s == reservations.AwaitingConfirmation:
		return true
	case slices.Contains([]reservations.State{reservations.Pending, reservations.Placed}, s):
		start, ok := int64Of(obj["start"])
		return ok && start > now.Add(time.Minute).UnixMilli()
	}
	return false
}

func reservationEnded(obj map[string]any, _ time.Time) bool {
	return reservations.Terminal(reservations.State(stringOf(obj["state"])))
}

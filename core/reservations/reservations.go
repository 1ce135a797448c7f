// Package reservations holds a reservation's lifecycle: its states and the
// one table of allowed transitions. It is pure (no I/O); every change of a
// reservation's state goes through Transition.
//
// The lifecycle:
//
//	draft                  -> denied | pending | awaiting-confirmation
//	awaiting-confirmation  -> pending | cancelled | expired
//	pending                -> placed | failed | cancelled | expired
//	placed                 -> binding | failed | cancelled | expired
//	binding                -> active | failed | cancelled
//	active                 -> releasing | expired
//	expired                -> releasing
//	releasing              -> released | failed
//
// A draft is decided on (Better IAM) before it exists for anything else: a
// denial ends it (denied); an allow makes it pending, or
// awaiting-confirmation when the request needs a confirmation first. A
// pending reservation is placed (its atoms booked), fails (nothing fits),
// is cancelled or expires before its window. A placed one is bound (hold,
// instance or node), active once bound; an active reservation is released
// (releasing, then released) or runs past its end (expired, whose atoms are
// then released too). denied, released, failed and cancelled are terminal.
package reservations

import "github.com/better-compute/better-compute/core"

// State is a reservation's state.
type State string

// The states.
const (
	Draft                State = "draft"
	Denied               State = "denied"
	AwaitingConfirmation State = "awaiting-confirmation"
	Pending              State = "pending"
	Placed               State = "placed"
	Binding              State = "binding"
	Active               State = "active"
	Releasing            State = "releasing"
	Released             State = "released"
	Failed               State = "failed"
	Cancelled            State = "cancelled"
	Expired              State = "expired"
)

// States lists every state, in lifecycle order.
var States = []State{Draft, Denied, AwaitingConfirmation, Pending, Placed, Binding, Active,
	Releasing, Released, Failed, Cancelled, Expired}

// transitions is the one table of allowed edges.
var transitions = map[State][]State{
	Draft:                {Denied, Pending, AwaitingConfirmation},
	AwaitingConfirmation: {Pending, Cancelled, Expired},
	Pending:              {Placed, Failed, Cancelled, Expired},
	Placed:               {Binding, Failed, Cancelled, Expired},
	Binding:              {Active, Failed, Cancelled},
	Active:               {Releasing, Expired},
	Expired:              {Releasing},
	Releasing:            {Released, Failed},
}

// Valid says whether s is a state.
func Valid(s State) bool {
	for _, x := range States {
		if x == s {
			return true
		}
	}
	return false
}

// Terminal says whether no edge leaves s.
func Terminal(s State) bool { return Valid(s) && len(transitions[s]) == 0 }

// CanTransition says whether from -> to is an edge of the table.
func CanTransition(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Transition checks from -> to: INVALID_STATE, with details from and to,
// when it is not an edge.
func Transition(from, to State) error {
	if CanTransition(from, to) {
		return nil
	}
	return core.Errorf(core.CodeInvalidState, "a %s reservation cannot become %s", from, to).
		WithDetails(map[string]any{"from": string(from), "to": string(to)})
}

// String implements fmt.Stringer.
func (s State) String() string { return string(s) }

// EndReason says why a reservation ended: it tells apart endings that
// reach the same state (a lease lapse and a release both end released).
type EndReason string

// The end reasons.
const (
	EndOfWindow EndReason = "end"       // its window's end came
	EndLease    EndReason = "lease"     // its allocation lease was not renewed in time
	EndRelease  EndReason = "release"   // reservations.release
	EndCancel   EndReason = "cancel"    // reservations.cancel, before it was active
	EndPreempt  EndReason = "preempted" // a spot reservation whose atoms another took
	EndNodeLost EndReason = "nodeLost"  // a node it was allocated on became lost
	EndFailed   EndReason = "failed"    // placement or binding failed
)

// EndReasons lists every end reason.
var EndReasons = []EndReason{EndOfWindow, EndLease, EndRelease, EndCancel, EndPreempt, EndNodeLost, EndFailed}

// Enum lists the end reasons' values, for schemas.
func (EndReason) Enum() []string {
	out := make([]string, len(EndReasons))
	for i, r := range EndReasons {
		out[i] = string(r)
	}
	return out
}

// DefaultEndReason is the reason recorded when a reservation reaches the
// terminal state to and no step recorded one before: "" for denied, which
// never began.
func DefaultEndReason(to State) EndReason {
	switch to {
	case Cancelled:
		return EndCancel
	case Failed:
		return EndFailed
	case Released:
		return EndRelease
	}
	return ""
}

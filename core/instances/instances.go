// Package instances holds a VPS instance's states and the one table of
// which method is allowed in which observed state. It is pure (no I/O).
//
// An instance has a desired state (what its owner asked: running, stopped
// or deleted) and an observed state (what the node's runtime or the
// provider last reported, as its workflow records it). The API changes
// the desired state and moves the observed one to the matching
// in-between state (starting, stopping, resizing, deleting); the
// instance's workflow moves it on to the settled state once the runtime
// reports it.
//
//	draft     -> denied | creating | failed        (the admission)
//	creating  -> running | stopped | failed | deleting
//	running   -> stopping | resizing | deleting | failed
//	stopping  -> stopped | failed | deleting
//	stopped   -> starting | resizing | deleting
//	starting  -> running | failed | deleting
//	resizing  -> running | stopped | failed | deleting
//	failed    -> starting | stopping | deleting
//	deleting  -> deleted
//
// denied and deleted are terminal; pending is a draft the decision
// allowed whose placement has not committed (never seen outside the
// admission).
package instances

import (
	"fmt"
	"slices"

	"github.com/better-compute/better-compute/core"
)

// IDPrefix starts every instance id.
const IDPrefix = "inst"

// ResourceType is the catalog type an instance is decided on.
const ResourceType = "instance"

// Desired is what the owner asked an instance to be.
type Desired string

// The desired states.
const (
	DesiredRunning Desired = "running"
	DesiredStopped Desired = "stopped"
	DesiredDeleted Desired = "deleted"
)

// Enum implements core.Enumerated.
func (Desired) Enum() []string { return []string{"running", "stopped", "deleted"} }

// State is an instance's observed state.
type State string

// The observed states.
const (
	Draft    State = "draft"
	Denied   State = "denied"
	Pending  State = "pending"
	Creating State = "creating"
	Running  State = "running"
	Stopping State = "stopping"
	Stopped  State = "stopped"
	Starting State = "starting"
	Resizing State = "resizing"
	Deleting State = "deleting"
	Deleted  State = "deleted"
	Failed   State = "failed"
)

// States lists every state, in lifecycle order.
var States = []State{Draft, Denied, Pending, Creating, Running, Stopping, Stopped, Starting, Resizing, Deleting, Deleted, Failed}

// Enum implements core.Enumerated.
func (State) Enum() []string {
	out := make([]string, len(States))
	for i, s := range States {
		out[i] = string(s)
	}
	return out
}

// Terminal says whether nothing follows s.
func Terminal(s State) bool { return s == Denied || s == Deleted }

// Settled says whether s is what desired asks, so the workflow has nothing
// left to converge.
func Settled(s State, d Desired) bool {
	switch d {
	case DesiredRunning:
		return s == Running
	case DesiredStopped:
		return s == Stopped
	case DesiredDeleted:
		return s == Deleted
	}
	return false
}

// Method is an instance method whose effect depends on the state.
type Method string

// The methods of the table.
const (
	MethodStart  Method = "start"
	MethodStop   Method = "stop"
	MethodResize Method = "resize"
	MethodDelete Method = "delete"
)

// Effect is what a method does in a state.
type Effect int

// Effects: refused (INVALID_STATE), already done (the call answers the
// instance unchanged), or applied (the desired state changes and the
// state moves to Rule.To).
const (
	Refused Effect = iota
	AlreadyDone
	Applied
)

// Rule is one cell of the table: the effect, and the state an applied
// call moves the instance to.
type Rule struct {
	Effect Effect
	To     State
}

// table is the one table of which method is allowed in which state. A
// state a method's row does not name refuses it.
var table = map[Method]map[State]Rule{
	MethodStart: {
		Stopped:  {Applied, Starting},
		Stopping: {Applied, Starting},
		Failed:   {Applied, Starting},
		Running:  {AlreadyDone, ""},
		Starting: {AlreadyDone, ""},
		Creating: {AlreadyDone, ""},
	},
	MethodStop: {
		Running:  {Applied, Stopping},
		Starting: {Applied, Stopping},
		Creating: {Applied, Stopping},
		Failed:   {Applied, Stopping},
		Stopped:  {AlreadyDone, ""},
		Stopping: {AlreadyDone, ""},
	},
	MethodResize: {
		Running: {Applied, Resizing},
		Stopped: {Applied, Resizing},
	},
	MethodDelete: {
		Creating: {Applied, Deleting},
		Running:  {Applied, Deleting},
		Stopping: {Applied, Deleting},
		Stopped:  {Applied, Deleting},
		Starting: {Applied, Deleting},
		Resizing: {Applied, Deleting},
		Failed:   {Applied, Deleting},
		Deleting: {AlreadyDone, ""},
		Deleted:  {AlreadyDone, ""},
	},
}

// Check answers what m does in state s: INVALID_STATE (details reason
// "state", the state and the states that allow it) when the table refuses
// it.
func Check(m Method, s State) (Rule, error) {
	r, ok := table[m][s]
	if ok {
		return r, nil
	}
	var allowed []string
	for st, rule := range table[m] {
		if rule.Effect == Applied {
			allowed = append(allowed, string(st))
		}
	}
	slices.Sort(allowed)
	return Rule{}, core.Errorf(core.CodeInvalidState, "instances.%s is not allowed while the instance is %s", m, s).
		WithDetails(map[string]any{"reason": "state", "state": string(s), "allowedIn": allowed})
}

// DesiredAfter is the desired state an applied m sets (resize keeps the
// current one).
func DesiredAfter(m Method, current Desired) Desired {
	switch m {
	case MethodStart:
		return DesiredRunning
	case MethodStop:
		return DesiredStopped
	case MethodDelete:
		return DesiredDeleted
	}
	return current
}

// Next is the state the workflow records for what the runtime reports:
// observed is the runtime's state ("running", "stopped", "failed",
// "creating", or "gone" for an instance a full report no longer holds)
// at generation observedGen; gen is the instance's generation. It answers
// the current state when the report says nothing new; a deleted
// instance's end is the workflow's (FinishDelete), never Next's.
func Next(current State, desired Desired, gen int64, observed string, observedGen int64) State {
	if Terminal(current) || current == Draft || current == Pending || desired == DesiredDeleted {
		return current
	}
	if observedGen < gen {
		return current // an answer to an older spec
	}
	switch {
	case observed == "running" && desired == DesiredRunning:
		return Running
	case observed == "stopped" && desired == DesiredStopped:
		return Stopped
	}
	return current
}

// ObservedGone is the observed state of an instance a full report of its
// node no longer holds.
const ObservedGone = "gone"

// Validate checks a state's name.
func Validate(s string) error {
	if !slices.Contains(States, State(s)) {
		return fmt.Errorf("instances: unknown state %q", s)
	}
	return nil
}

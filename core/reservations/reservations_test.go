package reservations

import (
	"testing"

	"github.com/better-compute/better-compute/core"
)

// allowed is the lifecycle written out edge by edge, independently of the
// table: every (from, to) pair is checked against it.
var allowed = map[[2]State]bool{
	{Draft, Denied}: true, {Draft, Pending}: true, {Draft, AwaitingConfirmation}: true,
	{AwaitingConfirmation, Pending}: true, {AwaitingConfirmation, Cancelled}: true, {AwaitingConfirmation, Expired}: true,
	{Pending, Placed}: true, {Pending, Failed}: true, {Pending, Cancelled}: true, {Pending, Expired}: true,
	{Placed, Binding}: true, {Placed, Failed}: true, {Placed, Cancelled}: true, {Placed, Expired}: true,
	{Binding, Active}: true, {Binding, Failed}: true, {Binding, Cancelled}: true,
	{Active, Releasing}: true, {Active, Expired}: true,
	{Expired, Releasing}:  true,
	{Releasing, Released}: true, {Releasing, Failed}: true,
}

func TestEveryPair(t *testing.T) {
	if len(States) != 12 {
		t.Fatalf("%d states, want 12", len(States))
	}
	n := 0
	for _, from := range States {
		for _, to := range States {
			want := allowed[[2]State{from, to}]
			if got := CanTransition(from, to); got != want {
				t.Errorf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
			err := Transition(from, to)
			if want != (err == nil) {
				t.Errorf("Transition(%s, %s) = %v", from, to, err)
			}
			if err != nil && core.AsError(err).Code != core.CodeInvalidState {
				t.Errorf("Transition(%s, %s) code %s", from, to, core.AsError(err).Code)
			}
			if want {
				n++
			}
		}
	}
	if n != len(allowed) {
		t.Fatalf("%d edges allowed, want %d", n, len(allowed))
	}
	for _, s := range []State{Denied, Released, Failed, Cancelled} {
		if !Terminal(s) {
			t.Errorf("%s is not terminal", s)
		}
	}
	if CanTransition("bogus", Pending) || CanTransition(Draft, "bogus") || Valid("bogus") {
		t.Fatal("an unknown state has an edge")
	}
}

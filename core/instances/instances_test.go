package instances

import (
	"testing"

	"github.com/better-compute/better-compute/core"
)

func TestCheck(t *testing.T) {
	cases := []struct {
		m      Method
		s      State
		effect Effect
		to     State
	}{
		{MethodStart, Stopped, Applied, Starting},
		{MethodStart, Running, AlreadyDone, ""},
		{MethodStart, Deleting, Refused, ""},
		{MethodStop, Running, Applied, Stopping},
		{MethodStop, Stopped, AlreadyDone, ""},
		{MethodStop, Resizing, Refused, ""},
		{MethodResize, Running, Applied, Resizing},
		{MethodResize, Stopped, Applied, Resizing},
		{MethodResize, Starting, Refused, ""},
		{MethodDelete, Failed, Applied, Deleting},
		{MethodDelete, Deleted, AlreadyDone, ""},
		{MethodDelete, Draft, Refused, ""},
	}
	for _, tc := range cases {
		t.Run(string(tc.m)+" in "+string(tc.s), func(t *testing.T) {
			r, err := Check(tc.m, tc.s)
			if tc.effect == Refused {
				if ce := core.AsError(err); ce.Code != core.CodeInvalidState || ce.Details["reason"] != "state" {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err != nil || r.Effect != tc.effect || r.To != tc.to {
				t.Fatalf("rule = %+v, %v", r, err)
			}
		})
	}
}

func TestNext(t *testing.T) {
	cases := []struct {
		name        string
		current     State
		desired     Desired
		gen         int64
		observed    string
		observedGen int64
		want        State
	}{
		{"running reported", Creating, DesiredRunning, 1, "running", 1, Running},
		{"an older spec's answer", Stopping, DesiredStopped, 3, "running", 2, Stopping},
		{"stopped reported", Stopping, DesiredStopped, 2, "stopped", 2, Stopped},
		{"running while stop is asked", Stopping, DesiredStopped, 2, "running", 2, Stopping},
		{"deleted desired is the workflow's", Deleting, DesiredDeleted, 2, "stopped", 2, Deleting},
		{"failed report keeps converging", Starting, DesiredRunning, 2, "failed", 2, Starting},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Next(tc.current, tc.desired, tc.gen, tc.observed, tc.observedGen); got != tc.want {
				t.Fatalf("Next = %s, want %s", got, tc.want)
			}
		})
	}
}

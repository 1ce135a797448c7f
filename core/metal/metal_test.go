package metal

import (
	"slices"
	"testing"

	"github.com/better-compute/better-compute/core/nodes"
)

// Every operation has one row, every state a row names is the domain
// model's, and every in-flight state has a deadline.
func TestTableIsComplete(t *testing.T) {
	for _, op := range Operations {
		n := 0
		for _, e := range Table {
			if e.Operation == op {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s has %d rows", op, n)
		}
	}
	for _, e := range Table {
		states := append(slices.Clone(e.From), e.During, e.To, e.RecoverTo)
		for _, s := range states {
			if s != "" && !slices.Contains(nodes.ProvisionStates, s) {
				t.Errorf("%s names %q, not a provision state", e.Operation, s)
			}
		}
		if e.During != "" {
			if _, ok := DefaultDeadlines[e.During]; !ok {
				t.Errorf("%s runs in %s, which has no deadline", e.Operation, e.During)
			}
		}
		if len(e.Steps) == 0 {
			t.Errorf("%s has no steps", e.Operation)
		}
	}
}

func TestAllowed(t *testing.T) {
	cases := []struct {
		state              nodes.ProvisionState
		managed, inspected bool
		want               []Operation
	}{
		{nodes.Enrolling, false, false, []Operation{Manage, Retire}},
		{nodes.Enrolling, true, false, []Operation{Manage, Inspect, Retire, Power}},
		{nodes.Enrolling, true, true, []Operation{Manage, Inspect, Provide, Retire, Power}},
		{nodes.Ready, true, true, []Operation{Inspect, Deploy, Retire, Power}},
		{nodes.Deployed, true, true, []Operation{Undeploy, Rescue, Power}},
		{nodes.Rescue, true, true, []Operation{Unrescue, Power}},
		{nodes.Failed, true, true, []Operation{Retire, Recover, Power}},
		{nodes.Retired, true, true, nil},
		{nodes.Adopted, true, true, nil},
	}
	for _, c := range cases {
		if got := Allowed(c.state, c.managed, c.inspected); !slices.Equal(got, c.want) {
			t.Errorf("Allowed(%s, managed %v, inspected %v) = %v, want %v", c.state, c.managed, c.inspected, got, c.want)
		}
	}
}

func TestTargets(t *testing.T) {
	inspect, _ := EdgeOf(Inspect)
	if got := inspect.Target(nodes.Ready); got != nodes.Ready {
		t.Errorf("inspect from ready ends in %s", got)
	}
	if got := inspect.DuringFrom(nodes.Ready); got != nodes.Inspecting {
		t.Errorf("inspect runs in %s", got)
	}
	provide, _ := EdgeOf(Provide)
	if got := provide.RecoveryFrom(nodes.Enrolling); got != nodes.Enrolling {
		t.Errorf("a failed provide recovers to %s", got)
	}
	power, _ := EdgeOf(Power)
	if got := power.DuringFrom(nodes.Deployed); got != nodes.Deployed {
		t.Errorf("power runs in %s", got)
	}
}

// A retry runs a failed deploy's provisioning workflow again: from failed,
// deploying while it runs, deployed when it succeeds, ready on recover;
// it is no metal.* operation, so the allowed lists leave it out.
func TestRetryEdge(t *testing.T) {
	e, ok := EdgeOf(Retry)
	if !ok || !slices.Equal(e.Steps, []string{StepProvision}) || e.During != nodes.Deploying ||
		e.Target(nodes.Failed) != nodes.Deployed || e.RecoveryFrom(nodes.Failed) != nodes.Ready {
		t.Fatalf("retry edge %+v", e)
	}
	if !Allows(Retry, nodes.Failed, true, true) || Allows(Retry, nodes.Ready, true, true) {
		t.Fatal("retry is allowed from failed only")
	}
	if slices.Contains(Allowed(nodes.Failed, true, true), Retry) {
		t.Fatal("retry is listed among the metal operations")
	}
	deploy, _ := EdgeOf(Deploy)
	if !slices.Equal(deploy.Steps, []string{StepProvision}) {
		t.Fatalf("deploy steps %q", deploy.Steps)
	}
}

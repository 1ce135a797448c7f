package api_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/agent/commands"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// A reservation answers the id of the workflow that drives it; once
// active, each allocation answers the CDI names the node's agent defines
// for it (the spec agent/commands builds from the cdi.expose command) and
// the node's address, under the reservation's own read decision.
func TestActiveReservationSaysHowToReachItsDevices(t *testing.T) {
	de := newDeadNodeEnv(t)
	p, n := h100Pool(t, de.env)
	r := de.reserveNow(p.ID, "reach", 2)
	if r.WorkflowID != r.ID {
		t.Fatalf("workflowId = %q, want the reservation id %s", r.WorkflowID, r.ID)
	}

	// Binding: nothing is exposed yet, so nothing is said.
	de.bind(r.ID)
	if got := de.get(r.ID); got.WorkflowID != r.ID || got.Allocations[0].CDIDevices != nil || got.Allocations[0].NodeAddress != "" {
		t.Fatalf("while binding: %+v", got)
	}

	// The agent ran cdi.expose: the reservation goes active.
	var args []byte
	if err := de.store.Pool.QueryRow(context.Background(), `UPDATE node_commands SET state = 'succeeded', result_at = now()
		WHERE node_id = $1 AND kind = 'cdi.expose' RETURNING args`, n.ID).Scan(&args); err != nil {
		t.Fatal(err)
	}
	if st, err := de.act.MarkActive(context.Background(), "acme", r.ID); err != nil || st != "active" {
		t.Fatalf("activate = %q, %v", st, err)
	}
	var expose struct {
		Devices []int  `json:"devices"`
		Kind    string `json:"kind"`
	}
	if err := json.Unmarshal(args, &expose); err != nil || len(expose.Devices) != 2 {
		t.Fatalf("cdi.expose args %s: %v", args, err)
	}
	spec := commands.BuildCDISpec(r.ID, expose.Kind, expose.Devices)
	var defined []string
	for _, d := range spec.Devices {
		defined = append(defined, spec.Kind+"="+d.Name)
	}

	got := de.get(r.ID)
	if got.State != "active" || len(got.Allocations) != 1 {
		t.Fatalf("active: %+v", got)
	}
	a := got.Allocations[0]
	if !slices.Equal(a.CDIDevices, defined) || a.CDIDevices[0] != "nvidia.com/gpu="+r.ID+"-0" {
		t.Fatalf("cdiDevices = %v, want the spec's %v", a.CDIDevices, defined)
	}
	if a.NodeAddress != "gpu-h100-a07" { // the fixture inventory's system.hostname
		t.Fatalf("nodeAddress = %q", a.NodeAddress)
	}

	// Another tenant reads nothing of it: the one decision on the
	// reservation covers its devices and address.
	if _, err := reservations.Get.Call(context.Background(), de.client(de.globex),
		reservations.ReservationInput{TenantID: "globex", ReservationID: r.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex get = %v, want NOT_FOUND", err)
	}
	if got := de.commandStates(n.ID, store.CommandCDIExpose); !slices.Equal(got, []string{"succeeded"}) {
		t.Fatalf("cdi.expose commands: %v", got)
	}
}

package temporal

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	reservationsact "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/workers"
)

// The embedded server registers the control plane's search attributes, so
// an operator finds a reservation's workflow by its tenant (no worker runs:
// the start alone makes the visibility record).
func TestReservationWorkflowFoundByTenant(t *testing.T) {
	ctx := testContext(t)
	s := startServer(ctx, t, Options{Namespaces: []string{"better-compute"}, Logger: testLogger()})
	c := dial(ctx, t, s.FrontendAddr(), "better-compute")

	p := reservationsact.ReservationParams{TenantID: "acme", ReservationID: "res_visible", PoolID: "pool_a",
		Start: time.Now().Add(time.Hour).UnixMilli(), End: time.Now().Add(2 * time.Hour).UnixMilli()}
	if err := reservationsact.StartReservation(ctx, c, "no-worker", p); err != nil {
		t.Fatalf("start reservation workflow: %v", err)
	}
	other := p
	other.TenantID, other.ReservationID = "globex", "res_other"
	if err := reservationsact.StartReservation(ctx, c, "no-worker", other); err != nil {
		t.Fatalf("start the other tenant's reservation workflow: %v", err)
	}

	testutil.EventuallyNil(t, time.Minute, func() error {
		resp, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Query: `TenantId = "acme" AND PoolId = "pool_a" AND State = "placed"`,
		})
		if err != nil {
			return err
		}
		if n := len(resp.Executions); n != 1 || resp.Executions[0].GetExecution().GetWorkflowId() != p.ReservationID {
			return fmt.Errorf("found %d workflows for tenant acme, want %s alone", n, p.ReservationID)
		}
		var tenant string
		if err := converter.GetDefaultDataConverter().FromPayload(resp.Executions[0].GetMemo().GetFields()["tenantId"], &tenant); err != nil || tenant != "acme" {
			return fmt.Errorf("memo tenantId = %q (%v), want acme", tenant, err)
		}
		return nil
	})
}

// callerWorkflow answers its "who" update with the caller it was sent by.
func callerWorkflow(ctx workflow.Context) error {
	done := false
	if err := workflow.SetUpdateHandler(ctx, "who", func(ctx workflow.Context) (string, error) {
		done = true
		return visibility.Caller(ctx), nil
	}); err != nil {
		return err
	}
	return workflow.Await(ctx, func() bool { return done })
}

// The processes' Temporal client (workers.Dial) carries the API caller's
// identity with an update, and the workflow's update handler reads it.
func TestUpdateCarriesTheCaller(t *testing.T) {
	ctx := testContext(t)
	s := startServer(ctx, t, Options{Namespaces: []string{"better-compute"}, Logger: testLogger()})
	c, err := workers.Dial(ctx, workers.TemporalConfig{Address: s.FrontendAddr(), Namespace: "better-compute"}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	w := worker.New(c, "caller-test", worker.Options{})
	w.RegisterWorkflowWithOptions(callerWorkflow, workflow.RegisterOptions{Name: "callerWorkflow"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "caller-1", TaskQueue: "caller-test"}, "callerWorkflow")
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.UpdateWorkflow(visibility.WithCaller(ctx, "idn_alice"), client.UpdateWorkflowOptions{
		WorkflowID: run.GetID(), UpdateName: "who", WaitForStage: client.WorkflowUpdateStageCompleted})
	if err != nil {
		t.Fatal(err)
	}
	var who string
	if err := h.Get(ctx, &who); err != nil || who != "idn_alice" {
		t.Fatalf("the update handler saw caller %q (%v), want idn_alice", who, err)
	}
	if err := run.Get(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// The doctor's check names the search attributes a namespace lacks.
func TestMissingSearchAttributes(t *testing.T) {
	ctx := testContext(t)
	s := startServer(ctx, t, Options{Namespaces: []string{"registered"}, Logger: testLogger()})
	c := dial(ctx, t, s.FrontendAddr(), "registered")
	if missing, err := workers.MissingSearchAttributes(ctx, c, "registered"); err != nil || len(missing) != 0 {
		t.Fatalf("registered namespace lacks %v (%v)", missing, err)
	}
	bare := startServer(ctx, t, Options{Namespaces: []string{"bare"}, SearchAttributes: []string{}, Logger: testLogger()})
	bc := dial(ctx, t, bare.FrontendAddr(), "bare")
	missing, err := workers.MissingSearchAttributes(ctx, bc, "bare")
	if err != nil || !slices.Equal(missing, visibility.Keywords()) {
		t.Fatalf("a server registering none lacks %v (%v), want %v", missing, err, visibility.Keywords())
	}
}

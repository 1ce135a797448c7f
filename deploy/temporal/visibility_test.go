package temporal

import (
	"fmt"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"

	reservationsact "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/internal/testutil"
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

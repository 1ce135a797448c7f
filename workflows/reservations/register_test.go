package reservations

import (
	"maps"
	"slices"
	"testing"

	activities "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/internal/temporaltest"
)

// The names are persisted in running workflows' histories: they are
// written out here, not taken from the constants, so renaming one fails.
func TestRegisterKeepsThePersistedNames(t *testing.T) {
	r := temporaltest.NewRegistry()
	Register(r, &activities.Reservations{})
	if want := []string{"ReservationWorkflow", "ReconcileReservationsWorkflow"}; !slices.Equal(r.Workflows, want) {
		t.Errorf("workflows = %q, want %q", r.Workflows, want)
	}
	want := map[string]string{ // registered name -> method
		"ReservationBind":          "Bind",
		"ReservationBindStatus":    "BindStatus",
		"ReservationFailBinding":   "FailBinding",
		"ReservationMarkActive":    "MarkActive",
		"ReservationExpire":        "Expire",
		"ReservationRelease":       "Release",
		"ReservationReleaseLapsed": "ReleaseLapsed",
		"ReservationState":         "State",
		"ReservationsReconcile":    "Reconcile",
	}
	if len(r.Activities) != len(want) || !maps.Equal(r.Methods, want) {
		t.Errorf("activities = %q (%v), want %v", r.Activities, r.Methods, want)
	}
	// Running workflows are updated, signalled and scheduled by name too.
	for got, want := range map[string]string{
		activities.UpdateRenew: "renew", activities.UpdateRelease: "release", activities.UpdateExtend: "extend",
		activities.SignalCancel: "cancel", activities.SignalChanged: "changed", activities.ReconcileReservationsScheduleID: "reservations-reconciler",
	} {
		if got != want {
			t.Errorf("name %q, want %q", got, want)
		}
	}
}

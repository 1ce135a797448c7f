package workers

import (
	"maps"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/internal/temporaltest"
)

// Every workflow and activity of the control-plane queue, under the names
// running workflows' histories hold. A workflow calls an activity by method
// value and the worker maps the method's name back to the registered one,
// one map for the whole worker: two domains' activities with the same method
// name would run each other's.
func TestControlPlaneRegistersEveryDomainOnce(t *testing.T) {
	r := temporaltest.NewRegistry()
	registerControlPlane(r, nil, Deps{})
	wantWorkflows := []string{"CloudResourceWorkflow", "CommandBatchWorkflow", "FleetApplyWorkflow", "HealthCheck", "InstanceWorkflow", "MetalBulkWorkflow", "MetalLifecycleWorkflow", "NodeDrainWorkflow",
		"ReconcileCloudResourcesWorkflow", "ReconcileCommandBatchesWorkflow", "ReconcileFleetAppliesWorkflow", "ReconcileInstancesWorkflow", "ReconcileMetalWorkflow", "ReconcileReservationsWorkflow", "ReconcileRolloutsWorkflow", "ReconcileSandboxesWorkflow", "ReconcileWebhooksWorkflow", "ReservationWorkflow", "RolloutWorkflow", "SandboxWarmPoolWorkflow", "SandboxWorkflow", "SiteHealthWorkflow", "WebhookWorkflow"}
	if got := slices.Sorted(slices.Values(r.Workflows)); !slices.Equal(got, wantWorkflows) {
		t.Errorf("workflows = %q, want %q", got, wantWorkflows)
	}
	wantActivities := []string{"CloudResourceReconcile", "CloudResourcesReconcileAll", "CommandBatchStep", "CommandBatchesReconcile", "FleetApplyChange", "FleetFinish", "FleetPending", "FleetReconcile", "HealthEcho", "InstanceConverge", "InstanceConvergeProvider", "InstanceMarkFailed",
		"InstancesReconcile", "MetalAccept", "MetalAwaitOutcome", "MetalBeginStep", "MetalBootProgress",
		"MetalCheckImage", "MetalCheckRejoin", "MetalCloseBoot", "MetalEndStep", "MetalEnqueueNodeCommand", "MetalFail",
		"MetalFinish", "MetalHandRamdiskStep", "MetalIngestInspection", "MetalLoad", "MetalLoadWorkflow", "MetalMarkStarted",
		"MetalNewBoot", "MetalNodeCommand", "MetalReconcile", "MetalRevokeIdentities", "MetalSetPower", "MetalSetStep", "MetalStartNode",
		"NodeDrainStep", "NodeMarkDrained", "ReservationBind",
		"ReservationBindStatus", "ReservationExpire", "ReservationFailBinding", "ReservationMarkActive",
		"ReservationRelease", "ReservationReleaseLapsed", "ReservationState", "ReservationsReconcile", "RolloutStep", "RolloutsReconcile", "SandboxStep", "SandboxWarmPoolTopUp", "SandboxesReconcile", "WebhookDeliver", "WebhooksReconcile"}
	if got := slices.Sorted(slices.Values(r.Activities)); !slices.Equal(got, wantActivities) {
		t.Errorf("activities = %q, want %q", got, wantActivities)
	}
	byMethod := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(r.Methods)) {
		m := r.Methods[name]
		if other, ok := byMethod[m]; ok {
			t.Errorf("activities %s and %s are both method %s", other, name, m)
		}
		byMethod[m] = name
	}
}

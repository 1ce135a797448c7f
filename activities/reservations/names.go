package reservations

import (
	"context"
	"errors"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/activities/visibility"
)

// Names of the reservation workflows, their updates, signal, activities and
// schedule. They are persisted in workflow histories and schedules, and the
// API starts, updates and signals the workflows by them, so they never
// change. They live here, not with the workflows, because activities start
// (Reconcile), update and signal (the node drain) reservation workflows too.
const (
	ReservationWorkflowName = "ReservationWorkflow"
	// UpdateRenew renews an active reservation's allocation lease; it
	// returns the new lease deadline (epoch ms).
	UpdateRenew = "renew"
	// UpdateRelease releases an active reservation; it returns once the
	// reservation is released.
	UpdateRelease = "release"
	// UpdateExtend moves the reservation's end (epoch ms) later, once the
	// API has booked the extra time; it returns the new end.
	UpdateExtend = "extend"
	// SignalCancel tells the workflow of a reservation the API cancelled
	// before it became active, so it stops waiting for the start.
	SignalCancel = "cancel"
	// SignalChanged tells the workflow that its reservation's row changed
	// outside it (released or cancelled by the API without a live run, or
	// failed because its node was lost), so it reads the row again.
	SignalChanged = "changed"

	ActivityBind          = "ReservationBind"
	ActivityBindStatus    = "ReservationBindStatus"
	ActivityFailBinding   = "ReservationFailBinding"
	ActivityMarkActive    = "ReservationMarkActive"
	ActivityExpire        = "ReservationExpire"
	ActivityRelease       = "ReservationRelease"
	ActivityReleaseLapsed = "ReservationReleaseLapsed"
	ActivityState         = "ReservationState"

	// The reconciler: a Temporal schedule runs ReconcileReservationsWorkflow,
	// whose one activity starts the workflows of live reservations that
	// have none running (the API crashed between committing the placement
	// and starting the workflow, or the run was terminated, cancelled or
	// lost), and sweeps stale drafts.
	ReconcileReservationsWorkflowName = "ReconcileReservationsWorkflow"
	ReconcileReservationsScheduleID   = "reservations-reconciler"
	ActivityReconcile                 = "ReservationsReconcile"
)

// ReservationParams starts a ReservationWorkflow. Start and End are epoch
// ms; LeaseSeconds > 0 makes the allocation a lease, released unless renewed
// within every period. Active and LeaseDeadline are carried over a
// continue-as-new and are zero on the first run.
type ReservationParams struct {
	TenantID      string
	ReservationID string
	// PoolID is what operators find the workflow by (the PoolId search
	// attribute); runs started before it was carried have none.
	PoolID        string
	Start         int64
	End           int64
	LeaseSeconds  int64
	Active        bool
	LeaseDeadline int64
	// BindTimeout bounds the binding (0: the workflow's default).
	BindTimeout time.Duration
}

// ReservationResult is how the workflow ended: the reservation's final
// state and why ("end", "release", "lease" or "cancel").
type ReservationResult struct {
	State  string
	Reason string
}

// WorkflowState is what a reservation's workflow answers the state query
// (visibility.QueryState) with: its state as the run knows it ("placed"
// until the activation, "active", then how it ended), its window and
// lease deadline (epoch ms) and what it was asked.
type WorkflowState struct {
	State            string `json:"state"`
	Start            int64  `json:"start"`
	End              int64  `json:"end"`
	LeaseDeadline    int64  `json:"leaseDeadline,omitempty"`
	ReleaseRequested bool   `json:"releaseRequested"`
	// ReleaseRequestedBy is the identity id of the API caller whose
	// release update the run took (visibility.Caller).
	ReleaseRequestedBy string `json:"releaseRequestedBy,omitempty"`
	Cancelled          bool   `json:"cancelled"`
}

// ExpireResult is what the expiry activity found: Released when the
// reservation ran past its end and is now ended (State says how: released,
// or the state it was ended in outside the workflow), otherwise the row's
// (extended) End, epoch ms.
type ExpireResult struct {
	Released bool
	State    string
	End      int64
}

// RowState is a reservation's row as the State activity reads it: its
// state, whether that is terminal, and its end reason once it has one.
type RowState struct {
	State     string
	Terminal  bool
	EndReason string
}

// StartReservation starts the workflow of a live reservation (workflow id
// = the reservation id) on taskQueue. A running workflow is kept (one run
// per reservation at a time); one that closed (finished, failed,
// terminated, cancelled or timed out) is started again from p, so callers
// start only reservations whose row is live: PostgreSQL is the truth, and
// a live row needs a running workflow.
//
// The run carries the TenantId, PoolId and State search attributes and a
// memo (activities/visibility), so operators find it in Temporal.
func StartReservation(ctx context.Context, c client.Client, taskQueue string, p ReservationParams) error {
	state := "placed"
	if p.Active {
		state = "active"
	}
	fields := visibility.Fields{TenantID: p.TenantID, PoolID: p.PoolID, State: state}
	_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       p.ReservationID,
		TaskQueue:                taskQueue,
		TypedSearchAttributes:    fields.SearchAttributes(),
		Memo:                     fields.Memo("reservation"),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, ReservationWorkflowName, p)
	var done *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &done) {
		return nil
	}
	return err
}

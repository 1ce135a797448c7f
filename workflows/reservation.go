package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/better-compute/better-compute/core"
)

// Names of the reservation workflow, its updates and its activities, as the
// worker registers them and the API starts and updates them.
const (
	ReservationWorkflowName = "ReservationWorkflow"
	// UpdateRenew renews an active reservation's allocation lease; it
	// returns the new lease deadline (epoch ms).
	UpdateRenew = "renew"
	// UpdateRelease releases an active reservation; it returns once the
	// reservation is released.
	UpdateRelease = "release"

	ActivityMarkActive = "ReservationMarkActive"
	ActivityExpire     = "ReservationExpire"
	ActivityRelease    = "ReservationRelease"
)

// reservationMaxRenewals bounds one run's history: after this many renewals
// the workflow continues as new, carrying its state (a var so tests can
// lower it).
var reservationMaxRenewals = 500

// ReservationParams starts a ReservationWorkflow. Start and End are epoch
// ms; LeaseSeconds > 0 makes the allocation a lease, released unless renewed
// within every period. Active and LeaseDeadline are carried over a
// continue-as-new and are zero on the first run.
type ReservationParams struct {
	TenantID      string
	ReservationID string
	Start         int64
	End           int64
	LeaseSeconds  int64
	Active        bool
	LeaseDeadline int64
}

// ReservationResult is how the workflow ended: the reservation's final
// state and why ("end", "release" or "lease").
type ReservationResult struct {
	State  string
	Reason string
}

// ReservationWorkflow drives one placed reservation through its window; its
// workflow id is the reservation id. It waits (a durable timer) until Start,
// activates the reservation (placed -> binding -> active), then waits for
// the first of: End (expired, then released), a release update (released)
// or, with a lease, a period passing without a renew update (released).
// Every state change is an activity writing PostgreSQL; the workflow only
// orchestrates.
func ReservationWorkflow(ctx workflow.Context, p ReservationParams) (ReservationResult, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumInterval: time.Minute},
	})
	state := "placed"
	if p.Active {
		state = "active"
	}
	releaseRequested := false
	renewed := false
	renewals := 0
	var finished bool
	var finishErr error
	leaseMs := p.LeaseSeconds * 1000

	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateRenew,
		func(ctx workflow.Context) (int64, error) {
			p.LeaseDeadline = workflow.Now(ctx).UnixMilli() + leaseMs
			renewals++
			renewed = true
			return p.LeaseDeadline, nil
		},
		workflow.UpdateHandlerOptions{Validator: func(ctx workflow.Context) error {
			if p.LeaseSeconds <= 0 {
				return invalidState(fmt.Sprintf("reservation %s has no lease to renew", p.ReservationID))
			}
			if state != "active" || releaseRequested {
				return invalidState(fmt.Sprintf("reservation %s is %s, not active", p.ReservationID, state))
			}
			return nil
		}},
	); err != nil {
		return ReservationResult{}, err
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateRelease,
		func(ctx workflow.Context) (string, error) {
			releaseRequested = true
			if err := workflow.Await(ctx, func() bool { return finished }); err != nil {
				return "", err
			}
			return state, finishErr
		},
		workflow.UpdateHandlerOptions{Validator: func(ctx workflow.Context) error {
			if state != "active" || releaseRequested {
				return invalidState(fmt.Sprintf("reservation %s is %s, not active", p.ReservationID, state))
			}
			return nil
		}},
	); err != nil {
		return ReservationResult{}, err
	}

	finish := func(activity, final, reason string) (ReservationResult, error) {
		finishErr = workflow.ExecuteActivity(ctx, activity, p.TenantID, p.ReservationID).Get(ctx, nil)
		if finishErr == nil {
			state = final
		}
		finished = true
		// Let a waiting release update answer before the run ends.
		if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
			return ReservationResult{}, err
		}
		return ReservationResult{State: state, Reason: reason}, finishErr
	}

	if !p.Active {
		if wait := time.Duration(p.Start-workflow.Now(ctx).UnixMilli()) * time.Millisecond; wait > 0 {
			if err := workflow.Sleep(ctx, wait); err != nil {
				return ReservationResult{}, err
			}
		}
		if err := workflow.ExecuteActivity(ctx, ActivityMarkActive, p.TenantID, p.ReservationID).Get(ctx, nil); err != nil {
			return ReservationResult{State: state}, err
		}
		state = "active"
		p.Active = true
		if leaseMs > 0 {
			p.LeaseDeadline = workflow.Now(ctx).UnixMilli() + leaseMs
		}
	}

	for {
		if releaseRequested {
			return finish(ActivityRelease, "released", "release")
		}
		now := workflow.Now(ctx).UnixMilli()
		if now >= p.End {
			return finish(ActivityExpire, "released", "end")
		}
		if leaseMs > 0 && now >= p.LeaseDeadline {
			return finish(ActivityRelease, "released", "lease")
		}
		if renewals >= reservationMaxRenewals {
			if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
				return ReservationResult{}, err
			}
			return ReservationResult{}, workflow.NewContinueAsNewError(ctx, ReservationWorkflowName, p)
		}
		wait := p.End - now
		if leaseMs > 0 && p.LeaseDeadline-now < wait {
			wait = p.LeaseDeadline - now
		}
		renewed = false
		if _, err := workflow.AwaitWithTimeout(ctx, time.Duration(wait)*time.Millisecond,
			func() bool { return releaseRequested || renewed }); err != nil {
			return ReservationResult{}, err
		}
	}
}

func invalidState(msg string) error {
	return temporal.NewApplicationError(msg, string(core.CodeInvalidState))
}

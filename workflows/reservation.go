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
	// UpdateExtend moves the reservation's end (epoch ms) later, once the
	// API has booked the extra time; it returns the new end.
	UpdateExtend = "extend"
	// SignalCancel tells the workflow of a reservation the API cancelled
	// before it became active, so it stops waiting for the start.
	SignalCancel = "cancel"

	ActivityBind        = "ReservationBind"
	ActivityBindStatus  = "ReservationBindStatus"
	ActivityFailBinding = "ReservationFailBinding"
	ActivityMarkActive  = "ReservationMarkActive"
	ActivityExpire      = "ReservationExpire"
	ActivityRelease     = "ReservationRelease"
)

// Binding: the node agents' cdi.expose commands are polled every bindPoll
// and must all succeed within the bind timeout (DefaultBindTimeout unless
// the parameters say otherwise), or the reservation fails.
const (
	DefaultBindTimeout = 5 * time.Minute
	bindPoll           = 2 * time.Second
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
	// BindTimeout bounds the binding (0: DefaultBindTimeout).
	BindTimeout time.Duration
}

// ReservationResult is how the workflow ended: the reservation's final
// state and why ("end", "release", "lease" or "cancel").
type ReservationResult struct {
	State  string
	Reason string
}

// ReservationWorkflow drives one placed reservation through its window; its
// workflow id is the reservation id. It waits (a durable timer) until Start,
// activates the reservation (placed -> binding -> active), then waits for
// the first of: End (expired, then released), a release update (released)
// or, with a lease, a period passing without a renew update (released).
// Every state change is an activity writing PostgreSQL, which stays the
// truth: an extension the workflow missed is found by the expiry activity
// (the row's end has moved), and a cancellation it missed by the
// activation activity (the row is cancelled). The workflow only
// orchestrates.
func ReservationWorkflow(ctx workflow.Context, p ReservationParams) (ReservationResult, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		// Each activity is one short transaction; a worker that dies in one
		// has it retried on another worker after this long.
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumInterval: time.Minute},
	})
	state := "placed"
	if p.Active {
		state = "active"
	}
	releaseRequested := false
	cancelled := false
	changed := false // a renew or an extend moved a deadline
	renewals := 0
	var finished bool
	var finishErr error
	leaseMs := p.LeaseSeconds * 1000

	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateRenew,
		func(ctx workflow.Context) (int64, error) {
			p.LeaseDeadline = workflow.Now(ctx).UnixMilli() + leaseMs
			renewals++
			changed = true
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
	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateExtend,
		func(ctx workflow.Context, end int64) (int64, error) {
			p.End = end
			changed = true
			return p.End, nil
		},
		workflow.UpdateHandlerOptions{Validator: func(ctx workflow.Context, end int64) error {
			if finished || releaseRequested || cancelled {
				return invalidState(fmt.Sprintf("reservation %s is ending", p.ReservationID))
			}
			if end <= p.End {
				return invalidState(fmt.Sprintf("reservation %s already ends at %d", p.ReservationID, p.End))
			}
			return nil
		}},
	); err != nil {
		return ReservationResult{}, err
	}
	workflow.Go(ctx, func(ctx workflow.Context) {
		workflow.GetSignalChannel(ctx, SignalCancel).Receive(ctx, nil)
		cancelled = true
	})

	// finish ends the run once the activity that releases the reservation
	// returned err, letting a waiting release update answer first.
	finish := func(err error, reason string) (ReservationResult, error) {
		finishErr, finished = err, true
		if err == nil {
			state = "released"
		}
		if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
			return ReservationResult{}, err
		}
		return ReservationResult{State: state, Reason: reason}, finishErr
	}
	release := func(reason string) (ReservationResult, error) {
		return finish(workflow.ExecuteActivity(ctx, ActivityRelease, p.TenantID, p.ReservationID).Get(ctx, nil), reason)
	}

	if !p.Active {
		if wait := time.Duration(p.Start-workflow.Now(ctx).UnixMilli()) * time.Millisecond; wait > 0 {
			if _, err := workflow.AwaitWithTimeout(ctx, wait, func() bool { return cancelled }); err != nil {
				return ReservationResult{}, err
			}
		}
		if cancelled {
			return ReservationResult{State: "cancelled", Reason: "cancel"}, nil
		}
		if res, done, err := bind(ctx, p, &cancelled); done || err != nil {
			return res, err
		}
		var became string
		if err := workflow.ExecuteActivity(ctx, ActivityMarkActive, p.TenantID, p.ReservationID).Get(ctx, &became); err != nil {
			return ReservationResult{State: state}, err
		}
		if became != "active" { // cancelled meanwhile; the signal may still be on its way
			return ReservationResult{State: became, Reason: "cancel"}, nil
		}
		state = "active"
		p.Active = true
		if leaseMs > 0 {
			p.LeaseDeadline = workflow.Now(ctx).UnixMilli() + leaseMs
		}
	}

	for {
		if releaseRequested {
			return release("release")
		}
		now := workflow.Now(ctx).UnixMilli()
		if now >= p.End {
			var end ExpireResult
			err := workflow.ExecuteActivity(ctx, ActivityExpire, p.TenantID, p.ReservationID).Get(ctx, &end)
			if err != nil || end.Released {
				return finish(err, "end")
			}
			p.End = end.End // extended, and the update did not reach this run
			if p.End <= now {
				// The database's clock is behind this workflow's: wait for it.
				if err := workflow.Sleep(ctx, time.Second); err != nil {
					return ReservationResult{}, err
				}
			}
			continue
		}
		if leaseMs > 0 && now >= p.LeaseDeadline {
			return release("lease")
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
		changed = false
		if _, err := workflow.AwaitWithTimeout(ctx, time.Duration(wait)*time.Millisecond,
			func() bool { return releaseRequested || changed }); err != nil {
			return ReservationResult{}, err
		}
	}
}

// bind moves the reservation to binding, which queues the node agents'
// cdi.expose commands, and waits until they all succeeded. done reports
// that the run ends here: cancelled meanwhile, or failed (a command failed,
// or the bind timeout passed), in which case the reservation is failed and
// its atoms freed.
func bind(ctx workflow.Context, p ReservationParams, cancelled *bool) (res ReservationResult, done bool, err error) {
	timeout := p.BindTimeout
	if timeout <= 0 {
		timeout = DefaultBindTimeout
	}
	var state string
	if err := workflow.ExecuteActivity(ctx, ActivityBind, p.TenantID, p.ReservationID, timeout).Get(ctx, &state); err != nil {
		return ReservationResult{State: "placed"}, true, err
	}
	switch state {
	case "cancelled":
		return ReservationResult{State: state, Reason: "cancel"}, true, nil
	case "active":
		return ReservationResult{}, false, nil
	}
	deadline := workflow.Now(ctx).Add(timeout)
	fail := func(reason string) (ReservationResult, bool, error) {
		err := workflow.ExecuteActivity(ctx, ActivityFailBinding, p.TenantID, p.ReservationID, reason).Get(ctx, nil)
		return ReservationResult{State: "failed", Reason: reason}, true, err
	}
	for {
		var status string
		if err := workflow.ExecuteActivity(ctx, ActivityBindStatus, p.TenantID, p.ReservationID).Get(ctx, &status); err != nil {
			return ReservationResult{State: "binding"}, true, err
		}
		switch status {
		case "bound":
			return ReservationResult{}, false, nil
		case "cancelled":
			return ReservationResult{State: status, Reason: "cancel"}, true, nil
		case "failed":
			return fail("bindFailed")
		}
		left := deadline.Sub(workflow.Now(ctx))
		if left <= 0 {
			return fail("bindTimeout")
		}
		if _, err := workflow.AwaitWithTimeout(ctx, min(left, bindPoll), func() bool { return *cancelled }); err != nil {
			return ReservationResult{}, true, err
		}
	}
}

// ExpireResult is what the expiry activity found: Released when the
// reservation ran past its end and is now released, otherwise the row's
// (extended) End, epoch ms.
type ExpireResult struct {
	Released bool
	End      int64
}

func invalidState(msg string) error {
	return temporal.NewApplicationError(msg, string(core.CodeInvalidState))
}

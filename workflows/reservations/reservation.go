// Package reservations holds the reservation workflows: ReservationWorkflow,
// which drives one reservation through its window, and the reconciler that
// starts the workflows whose start was lost. Their activities, names,
// parameters and results are in activities/reservations.
package reservations

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/core"
)

// Binding: the node agents' cdi.expose commands are polled every bindPoll
// and must all succeed within the bind timeout (DefaultBindTimeout unless
// the parameters say otherwise), or the reservation fails.
const (
	DefaultBindTimeout = 5 * time.Minute
	bindPoll           = 2 * time.Second
)

// maxWait bounds every timer the workflow arms: a wait computed from epoch
// milliseconds (a start or an end centuries ahead) saturates here instead
// of overflowing time.Duration's int64 nanoseconds into a negative or tiny
// wait. The workflow wakes after it and waits again.
const maxWait = 100 * 365 * 24 * time.Hour

// untilMs is the wait from now until t (both epoch ms): never negative,
// at most maxWait, whatever the inputs.
func untilMs(now, t int64) time.Duration {
	if t <= now {
		return 0
	}
	diff := uint64(t) - uint64(now) // t > now: exact even across int64's range
	if diff > uint64(maxWait/time.Millisecond) {
		return maxWait
	}
	return time.Duration(diff) * time.Millisecond
}

// reservationMaxRenewals bounds one run's history: after this many renewals
// the workflow continues as new, carrying its state (a var so tests can
// lower it).
var reservationMaxRenewals = 500

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
//
// It answers the state query (visibility.QueryState) with where it stands,
// and keeps the State search attribute at its state (runs started before
// that was added, told apart by the stateSearchAttribute version, do not).
func ReservationWorkflow(ctx workflow.Context, p activities.ReservationParams) (activities.ReservationResult, error) {
	// Upserting a search attribute is a command of its own, so a run whose
	// history predates it replays without.
	publishes := workflow.GetVersion(ctx, stateSearchAttribute, workflow.DefaultVersion, 1) >= 1
	published := ""
	publish := func(state string) {
		if !publishes || state == "" || state == published {
			return
		}
		if err := workflow.UpsertTypedSearchAttributes(ctx, visibility.SetState(state)); err != nil {
			workflow.GetLogger(ctx).Warn("could not set the State search attribute", "state", state, "error", err)
			return
		}
		published = state
	}
	if p.Active {
		published = "active" // the start set it
	} else {
		published = "placed"
	}
	res, err := driveReservation(ctx, p, publish)
	if err == nil {
		publish(res.State)
	}
	return res, err
}

// stateSearchAttribute is the change id of the State search attribute's
// upserts.
const stateSearchAttribute = "state-search-attribute"

// Timer summaries, as the Temporal UI shows each timer.
const (
	summaryAwaitStart    = "await start"
	summaryAwaitEnd      = "await end"
	summaryLeaseDeadline = "lease deadline"
	summaryBindPoll      = "await bind"
)

// awaitFor waits until cond holds or d passes, on a timer the UI names
// summary.
func awaitFor(ctx workflow.Context, d time.Duration, summary string, cond func() bool) error {
	_, err := workflow.AwaitWithOptions(ctx, workflow.AwaitOptions{Timeout: d, TimerOptions: workflow.TimerOptions{Summary: summary}}, cond)
	return err
}

// driveReservation is ReservationWorkflow's run; publish sets the State
// search attribute on each transition.
func driveReservation(ctx workflow.Context, p activities.ReservationParams, publish func(string)) (activities.ReservationResult, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		// Each activity is one short transaction; a worker that dies in one
		// has it retried on another worker after this long.
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{MaximumInterval: time.Minute},
	})
	var a *activities.Reservations // names the activities; the worker's instance runs them
	state := "placed"
	if p.Active {
		state = "active"
	}
	releaseRequested := false
	releaseRequestedBy := "" // the API caller's identity (visibility.Caller)
	// activating: the activation activity is in flight. PostgreSQL may show
	// the row active before this run does, so a release or renew the API
	// accepted on that row is taken and waits for the activation to land.
	activating := false
	live := func() bool { return state == "active" || (state == "placed" && activating) }
	cancelled := false
	changed := false    // a renew or an extend moved a deadline
	rowChanged := false // the row changed outside this run (SignalChanged)
	renewals := 0
	var finished bool
	var finishErr error
	leaseMs := p.LeaseSeconds * 1000

	if err := workflow.SetQueryHandler(ctx, visibility.QueryState, func() (activities.WorkflowState, error) {
		return activities.WorkflowState{State: state, Start: p.Start, End: p.End, LeaseDeadline: p.LeaseDeadline,
			ReleaseRequested: releaseRequested, ReleaseRequestedBy: releaseRequestedBy, Cancelled: cancelled}, nil
	}); err != nil {
		return activities.ReservationResult{}, err
	}

	if err := workflow.SetUpdateHandlerWithOptions(ctx, activities.UpdateRenew,
		func(ctx workflow.Context) (int64, error) {
			if err := workflow.Await(ctx, func() bool { return state != "placed" }); err != nil {
				return 0, err
			}
			p.LeaseDeadline = workflow.Now(ctx).UnixMilli() + leaseMs
			workflow.GetLogger(ctx).Info("lease renewed", "caller", visibility.Caller(ctx), "deadline", p.LeaseDeadline)
			renewals++
			changed = true
			return p.LeaseDeadline, nil
		},
		workflow.UpdateHandlerOptions{Validator: func(ctx workflow.Context) error {
			if p.LeaseSeconds <= 0 {
				return invalidState(fmt.Sprintf("reservation %s has no lease to renew", p.ReservationID))
			}
			if !live() || releaseRequested {
				return invalidState(fmt.Sprintf("reservation %s is %s, not active", p.ReservationID, state))
			}
			return nil
		}},
	); err != nil {
		return activities.ReservationResult{}, err
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, activities.UpdateRelease,
		func(ctx workflow.Context) (string, error) {
			releaseRequested, releaseRequestedBy = true, visibility.Caller(ctx)
			workflow.GetLogger(ctx).Info("release requested", "caller", releaseRequestedBy)
			if err := workflow.Await(ctx, func() bool { return finished }); err != nil {
				return "", err
			}
			return state, finishErr
		},
		workflow.UpdateHandlerOptions{Validator: func(ctx workflow.Context) error {
			if !live() || releaseRequested {
				return invalidState(fmt.Sprintf("reservation %s is %s, not active", p.ReservationID, state))
			}
			return nil
		}},
	); err != nil {
		return activities.ReservationResult{}, err
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, activities.UpdateExtend,
		func(ctx workflow.Context, end int64) (int64, error) {
			workflow.GetLogger(ctx).Info("extended", "caller", visibility.Caller(ctx), "end", end)
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
		return activities.ReservationResult{}, err
	}
	workflow.Go(ctx, func(ctx workflow.Context) {
		workflow.GetSignalChannel(ctx, activities.SignalCancel).Receive(ctx, nil)
		cancelled = true
	})
	workflow.Go(ctx, func(ctx workflow.Context) {
		ch := workflow.GetSignalChannel(ctx, activities.SignalChanged)
		for {
			ch.Receive(ctx, nil)
			rowChanged = true
		}
	})

	// finish ends the run once the activity that releases the reservation
	// returned err, letting a waiting release update answer first.
	finish := func(err error, reason string) (activities.ReservationResult, error) {
		finishErr, finished = err, true
		if err == nil {
			state = "released"
		}
		if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
			return activities.ReservationResult{}, err
		}
		return activities.ReservationResult{State: state, Reason: reason}, finishErr
	}
	release := func(reason string) (activities.ReservationResult, error) {
		act := a.Release
		if reason == "lease" {
			act = a.ReleaseLapsed
		}
		return finish(workflow.ExecuteActivity(ctx, act, p.TenantID, p.ReservationID).Get(ctx, nil), reason)
	}
	// endedOutside ends the run on a row that reached a terminal state
	// outside it (the API released or cancelled it without a live run, a
	// lost node failed it): the row is the truth and is left as it is.
	endedOutside := func(row activities.RowState) (activities.ReservationResult, error) {
		state, finished = row.State, true
		if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
			return activities.ReservationResult{}, err
		}
		return activities.ReservationResult{State: row.State, Reason: row.EndReason}, nil
	}
	// readRow reads the row after a SignalChanged; ended says the run
	// ended on it.
	readRow := func() (res activities.ReservationResult, ended bool, err error) {
		rowChanged = false
		var row activities.RowState
		if err := workflow.ExecuteActivity(ctx, a.State, p.TenantID, p.ReservationID).Get(ctx, &row); err != nil {
			return activities.ReservationResult{}, true, err
		}
		if !row.Terminal {
			return activities.ReservationResult{}, false, nil
		}
		res, err = endedOutside(row)
		return res, true, err
	}

	if !p.Active {
		for {
			if cancelled {
				return activities.ReservationResult{State: "cancelled", Reason: "cancel"}, nil
			}
			if rowChanged {
				if res, ended, err := readRow(); ended || err != nil {
					return res, err
				}
			}
			wait := untilMs(workflow.Now(ctx).UnixMilli(), p.Start)
			if wait <= 0 {
				break
			}
			if err := awaitFor(ctx, wait, summaryAwaitStart, func() bool { return cancelled || rowChanged }); err != nil {
				return activities.ReservationResult{}, err
			}
		}
		if res, done, err := bind(ctx, p, &cancelled, publish); done || err != nil {
			if err == nil && res.State != "cancelled" && res.Reason == "" {
				// Ended outside this run while it bound: read why.
				res, _, err = readRow()
			}
			return res, err
		}
		var became string
		activating = true
		err := workflow.ExecuteActivity(ctx, a.MarkActive, p.TenantID, p.ReservationID).Get(ctx, &became)
		activating = false
		if err != nil {
			return activities.ReservationResult{State: state}, err
		}
		if became == "cancelled" { // cancelled meanwhile; the signal may still be on its way
			state, finished = became, true // a release that waited answers with it
			if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
				return activities.ReservationResult{}, err
			}
			return activities.ReservationResult{State: became, Reason: "cancel"}, nil
		}
		if became != "active" { // ended outside this run
			res, _, err := readRow()
			return res, err
		}
		state = "active"
		publish(state)
		p.Active = true
		if leaseMs > 0 {
			p.LeaseDeadline = workflow.Now(ctx).UnixMilli() + leaseMs
		}
	}

	for {
		if releaseRequested {
			return release("release")
		}
		if rowChanged {
			if res, ended, err := readRow(); ended || err != nil {
				return res, err
			}
		}
		now := workflow.Now(ctx).UnixMilli()
		if now >= p.End {
			var end activities.ExpireResult
			err := workflow.ExecuteActivity(ctx, a.Expire, p.TenantID, p.ReservationID).Get(ctx, &end)
			if err == nil && end.Released && end.State != "" && end.State != "released" {
				res, _, err := readRow() // ended outside this run
				return res, err
			}
			if err != nil || end.Released {
				return finish(err, "end")
			}
			p.End = end.End // extended, and the update did not reach this run
			if p.End <= now {
				// The database's clock is behind this workflow's: wait for it.
				if err := workflow.Sleep(ctx, time.Second); err != nil {
					return activities.ReservationResult{}, err
				}
			}
			continue
		}
		if leaseMs > 0 && now >= p.LeaseDeadline {
			return release("lease")
		}
		if renewals >= reservationMaxRenewals {
			if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
				return activities.ReservationResult{}, err
			}
			return activities.ReservationResult{}, workflow.NewContinueAsNewError(ctx, activities.ReservationWorkflowName, p)
		}
		wait, summary := untilMs(now, p.End), summaryAwaitEnd
		if leaseMs > 0 {
			if lease := untilMs(now, p.LeaseDeadline); lease < wait {
				wait, summary = lease, summaryLeaseDeadline
			}
		}
		changed = false
		if err := awaitFor(ctx, wait, summary,
			func() bool { return releaseRequested || changed || rowChanged }); err != nil {
			return activities.ReservationResult{}, err
		}
	}
}

// bind moves the reservation to binding, which queues the node agents'
// cdi.expose commands, and waits until they all succeeded. done reports
// that the run ends here: cancelled meanwhile, or failed (a command failed,
// or the bind timeout passed), in which case the reservation is failed and
// its atoms freed.
func bind(ctx workflow.Context, p activities.ReservationParams, cancelled *bool, publish func(string)) (res activities.ReservationResult, done bool, err error) {
	var a *activities.Reservations
	timeout := p.BindTimeout
	if timeout <= 0 {
		timeout = DefaultBindTimeout
	}
	var state string
	if err := workflow.ExecuteActivity(ctx, a.Bind, p.TenantID, p.ReservationID, timeout).Get(ctx, &state); err != nil {
		return activities.ReservationResult{State: "placed"}, true, err
	}
	switch state {
	case "cancelled":
		return activities.ReservationResult{State: state, Reason: "cancel"}, true, nil
	case "active":
		return activities.ReservationResult{}, false, nil
	case "binding":
		publish(state)
	default: // ended: failed by Bind (no booking covers now), or outside this run
		return activities.ReservationResult{State: state}, true, nil
	}
	deadline := workflow.Now(ctx).Add(timeout)
	fail := func(reason string) (activities.ReservationResult, bool, error) {
		err := workflow.ExecuteActivity(ctx, a.FailBinding, p.TenantID, p.ReservationID, reason).Get(ctx, nil)
		return activities.ReservationResult{State: "failed", Reason: reason}, true, err
	}
	for {
		var status string
		if err := workflow.ExecuteActivity(ctx, a.BindStatus, p.TenantID, p.ReservationID).Get(ctx, &status); err != nil {
			return activities.ReservationResult{State: "binding"}, true, err
		}
		switch status {
		case "bound":
			return activities.ReservationResult{}, false, nil
		case "cancelled":
			return activities.ReservationResult{State: status, Reason: "cancel"}, true, nil
		case "failed":
			return fail("bindFailed")
		case "waiting":
		default: // ended outside this run
			return activities.ReservationResult{State: status}, true, nil
		}
		left := deadline.Sub(workflow.Now(ctx))
		if left <= 0 {
			return fail("bindTimeout")
		}
		if err := awaitFor(ctx, min(left, bindPoll), summaryBindPoll, func() bool { return *cancelled }); err != nil {
			return activities.ReservationResult{}, true, err
		}
	}
}

func invalidState(msg string) error {
	return temporal.NewApplicationError(msg, string(core.CodeInvalidState))
}

// Package lifecycle holds the bare-metal workflows: MetalLifecycleWorkflow
// (one per node, id "<nodeId>/metal", running one operation of core/metal's
// table), MetalBulkWorkflow and the reconciler, with their Register. The
// site activities they call are workflows/metal's contract, which `bcd
// site` links without this package, so the agent links no activities.
package lifecycle

import (
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/workflows/metal"
	"github.com/better-compute/better-compute/workflows/sites"
)

// Timings of the lifecycle's activities and waits.
const (
	// SiteScheduleToStart bounds how long a site activity waits for the
	// site's agent to take it: a site with no agent fails the step rather
	// than leaving the node waiting until its deadline.
	SiteScheduleToStart = time.Minute
	// siteStartToClose bounds one attempt of a site activity (a boot
	// powers on with read-back, which BMCs make slow).
	siteStartToClose = 5 * time.Minute
	// siteHeartbeat: the site activities heartbeat, so an agent killed
	// mid-activity has it retried on the next agent after this long, and a
	// cancelled step reaches the agent.
	siteHeartbeat = 30 * time.Second
	// BootPoll is how often a wait on a ramdisk reads its boot row: the
	// boot-reported signal ends a wait sooner, the poll covers a lost one.
	BootPoll = 5 * time.Second
	// cleanupTimeout bounds the best-effort power-off after an abort or a
	// deadline.
	cleanupTimeout = 2 * time.Minute
)

// nonRetryable are the site errors no retry can fix: the workflow fails
// the node with the driver's message instead.
var nonRetryable = []string{metal.ErrTypeBMCAuth, metal.ErrTypeNotApplied, metal.ErrTypeUnsupported, metal.ErrTypeNotFound,
	string(core.CodeInvalidInput), activities.ErrTypeStale, metal.ErrTypeDigestMismatch}

// bmcErrors are the application error types that fail a node with reason
// bmc.
var bmcErrors = map[string]bool{metal.ErrTypeBMCAuth: true, metal.ErrTypeBMCUnreachable: true, metal.ErrTypeNotApplied: true,
	metal.ErrTypeUnsupported: true, metal.ErrTypeLeaseLost: true}

// lifecycle is one run of MetalLifecycleWorkflow: what it knows of the
// node and how far it got.
type lifecycle struct {
	p      activities.MetalParams
	lc     activities.Lifecycle
	edge   coremetal.Edge
	loaded bool

	step   string
	bootID string
	power  string

	aborting bool // the abort update was taken (or the row asked for it)
	expired  bool // the deadline passed
	done     bool // the node is finished or failed
	result   activities.LifecycleResult
	// signalled: a boot-reported signal arrived since the last poll.
	signalled bool
	cancel    workflow.CancelFunc
	// published is the State search attribute as last set.
	published string
	// deadline is the operation's, as the row last said (a resume after
	// a pause pushes it).
	deadline time.Time
	// prov is the provisioning workflow's progress (StepProvision).
	prov provisionState
}

// stepError is a step's failure as the node records it.
type stepError struct {
	code, reason, message string
	// final: no further attempt of a provisioning step can fix it.
	final bool
	// workflowState ends the provisioning workflow with the failure ("":
	// failed at the step).
	workflowState string
}

func (e *stepError) Error() string { return e.reason + ": " + e.message }

// errStale ends a run whose operation is no longer in flight.
var errStale = errors.New("the operation is no longer in flight")

// MetalLifecycleWorkflow runs one operation (op_seq p.OpSeq) on one node,
// as core/metal's table gives its steps, recording each step before it
// runs. BMC and boot steps run on the site's task queue (`bcd site`), the
// database facts here. The whole operation runs under a durable timer to
// the row's deadline: past it, or on the abort update, the step in flight
// is cancelled, the machine is powered off where it can be, and the node
// is failed with the reason and the step, so no node stays in an
// in-flight state. A start for an op_seq no longer in flight ends without
// changing anything.
func MetalLifecycleWorkflow(ctx workflow.Context, p activities.MetalParams) (activities.LifecycleResult, error) {
	l := &lifecycle{p: p}
	if err := l.handlers(ctx); err != nil {
		return activities.LifecycleResult{}, err
	}
	res, err := l.run(ctx)
	l.result, l.done = res, true
	if err != nil {
		return res, err
	}
	// A waiting abort answers before the run closes.
	if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
		return res, err
	}
	return res, nil
}

// handlers sets the state query, the abort update and the boot-reported
// signal, before anything else runs, so none arrives unhandled.
func (l *lifecycle) handlers(ctx workflow.Context) error {
	if err := workflow.SetQueryHandler(ctx, activities.QueryState, func() (activities.LifecycleState, error) {
		return activities.LifecycleState{Operation: string(l.lc.Operation), OpSeq: l.p.OpSeq, Step: l.step,
			BootID: l.bootID, Aborting: l.aborting, Done: l.done}, nil
	}); err != nil {
		return err
	}
	if err := workflow.SetUpdateHandlerWithOptions(ctx, activities.UpdateAbort,
		func(ctx workflow.Context) (activities.LifecycleResult, error) {
			workflow.GetLogger(ctx).Info("abort requested", "caller", visibility.Caller(ctx), "step", l.step)
			l.aborting = true
			if l.cancel != nil {
				l.cancel()
			}
			if err := workflow.Await(ctx, func() bool { return l.done }); err != nil {
				return activities.LifecycleResult{}, err
			}
			return l.result, nil
		},
		workflow.UpdateHandlerOptions{Validator: func(ctx workflow.Context) error {
			if l.done || l.aborting {
				return temporal.NewNonRetryableApplicationError(
					fmt.Sprintf("node %s has no operation in flight to abort", l.p.NodeID), string(core.CodeInvalidState), nil)
			}
			return nil
		}},
	); err != nil {
		return err
	}
	l.workflowChanged(ctx)
	workflow.Go(ctx, func(ctx workflow.Context) {
		ch := workflow.GetSignalChannel(ctx, activities.SignalBootReported)
		for {
			var b activities.BootReported
			ch.Receive(ctx, &b)
			if b.BootID == "" || b.BootID == l.bootID {
				l.signalled = true
			}
		}
	})
	return nil
}

// controlPlane are the options of the database activities: each is one
// short transaction, retried until it lands, except a fenced write.
func controlPlane(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{MaximumInterval: 30 * time.Second,
			NonRetryableErrorTypes: []string{activities.ErrTypeStale, string(core.CodeNotFound)}},
	})
}

// site are the options of the site activities, on the site's queue.
func (l *lifecycle) site(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:              sites.SiteTaskQueue(l.lc.SiteID),
		ScheduleToStartTimeout: SiteScheduleToStart,
		StartToCloseTimeout:    siteStartToClose,
		HeartbeatTimeout:       siteHeartbeat,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2,
			MaximumInterval: 30 * time.Second, MaximumAttempts: 5, NonRetryableErrorTypes: nonRetryable},
	})
}

func (l *lifecycle) machine() metal.MachineRef {
	return metal.MachineRef{NodeID: l.lc.NodeID, SiteID: l.lc.SiteID, RedfishAddress: l.lc.RedfishAddress,
		IPMIAddress: l.lc.IPMIAddress, Bindings: l.lc.Bindings, BootMAC: l.lc.BootMAC}
}

// run is the run's body: load, the steps, and how the operation ends.
func (l *lifecycle) run(ctx workflow.Context) (activities.LifecycleResult, error) {
	cp := controlPlane(ctx)
	var a *activities.Metal
	if err := workflow.ExecuteActivity(cp, a.LoadLifecycle, l.p.TenantID, l.p.NodeID).Get(cp, &l.lc); err != nil {
		if isType(err, string(core.CodeNotFound)) {
			return activities.LifecycleResult{Outcome: activities.OutcomeStale}, nil
		}
		return activities.LifecycleResult{}, err
	}
	if l.lc.Operation == "" || l.lc.OpSeq != l.p.OpSeq {
		return activities.LifecycleResult{Outcome: activities.OutcomeStale, State: string(l.lc.State)}, nil
	}
	l.loaded = true
	edge, ok := coremetal.EdgeOf(l.lc.Operation)
	if !ok {
		return l.fail(ctx, &stepError{code: string(core.CodeInternal), reason: coremetal.ReasonStepFailed,
			message: fmt.Sprintf("unknown operation %q", l.lc.Operation)})
	}
	l.edge = edge
	l.step = l.lc.Step
	if err := workflow.ExecuteActivity(cp, a.MarkLifecycleStarted, l.p).Get(cp, nil); err != nil {
		return l.endOn(ctx, err)
	}
	l.publish(ctx, string(l.edge.DuringFrom(l.lc.Origin)))
	if l.lc.AbortRequested {
		l.aborting = true
	}

	opCtx, cancel := workflow.WithCancel(ctx)
	l.cancel = cancel
	l.deadline = l.lc.Deadline
	if l.deadline.IsZero() {
		l.deadline = workflow.Now(ctx).Add(coremetal.DefaultDeadlines[l.edge.DuringFrom(l.lc.Origin)])
	}
	workflow.Go(ctx, func(ctx workflow.Context) {
		if err := l.awaitDeadline(ctx); err != nil {
			return
		}
		if !l.done {
			l.expired = true
			cancel()
		}
	})

	final, err := l.steps(opCtx)
	switch {
	case l.aborting && l.runsProvisioning():
		l.cleanup(ctx)
		return l.abortEnd(ctx)
	case l.aborting:
		l.cleanup(ctx)
		return l.fail(ctx, &stepError{code: string(core.CodeInvalidState), reason: coremetal.ReasonAborted,
			message: fmt.Sprintf("%s aborted at step %s", l.lc.Operation, l.step)})
	case l.expired:
		l.cleanup(ctx)
		return l.fail(ctx, &stepError{code: string(core.CodeUnavailable), reason: coremetal.ReasonDeadline,
			message: fmt.Sprintf("%s passed its deadline at step %s", l.lc.Operation, l.step)})
	case err != nil:
		return l.endOn(ctx, err)
	}
	f := activities.Finish{TenantID: l.p.TenantID, NodeID: l.p.NodeID, OpSeq: l.p.OpSeq, State: final,
		Managed: l.lc.Operation == coremetal.Manage, Inspected: l.lc.Operation == coremetal.Inspect,
		Power: activities.NormalPower(l.power)}
	if l.power == "" {
		f.Power = ""
	}
	if err := workflow.ExecuteActivity(cp, a.FinishOperation, f).Get(cp, nil); err != nil {
		return l.endOn(ctx, err)
	}
	l.publish(ctx, string(final))
	return activities.LifecycleResult{Outcome: activities.OutcomeFinished, State: string(final), Power: l.power}, nil
}

// awaitDeadline returns once the operation's deadline passed: the timer
// is armed again when a resume pushes the deadline, and a pause holds it
// (time spent paused is not the operation's).
func (l *lifecycle) awaitDeadline(ctx workflow.Context) error {
	for {
		armed := l.deadline
		if wait := armed.Sub(workflow.Now(ctx)); wait > 0 {
			moved, err := workflow.AwaitWithOptions(ctx, workflow.AwaitOptions{Timeout: wait,
				TimerOptions: workflow.TimerOptions{Summary: "deadline"}},
				func() bool { return l.done || !l.deadline.Equal(armed) })
			if err != nil || l.done {
				return workflow.ErrCanceled
			}
			if moved {
				continue
			}
		}
		if !l.prov.paused {
			return nil
		}
		if err := workflow.Await(ctx, func() bool { return l.done || !l.prov.paused || !l.deadline.Equal(armed) }); err != nil || l.done {
			return workflow.ErrCanceled
		}
	}
}

// endOn ends the run on a step's error: a fenced write ends it quietly,
// anything else fails the node with its reason.
func (l *lifecycle) endOn(ctx workflow.Context, err error) (activities.LifecycleResult, error) {
	if errors.Is(err, errStale) || isType(err, activities.ErrTypeStale) {
		return activities.LifecycleResult{Outcome: activities.OutcomeStale}, nil
	}
	return l.fail(ctx, classify(err, l.lc.SiteID))
}

// classify turns a step's error into the failure the node records.
func classify(err error, siteID string) *stepError {
	var se *stepError
	if errors.As(err, &se) {
		return se
	}
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		if bmcErrors[app.Type()] {
			return &stepError{code: string(core.CodeUnavailable), reason: coremetal.ReasonBMC, message: app.Message()}
		}
		return &stepError{code: string(core.CodeInternal), reason: coremetal.ReasonStepFailed, message: app.Message()}
	}
	var timeout *temporal.TimeoutError
	if errors.As(err, &timeout) && timeout.TimeoutType() == enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START {
		return &stepError{code: string(core.CodeUnavailable), reason: coremetal.ReasonStepFailed,
			message: fmt.Sprintf("no agent of site %s took the step within %s", siteID, SiteScheduleToStart)}
	}
	return &stepError{code: string(core.CodeInternal), reason: coremetal.ReasonStepFailed, message: err.Error()}
}

// fail records the failure and answers it.
func (l *lifecycle) fail(ctx workflow.Context, se *stepError) (activities.LifecycleResult, error) {
	cp := controlPlane(ctx)
	var a *activities.Metal
	err := workflow.ExecuteActivity(cp, a.FailOperation, activities.Failure{TenantID: l.p.TenantID, NodeID: l.p.NodeID,
		OpSeq: l.p.OpSeq, Step: l.step, Code: se.code, Reason: se.reason, Message: se.message,
		WorkflowState: se.workflowState}).Get(cp, nil)
	if isType(err, activities.ErrTypeStale) {
		return activities.LifecycleResult{Outcome: activities.OutcomeStale}, nil
	}
	if err != nil {
		return activities.LifecycleResult{}, err
	}
	l.publish(ctx, string(nodes.Failed))
	return activities.LifecycleResult{Outcome: activities.OutcomeFailed, State: string(nodes.Failed),
		Reason: se.reason, Step: l.step, Message: se.message}, nil
}

// cleanup powers the machine off after an abort or a deadline, best
// effort: ending the boot in flight (eject, power off) or, without one, a
// plain power off. A BMC that does not answer leaves the power as it is;
// the node is failed either way.
func (l *lifecycle) cleanup(ctx workflow.Context) {
	sctx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:              sites.SiteTaskQueue(l.lc.SiteID),
		ScheduleToStartTimeout: SiteScheduleToStart,
		StartToCloseTimeout:    cleanupTimeout,
		HeartbeatTimeout:       siteHeartbeat,
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 2, NonRetryableErrorTypes: nonRetryable},
	})
	boot := l.bootID
	if boot == "" {
		boot = l.lc.OpenBoot
	}
	var err error
	if boot != "" {
		err = workflow.ExecuteActivity(sctx, metal.ActivityEndBoot, metal.EndBootRequest{Machine: l.machine(), BootID: boot, PowerOff: true}).Get(sctx, nil)
		if err == nil {
			_ = l.closeBoot(ctx, boot)
			l.power = string(nodes.PowerOff)
		}
	} else {
		var pr metal.PowerResult
		err = workflow.ExecuteActivity(sctx, metal.ActivityPower, metal.PowerRequest{Machine: l.machine(), Action: "off"}).Get(sctx, &pr)
		if err == nil {
			l.power = pr.Power
		}
	}
	if err != nil {
		workflow.GetLogger(ctx).Warn("could not power the machine off after the operation stopped", "node", l.p.NodeID, "error", err)
		return
	}
	l.setPower(ctx, l.power)
}

// publish sets the State search attribute when it changes; the first
// time also the node's ids, which a run the reconciler started may lack.
func (l *lifecycle) publish(ctx workflow.Context, state string) {
	if state == l.published {
		return
	}
	updates := []temporal.SearchAttributeUpdate{visibility.SetState(state)}
	if l.published == "" {
		for _, kv := range [][2]string{{visibility.TenantID, l.p.TenantID}, {visibility.NodeID, l.p.NodeID}, {visibility.PoolID, l.lc.PoolID}} {
			if kv[1] != "" {
				updates = append(updates, temporal.NewSearchAttributeKeyKeyword(kv[0]).ValueSet(kv[1]))
			}
		}
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx, updates...); err != nil {
		workflow.GetLogger(ctx).Warn("could not set the search attributes", "state", state, "error", err)
		return
	}
	l.published = state
}

// isType says whether err carries an application error of type t.
func isType(err error, t string) bool {
	var app *temporal.ApplicationError
	return errors.As(err, &app) && app.Type() == t
}

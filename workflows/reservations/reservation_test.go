package reservations

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	activities "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/activities/visibility"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// recorder stands in for activities.Reservations and records the calls in
// order, with the workflow clock at each. activation is what MarkActive
// answers ("active" by default); extendedTo, when set, is the end the first
// Expire finds on the row (an extension the workflow missed).
type recorder struct {
	env        *testsuite.TestWorkflowEnvironment
	calls      []string
	at         []time.Time
	activation string
	extendedTo int64
	// binding is what BindStatus answers, one per call, then "bound".
	binding []string
	// markActive is the activation's mock, to make it take time.
	markActive *testsuite.MockCallWrapper
	// row is what the State activity reads.
	row activities.RowState
	// bound, when set, is what Bind answers (and records), else "binding".
	bound string
}

func (r *recorder) record(name, tenantID, id string) error {
	if tenantID != "t_1" || id != "res_1" {
		return errors.New("wrong reservation")
	}
	r.calls = append(r.calls, name)
	r.at = append(r.at, r.env.Now())
	return nil
}

// register registers the domain as the worker does, then stands in for
// each activity by the name it must be scheduled under.
func (r *recorder) register(env *testsuite.TestWorkflowEnvironment) {
	r.env = env
	Register(env, &activities.Reservations{})
	on := func(name string, fn any) *testsuite.MockCallWrapper {
		args := make([]any, reflect.TypeOf(fn).NumIn())
		for i := range args {
			args[i] = mock.Anything
		}
		return env.OnActivity(name, args...).Return(fn)
	}
	on(activities.ActivityBind, func(_ context.Context, tenantID, id string, _ time.Duration) (string, error) {
		if r.bound != "" {
			return r.bound, r.record(activities.ActivityBind+"("+r.bound+")", tenantID, id)
		}
		return "binding", nil
	})
	on(activities.ActivityBindStatus, func(_ context.Context, tenantID, id string) (string, error) {
		if len(r.binding) == 0 {
			return "bound", nil
		}
		st := r.binding[0]
		r.binding = r.binding[1:]
		return st, nil
	})
	on(activities.ActivityFailBinding, func(_ context.Context, tenantID, id, reason string) error {
		return r.record(activities.ActivityFailBinding+"("+reason+")", tenantID, id)
	})
	r.markActive = on(activities.ActivityMarkActive, func(_ context.Context, tenantID, id string) (string, error) {
		if r.activation == "" {
			r.activation = "active"
		}
		return r.activation, r.record(activities.ActivityMarkActive, tenantID, id)
	})
	on(activities.ActivityExpire, func(_ context.Context, tenantID, id string) (activities.ExpireResult, error) {
		if end := r.extendedTo; end > 0 {
			r.extendedTo = 0
			return activities.ExpireResult{End: end}, r.record(activities.ActivityExpire+"(not yet)", tenantID, id)
		}
		return activities.ExpireResult{Released: true}, r.record(activities.ActivityExpire, tenantID, id)
	})
	on(activities.ActivityRelease, func(_ context.Context, tenantID, id string) error {
		return r.record(activities.ActivityRelease, tenantID, id)
	})
	on(activities.ActivityReleaseLapsed, func(_ context.Context, tenantID, id string) error {
		return r.record(activities.ActivityReleaseLapsed, tenantID, id)
	})
	on(activities.ActivityState, func(_ context.Context, tenantID, id string) (activities.RowState, error) {
		return r.row, r.record(activities.ActivityState, tenantID, id)
	})
}

func newEnv(t *testing.T) (*testsuite.TestWorkflowEnvironment, *recorder) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.SetStartTime(t0)
	r := &recorder{}
	r.register(env)
	return env, r
}

func params(lease int64) activities.ReservationParams {
	return activities.ReservationParams{TenantID: "t_1", ReservationID: "res_1",
		Start: t0.Add(time.Hour).UnixMilli(), End: t0.Add(5 * time.Hour).UnixMilli(), LeaseSeconds: lease}
}

func result(t *testing.T, env *testsuite.TestWorkflowEnvironment) activities.ReservationResult {
	t.Helper()
	if !env.IsWorkflowCompleted() {
		t.Fatal("workflow did not complete")
	}
	if err := env.GetWorkflowError(); err != nil {
		t.Fatalf("workflow error: %v", err)
	}
	var res activities.ReservationResult
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	return res
}

func update(env *testsuite.TestWorkflowEnvironment, name, id string, args ...any) (accepted, rejected *bool, outcome *error) {
	a, r := false, false
	var out error
	env.UpdateWorkflow(name, id, &testsuite.TestUpdateCallback{
		OnAccept:   func() { a = true },
		OnReject:   func(err error) { r = true; out = err },
		OnComplete: func(_ any, err error) { out = err },
	}, args...)
	return &a, &r, &out
}

func wantCalls(t *testing.T, r *recorder, want ...string) {
	t.Helper()
	if len(r.calls) != len(want) {
		t.Fatalf("calls = %v, want %v", r.calls, want)
	}
	for i := range want {
		if r.calls[i] != want[i] {
			t.Fatalf("calls = %v, want %v", r.calls, want)
		}
	}
}

func TestReservationLeaseMissedIsReleased(t *testing.T) {
	env, r := newEnv(t)
	env.ExecuteWorkflow(ReservationWorkflow, params(600))
	res := result(t, env)
	if res.State != "released" || res.Reason != "lease" {
		t.Fatalf("result = %+v", res)
	}
	wantCalls(t, r, activities.ActivityMarkActive, activities.ActivityReleaseLapsed)
	if got := r.at[0]; !got.Equal(t0.Add(time.Hour)) {
		t.Fatalf("activated at %v, want the start", got)
	}
	if got := r.at[1]; !got.Equal(t0.Add(time.Hour + 10*time.Minute)) {
		t.Fatalf("released at %v, want one lease period after the start", got)
	}
}

func TestReservationRenewedIsKeptUntilEnd(t *testing.T) {
	env, r := newEnv(t)
	var rejected []*bool
	// Renew every 8 minutes (a 10-minute lease) from the start to past the end.
	for d := time.Hour + 8*time.Minute; d < 5*time.Hour; d += 8 * time.Minute {
		env.RegisterDelayedCallback(func() {
			_, rej, _ := update(env, activities.UpdateRenew, "renew-"+d.String())
			rejected = append(rejected, rej)
		}, d)
	}
	env.ExecuteWorkflow(ReservationWorkflow, params(600))
	res := result(t, env)
	if res.State != "released" || res.Reason != "end" {
		t.Fatalf("result = %+v", res)
	}
	wantCalls(t, r, activities.ActivityMarkActive, activities.ActivityExpire)
	if got := r.at[1]; !got.Equal(t0.Add(5 * time.Hour)) {
		t.Fatalf("expired at %v, want the end", got)
	}
	if len(rejected) < 25 {
		t.Fatalf("%d renewals sent", len(rejected))
	}
	for i, rej := range rejected {
		if *rej {
			t.Fatalf("renewal %d rejected", i)
		}
	}
}

func TestReservationReleaseUpdate(t *testing.T) {
	env, r := newEnv(t)
	var acc, rej *bool
	var out *error
	env.RegisterDelayedCallback(func() { acc, rej, out = update(env, activities.UpdateRelease, "release-1") }, 2*time.Hour)
	env.ExecuteWorkflow(ReservationWorkflow, params(0))
	res := result(t, env)
	if res.State != "released" || res.Reason != "release" {
		t.Fatalf("result = %+v", res)
	}
	if !*acc || *rej || *out != nil {
		t.Fatalf("release accepted %v rejected %v outcome %v", *acc, *rej, *out)
	}
	wantCalls(t, r, activities.ActivityMarkActive, activities.ActivityRelease)
	if got := r.at[1]; !got.Equal(t0.Add(2 * time.Hour)) {
		t.Fatalf("released at %v", got)
	}
}

func TestReservationUpdatesRejected(t *testing.T) {
	env, r := newEnv(t)
	var beforeStart, noLease *bool
	var noLeaseErr *error
	// Before the start the reservation is not active: release is refused.
	env.RegisterDelayedCallback(func() { _, beforeStart, _ = update(env, activities.UpdateRelease, "early") }, 30*time.Minute)
	// Active but without a lease: renew is refused.
	env.RegisterDelayedCallback(func() { _, noLease, noLeaseErr = update(env, activities.UpdateRenew, "renew") }, 2*time.Hour)
	env.ExecuteWorkflow(ReservationWorkflow, params(0))
	res := result(t, env)
	if res.State != "released" || res.Reason != "end" {
		t.Fatalf("result = %+v", res)
	}
	if !*beforeStart {
		t.Fatal("release before the start was accepted")
	}
	if !*noLease || *noLeaseErr == nil {
		t.Fatalf("renew without a lease: rejected %v, %v", *noLease, *noLeaseErr)
	}
	wantCalls(t, r, activities.ActivityMarkActive, activities.ActivityExpire)
}

func TestReservationContinuesAsNewAfterManyRenewals(t *testing.T) {
	old := reservationMaxRenewals
	reservationMaxRenewals = 3
	t.Cleanup(func() { reservationMaxRenewals = old })
	env, r := newEnv(t)
	for i := 1; i <= 3; i++ {
		env.RegisterDelayedCallback(func() { update(env, activities.UpdateRenew, fmt.Sprint("renew-", i)) }, time.Hour+time.Duration(i)*time.Minute)
	}
	env.ExecuteWorkflow(ReservationWorkflow, params(600))
	if !env.IsWorkflowCompleted() {
		t.Fatal("workflow did not complete")
	}
	var can *workflow.ContinueAsNewError
	if err := env.GetWorkflowError(); !errors.As(err, &can) {
		t.Fatalf("workflow error = %v, want continue-as-new", err)
	}
	wantCalls(t, r, activities.ActivityMarkActive)
}

func TestReservationExtendUpdateMovesTheEnd(t *testing.T) {
	env, r := newEnv(t)
	var shorter, longer *bool
	var out *error
	env.RegisterDelayedCallback(func() {
		_, shorter, _ = update(env, activities.UpdateExtend, "shorter", t0.Add(4*time.Hour).UnixMilli())
		_, longer, out = update(env, activities.UpdateExtend, "longer", t0.Add(8*time.Hour).UnixMilli())
	}, 2*time.Hour)
	env.ExecuteWorkflow(ReservationWorkflow, params(0))
	res := result(t, env)
	if res.State != "released" || res.Reason != "end" {
		t.Fatalf("result = %+v", res)
	}
	if !*shorter {
		t.Fatal("an extension to an earlier end was accepted")
	}
	if *longer || *out != nil {
		t.Fatalf("extension rejected %v, %v", *longer, *out)
	}
	wantCalls(t, r, activities.ActivityMarkActive, activities.ActivityExpire)
	if got := r.at[1]; !got.Equal(t0.Add(8 * time.Hour)) {
		t.Fatalf("expired at %v, want the extended end", got)
	}
}

func TestReservationMissedExtensionIsFoundAtTheOldEnd(t *testing.T) {
	env, r := newEnv(t)
	r.extendedTo = t0.Add(7 * time.Hour).UnixMilli()
	env.ExecuteWorkflow(ReservationWorkflow, params(0))
	res := result(t, env)
	if res.State != "released" || res.Reason != "end" {
		t.Fatalf("result = %+v", res)
	}
	wantCalls(t, r, activities.ActivityMarkActive, activities.ActivityExpire+"(not yet)", activities.ActivityExpire)
	if !r.at[1].Equal(t0.Add(5*time.Hour)) || !r.at[2].Equal(t0.Add(7*time.Hour)) {
		t.Fatalf("expiry checked at %v, then %v; want the old end, then the row's", r.at[1], r.at[2])
	}
}

func TestReservationCancelledBeforeItsStart(t *testing.T) {
	env, r := newEnv(t)
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(activities.SignalCancel, nil) }, 30*time.Minute)
	env.ExecuteWorkflow(ReservationWorkflow, params(0))
	res := result(t, env)
	if res.State != "cancelled" || res.Reason != "cancel" {
		t.Fatalf("result = %+v", res)
	}
	wantCalls(t, r)
}

// PostgreSQL shows the reservation active once the activation commits, a
// moment before the workflow learns it: a release the API accepted on that
// row is taken, waits for the activation, then releases.
func TestReservationReleaseWhileActivationLands(t *testing.T) {
	env, r := newEnv(t)
	r.markActive.After(time.Hour)
	var acc, rej *bool
	var out *error
	env.RegisterDelayedCallback(func() { acc, rej, out = update(env, activities.UpdateRelease, "release-early") }, 90*time.Minute)
	env.ExecuteWorkflow(ReservationWorkflow, params(0))
	res := result(t, env)
	if res.State != "released" || res.Reason != "release" {
		t.Fatalf("result = %+v", res)
	}
	if !*acc || *rej || *out != nil {
		t.Fatalf("release accepted %v rejected %v outcome %v", *acc, *rej, *out)
	}
	wantCalls(t, r, activities.ActivityMarkActive, activities.ActivityRelease)
	if got := r.at[1]; got.Before(t0.Add(2 * time.Hour)) {
		t.Fatalf("released at %v, before the activation landed", got)
	}
}

func TestReservationCancelledWhileActivating(t *testing.T) {
	env, r := newEnv(t)
	r.activation = "cancelled" // the API cancelled it; the signal is lost
	env.ExecuteWorkflow(ReservationWorkflow, params(0))
	res := result(t, env)
	if res.State != "cancelled" {
		t.Fatalf("result = %+v", res)
	}
	wantCalls(t, r, activities.ActivityMarkActive)
}

func TestReservationBindingWaitsForTheAgent(t *testing.T) {
	env, r := newEnv(t)
	r.binding = []string{"waiting", "waiting", "waiting"}
	env.ExecuteWorkflow(ReservationWorkflow, params(0))
	if res := result(t, env); res.State != "released" || res.Reason != "end" {
		t.Fatalf("result = %+v", res)
	}
	wantCalls(t, r, activities.ActivityMarkActive, activities.ActivityExpire)
	if got := r.at[0]; !got.Equal(t0.Add(time.Hour + 3*bindPoll)) {
		t.Fatalf("activated at %v, want three polls after the start", got)
	}
}

func TestReservationBindingFails(t *testing.T) {
	for _, tc := range []struct {
		name    string
		binding []string
		reason  string
	}{
		{"a command failed", []string{"waiting", "failed"}, "bindFailed"},
		{"the agent never answered", []string{"waiting", "waiting", "waiting", "waiting", "waiting", "waiting"}, "bindTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, r := newEnv(t)
			r.binding = tc.binding
			p := params(0)
			p.BindTimeout = 4 * bindPoll
			env.ExecuteWorkflow(ReservationWorkflow, p)
			if res := result(t, env); res.State != "failed" || res.Reason != tc.reason {
				t.Fatalf("result = %+v", res)
			}
			wantCalls(t, r, activities.ActivityFailBinding+"("+tc.reason+")")
		})
	}
}

func TestReservationCancelledWhileBinding(t *testing.T) {
	env, r := newEnv(t)
	r.binding = []string{"waiting", "cancelled"}
	env.ExecuteWorkflow(ReservationWorkflow, params(0))
	if res := result(t, env); res.State != "cancelled" || res.Reason != "cancel" {
		t.Fatalf("result = %+v", res)
	}
	wantCalls(t, r)
}

func TestUntilMsSaturates(t *testing.T) {
	for _, tc := range []struct {
		now, t int64
		want   time.Duration
	}{
		{0, 1500, 1500 * time.Millisecond},
		{5, 3, 0},
		{5, 5, 0},
		{0, math.MaxInt64, maxWait},
		{math.MinInt64, math.MaxInt64, maxWait},
		{math.MaxInt64, math.MinInt64, 0},
		{t0.UnixMilli(), t0.AddDate(300, 0, 0).UnixMilli(), maxWait},
	} {
		if got := untilMs(tc.now, tc.t); got != tc.want {
			t.Errorf("untilMs(%d, %d) = %v, want %v", tc.now, tc.t, got, tc.want)
		}
	}
}

// A start centuries ahead is waited for: its wait saturates instead of
// overflowing into one that fires at once. A day in, the cancel finds it
// still waiting, never bound nor activated.
func TestReservationFarFutureStartDoesNotActivate(t *testing.T) {
	env, r := newEnv(t)
	p := params(0)
	p.Start, p.End = t0.AddDate(300, 0, 0).UnixMilli(), t0.AddDate(300, 0, 1).UnixMilli()
	r.bound = "binding" // record a Bind, were there one
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(activities.SignalCancel, nil) }, 24*time.Hour)
	env.ExecuteWorkflow(ReservationWorkflow, p)
	if res := result(t, env); res.State != "cancelled" || res.Reason != "cancel" {
		t.Fatalf("result = %+v", res)
	}
	wantCalls(t, r)
}

// An active reservation whose end is centuries ahead waits for it (or a
// release) without spinning.
func TestReservationFarFutureEndWaits(t *testing.T) {
	env, r := newEnv(t)
	p := params(0)
	p.Active, p.End = true, t0.AddDate(300, 0, 0).UnixMilli()
	var acc, rej *bool
	var out *error
	env.RegisterDelayedCallback(func() { acc, rej, out = update(env, activities.UpdateRelease, "release") }, time.Hour)
	env.ExecuteWorkflow(ReservationWorkflow, p)
	if res := result(t, env); res.State != "released" || res.Reason != "release" {
		t.Fatalf("result = %+v", res)
	}
	if !*acc || *rej || *out != nil {
		t.Fatalf("release accepted %v rejected %v outcome %v", *acc, *rej, *out)
	}
	wantCalls(t, r, activities.ActivityRelease)
	if !r.at[0].Equal(t0.Add(time.Hour)) {
		t.Fatalf("released at %v, want when asked", r.at[0])
	}
}

// Told its row changed, the run reads it: a row ended outside it (a lost
// node failed it) ends the run as the row says, touching nothing; a row
// still live keeps it running.
func TestReservationChangedRowEndsTheRun(t *testing.T) {
	env, r := newEnv(t)
	p := params(0)
	p.Active = true
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(activities.SignalChanged, nil) }, time.Hour)
	env.RegisterDelayedCallback(func() {
		r.row = activities.RowState{State: "failed", Terminal: true, EndReason: "nodeLost"}
		env.SignalWorkflow(activities.SignalChanged, nil)
	}, 2*time.Hour)
	r.row = activities.RowState{State: "active"}
	env.ExecuteWorkflow(ReservationWorkflow, p)
	if res := result(t, env); res != (activities.ReservationResult{State: "failed", Reason: "nodeLost"}) {
		t.Fatalf("result = %+v", res)
	}
	wantCalls(t, r, activities.ActivityState, activities.ActivityState)
	if !r.at[1].Equal(t0.Add(2 * time.Hour)) {
		t.Fatalf("second read at %v", r.at[1])
	}
}

// A row cancelled or released by the API while the run waited for the
// start ends the run when it is told, before any binding.
func TestReservationChangedBeforeItsStart(t *testing.T) {
	env, r := newEnv(t)
	r.row = activities.RowState{State: "cancelled", Terminal: true, EndReason: "cancel"}
	env.RegisterDelayedCallback(func() { env.SignalWorkflow(activities.SignalChanged, nil) }, 30*time.Minute)
	env.ExecuteWorkflow(ReservationWorkflow, params(0))
	if res := result(t, env); res != (activities.ReservationResult{State: "cancelled", Reason: "cancel"}) {
		t.Fatalf("result = %+v", res)
	}
	wantCalls(t, r, activities.ActivityState)
}

// The bind step finds no booking covering now (the window is over): it
// fails the reservation, and the run ends without activating it.
func TestReservationBindOutsideTheBookingFails(t *testing.T) {
	env, r := newEnv(t)
	r.bound = "failed"
	r.row = activities.RowState{State: "failed", Terminal: true, EndReason: "failed"}
	env.ExecuteWorkflow(ReservationWorkflow, params(0))
	if res := result(t, env); res != (activities.ReservationResult{State: "failed", Reason: "failed"}) {
		t.Fatalf("result = %+v", res)
	}
	wantCalls(t, r, activities.ActivityBind+"(failed)", activities.ActivityState)
}

// The state query answers where the run stands, and each transition sets
// the State search attribute operators search by.
func TestReservationStateQueryAndSearchAttribute(t *testing.T) {
	env, _ := newEnv(t)
	var published []string
	// The matcher sees each upsert (testify may match one call more than
	// once; the workflow never sets the same state twice in a row).
	env.OnUpsertTypedSearchAttributes(mock.MatchedBy(func(sa temporal.SearchAttributes) bool {
		v, _ := sa.GetKeyword(temporal.NewSearchAttributeKeyKeyword(visibility.State))
		if len(published) == 0 || published[len(published)-1] != v {
			published = append(published, v)
		}
		return true
	})).Return(nil)
	queried := map[string]activities.WorkflowState{}
	query := func(at string) {
		v, err := env.QueryWorkflow(visibility.QueryState)
		if err != nil {
			t.Errorf("state query at %s: %v", at, err)
			return
		}
		var st activities.WorkflowState
		if err := v.Get(&st); err != nil {
			t.Errorf("state query at %s: %v", at, err)
		}
		queried[at] = st
	}
	env.RegisterDelayedCallback(func() { query("before start") }, 30*time.Minute)
	env.RegisterDelayedCallback(func() { query("after start") }, 2*time.Hour)
	p := params(0)
	env.ExecuteWorkflow(ReservationWorkflow, p)
	if res := result(t, env); res.State != "released" {
		t.Fatalf("result = %+v", res)
	}
	if st := queried["before start"]; st.State != "placed" || st.Start != p.Start || st.End != p.End {
		t.Fatalf("state before the start = %+v", st)
	}
	if st := queried["after start"]; st.State != "active" {
		t.Fatalf("state after the start = %+v", st)
	}
	if !reflect.DeepEqual(published, []string{"binding", "active", "released"}) {
		t.Fatalf("State search attribute set to %v, want binding, active, released", published)
	}
}

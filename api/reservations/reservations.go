// Package reservations describes the reservations.* methods. create and
// extend are admissions: transaction 1 writes the draft (or the extended
// request) and its authorization row, the decision is made on it,
// transaction 2 books it. Once a call commits, the reservation's workflow
// is told: started after create (by the process's starter, off the request
// path), updated after release, renew and extend, signalled after cancel.
// An update that finds no workflow starts it first.
package reservations

import (
	"context"
	"errors"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	instancesact "github.com/better-compute/better-compute/activities/instances"
	reservationsact "github.com/better-compute/better-compute/activities/reservations"
	"github.com/better-compute/better-compute/activities/visibility"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	states "github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	instancedomain "github.com/better-compute/better-compute/store/instances"
	pooldomain "github.com/better-compute/better-compute/store/pools"
	domain "github.com/better-compute/better-compute/store/reservations"
)

// Reservation is a reservation as the methods answer it.
type Reservation = domain.Reservation

// Allocation is one node's share of a reservation.
type Allocation = domain.Allocation

// ReservationList is reservations.list's answer.
type ReservationList struct {
	Items      []Reservation `json:"items"`
	NextCursor string        `json:"nextCursor,omitempty"`
}

// CreateInput is reservations.create's input: the devices (core/placement
// checks what their schema cannot say), start in epoch milliseconds
// (default now, at most 9999-12-31), duration in seconds (at most 366
// days), binding hold by default (node is planned for v0.5).
type CreateInput struct {
	TenantID       string            `json:"tenantId" jsonschema:"required" id:"tenant"`
	IdempotencyKey string            `json:"idempotencyKey" jsonschema:"required" id:"tenant"`
	PoolID         string            `json:"poolId" jsonschema:"required" id:"pool"`
	Devices        placement.Request `json:"devices" jsonschema:"required" maxBytes:"4096"`
	Start          *int64            `json:"start,omitempty" jsonschema:"minimum=0,maximum=253402300799999" unit:"epoch-ms"`
	Duration       int64             `json:"duration" jsonschema:"required,minimum=1,maximum=31622400" unit:"s"`
	Binding        string            `json:"binding,omitempty" jsonschema:"enum=hold,enum=instance,enum=node"`
	LeaseSeconds   *int64            `json:"leaseSeconds,omitempty" jsonschema:"minimum=1"`
	ProjectID      string            `json:"projectId,omitempty" id:"prj"`
	Spot           bool              `json:"spot,omitempty"`
}

// ReservationInput names one reservation.
type ReservationInput struct {
	TenantID      string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ReservationID string `json:"reservationId" jsonschema:"required" id:"rsv"`
}

// ListInput is reservations.list's input. Scope mine (the default) keeps
// the caller's own reservations; the states are core/reservations.States.
type ListInput struct {
	TenantID  string `json:"tenantId" jsonschema:"required" id:"tenant"`
	Scope     string `json:"scope,omitempty" jsonschema:"enum=mine,enum=all"`
	State     string `json:"state,omitempty" jsonschema:"enum=draft,enum=denied,enum=awaiting-confirmation,enum=pending,enum=placed,enum=binding,enum=active,enum=releasing,enum=released,enum=failed,enum=cancelled,enum=expired"`
	PoolID    string `json:"poolId,omitempty" id:"pool"`
	ProjectID string `json:"projectId,omitempty" id:"prj"`
	rpc.ListInput
}

// ExtendInput is reservations.extend's input. Duration is the new total,
// in seconds from the start (so a retry asks for the same end), at most
// 366 days.
type ExtendInput struct {
	TenantID      string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ReservationID string `json:"reservationId" jsonschema:"required" id:"rsv"`
	Duration      int64  `json:"duration" jsonschema:"required,minimum=1,maximum=31622400" unit:"s"`
}

// The methods.
const (
	Create  rpc.Ref[CreateInput, Reservation]      = "reservations.create"
	Get     rpc.Ref[ReservationInput, Reservation] = "reservations.get"
	List    rpc.Ref[ListInput, ReservationList]    = "reservations.list"
	Release rpc.Ref[ReservationInput, Reservation] = "reservations.release"
	Cancel  rpc.Ref[ReservationInput, Reservation] = "reservations.cancel"
	Renew   rpc.Ref[ReservationInput, Reservation] = "reservations.renew"
	Extend  rpc.Ref[ExtendInput, Reservation]      = "reservations.extend"
)

// methods are the handlers and what they share.
type methods struct{ d rpc.Deps }

func (m methods) types() domain.Types {
	return domain.Types{Reservation: m.d.Catalog.FullName(domain.ResourceType), Pool: m.d.Catalog.FullName(pooldomain.ResourceType)}
}

func resource(row store.AuthzResource) iam.Resource { return iam.Resource{Type: row.Type, ID: row.ID} }

// Methods describes the reservations.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	m := methods{d}
	return []rpc.Descriptor{
		&rpc.Method[CreateInput, Reservation]{Name: Create, Action: "compute:reservations:create",
			DecidedOn: "compute-reservation (the draft)", Phase: "v0.1", Kind: core.KindAdmission,
			Admission: &rpc.Admission[CreateInput, Reservation]{
				Prepare: func(ctx context.Context, c *rpc.Call, tx store.Tx, draftID string, in CreateInput) (iam.Resource, error) {
					row, err := domain.Draft(ctx, tx, m.types(), c.TenantID, draftID, c.Caller.IdentityID, domain.Request{
						PoolID: in.PoolID, Devices: in.Devices, Start: in.Start, Duration: in.Duration, Binding: in.Binding,
						LeaseSeconds: in.LeaseSeconds, ProjectID: in.ProjectID, Spot: in.Spot, MaxAhead: d.ReservationMaxAhead})
					return resource(row), err
				},
				Complete: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ CreateInput) (Reservation, error) {
					return domain.Place(ctx, tx, c.TenantID, c.Resource.ID)
				},
				Seal: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ CreateInput) error {
					return domain.CheckLimits(ctx, tx, c.TenantID, c.Resource.ID)
				},
				Denied: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ CreateInput) error {
					return domain.Deny(ctx, tx, c.TenantID, c.Resource.ID)
				},
				Failed: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ CreateInput, cause error) error {
					return domain.Fail(ctx, tx, c.TenantID, c.Resource.ID, cause)
				},
				// Started runs after the commit and on every replay. With a
				// starter, the call answers as soon as the booking is
				// committed: the row owes its workflow a start, which the
				// starter (or, after a crash, another process's starter or
				// the reconciler) makes.
				Started: func(ctx context.Context, c *rpc.Call, _ CreateInput) error {
					if d.ReservationStarts != nil && d.Temporal != nil {
						d.ReservationStarts.Owe(c.TenantID, c.Resource.ID)
						return nil
					}
					r, err := m.read(ctx, c.TenantID, c.Resource.ID)
					if err != nil {
						return err
					}
					return m.ensureWorkflow(ctx, r)
				},
			}},
		&rpc.Method[ReservationInput, Reservation]{Name: Get, Action: "compute:reservations:read", DecidedOn: "compute-reservation",
			Phase: "v0.1", Kind: core.KindRead,
			Read: func(c *rpc.Call, b *store.Batch, in ReservationInput) func() (Reservation, error) {
				return domain.QueueLoad(b, c.TenantID, in.ReservationID)
			}},
		// Newest first: creation millisecond, then id, both descending.
		&rpc.Method[ListInput, ReservationList]{Name: List, Action: "compute:reservations:read", DecidedOn: "compute-tenant + items",
			Phase: "v0.1", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (rpc.Page, error) {
				q, err := in.Page()
				if err != nil {
					return rpc.Page{}, err
				}
				f := domain.Filter{State: in.State, PoolID: in.PoolID, ProjectID: in.ProjectID}
				if c.Scope == rpc.ScopeMine {
					f.Owner = c.Caller.IdentityID
				}
				items, err := domain.List(ctx, tx, m.types().Reservation, c.TenantID, f, q)
				return rpc.PageOf(items, q, func(r Reservation) store.Key { return store.Key{At: r.CreatedAt, ID: r.ID} },
					func(r Reservation) iam.Resource { return d.Resource(domain.ResourceType, r.ID) },
					func(kept []Reservation, next string) any { return ReservationList{Items: kept, NextCursor: next} }), err
			}},
		&rpc.Method[ReservationInput, Reservation]{Name: Release, Action: "compute:reservations:release", DecidedOn: "compute-reservation",
			Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ReservationInput) (Reservation, error) {
				return domain.Release(ctx, tx, c.TenantID, in.ReservationID)
			},
			After: m.afterRelease},
		&rpc.Method[ReservationInput, Reservation]{Name: Cancel, Action: "compute:reservations:release", DecidedOn: "compute-reservation",
			Phase: "v0.2", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ReservationInput) (Reservation, error) {
				return domain.Cancel(ctx, tx, c.TenantID, in.ReservationID)
			},
			After: m.afterCancel},
		&rpc.Method[ReservationInput, Reservation]{Name: Renew, Action: "compute:reservations:extend", DecidedOn: "compute-reservation",
			Phase: "v0.1", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ReservationInput) (Reservation, error) {
				return domain.Renew(ctx, tx, c.TenantID, in.ReservationID)
			},
			After: m.afterRenew},
		// An admission on the existing row: no draft, no idempotencyKey.
		&rpc.Method[ExtendInput, Reservation]{Name: Extend, Action: "compute:reservations:extend", DecidedOn: "compute-reservation",
			Phase: "v0.1", Kind: core.KindAdmission,
			Admission: &rpc.Admission[ExtendInput, Reservation]{
				Prepare: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ string, in ExtendInput) (iam.Resource, error) {
					row, err := domain.PrepareExtend(ctx, tx, m.types(), c.TenantID, in.ReservationID, in.Duration)
					return resource(row), err
				},
				Complete: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ExtendInput) (Reservation, error) {
					return domain.CompleteExtend(ctx, tx, c.TenantID, in.ReservationID, in.Duration)
				},
				Denied: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ExtendInput) error {
					return domain.UndoExtend(ctx, tx, m.types(), c.TenantID, in.ReservationID, in.Duration)
				},
				Failed: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ExtendInput, _ error) error {
					return domain.UndoExtend(ctx, tx, m.types(), c.TenantID, in.ReservationID, in.Duration)
				},
				Started: m.extendStarted,
			}},
	}
}

// afterRelease tells the workflow of the reservation the call released,
// best effort: the release is done (the row is released, its bookings
// cut), so a workflow that is gone, or does not answer, changes nothing
// the caller sees. A running one gets the release update and ends; one
// that refuses it gets the changed signal, and reads the row.
func (m methods) afterRelease(ctx context.Context, c *rpc.Call, _ ReservationInput, r Reservation) (Reservation, error) {
	if m.d.Temporal == nil {
		return r, nil
	}
	ctx, cancel := context.WithTimeout(visibility.WithCaller(ctx, callerOf(c)), 30*time.Second)
	defer cancel()
	m.signalInstances(ctx, r)
	h, err := m.d.Temporal.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID: r.ID, UpdateName: reservationsact.UpdateRelease, WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err == nil {
		var final string
		err = h.Get(ctx, &final)
	}
	var gone *serviceerror.NotFound
	var app *temporal.ApplicationError
	switch {
	case err == nil, errors.As(err, &gone):
	case errors.As(err, &app) && app.Type() == string(core.CodeInvalidState):
		m.signalChanged(ctx, r.ID)
	default:
		m.d.Logger.WarnContext(ctx, "telling a released reservation's workflow", "reservation", r.ID, "error", err)
	}
	return r, nil
}

// callerOf is the identity id of the call's caller, "" for none.
func callerOf(c *rpc.Call) string {
	if c == nil || c.Caller == nil {
		return ""
	}
	return c.Caller.IdentityID
}

// signalChanged tells the reservation's workflow its row changed, best
// effort: a workflow that misses it finds the row when it next wakes.
func (m methods) signalChanged(ctx context.Context, id string) {
	err := m.d.Temporal.SignalWorkflow(ctx, id, "", reservationsact.SignalChanged, nil)
	var gone *serviceerror.NotFound
	if err != nil && !errors.As(err, &gone) {
		m.d.Logger.WarnContext(ctx, "signalling a reservation's workflow", "reservation", id, "error", err)
	}
}

// signalInstances tells the workflows of the instances the ending of a
// binding instance reservation deleted (in its transaction) that their
// desired state changed, best effort: a workflow that misses it finds it
// at its next poll.
func (m methods) signalInstances(ctx context.Context, r Reservation) {
	if r.Binding != domain.BindingInstance {
		return
	}
	var ids []string
	err := m.d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		ids, err = instancedomain.OnReservation(ctx, tx, r.TenantID, r.ID)
		return err
	})
	if err != nil {
		m.d.Logger.WarnContext(ctx, "reading the instances of an ended reservation", "reservation", r.ID, "error", err)
		return
	}
	for _, id := range ids {
		if err := instancesact.Signal(ctx, m.d.Temporal, id, instancesact.SignalDesiredChanged); err != nil {
			m.d.Logger.WarnContext(ctx, "signalling an instance of an ended reservation", "instance", id, "reservation", r.ID, "error", err)
		}
	}
}

// afterCancel tells the workflow to stop waiting. It is best effort: a
// workflow that misses the signal finds the reservation cancelled when it
// tries to activate it.
func (m methods) afterCancel(ctx context.Context, c *rpc.Call, _ ReservationInput, r Reservation) (Reservation, error) {
	if m.d.Temporal != nil {
		m.signalInstances(visibility.WithCaller(ctx, callerOf(c)), r)
		err := m.d.Temporal.SignalWorkflow(visibility.WithCaller(ctx, callerOf(c)), r.ID, "", reservationsact.SignalCancel, nil)
		var gone *serviceerror.NotFound
		if err != nil && !errors.As(err, &gone) {
			m.d.Logger.WarnContext(ctx, "signalling a cancelled reservation's workflow", "reservation", r.ID, "error", err)
		}
	}
	return r, nil
}

// afterRenew restarts the lease in the workflow, which owns the timer, and
// records the new deadline on the row for readers.
func (m methods) afterRenew(ctx context.Context, c *rpc.Call, _ ReservationInput, r Reservation) (Reservation, error) {
	var deadline int64
	if err := m.update(ctx, callerOf(c), r, reservationsact.UpdateRenew, &deadline); err != nil {
		return Reservation{}, err
	}
	if err := m.d.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return domain.RecordLease(ctx, tx, r.ID, deadline)
	}); err != nil {
		return Reservation{}, err
	}
	r, err := m.read(ctx, r.TenantID, r.ID)
	r.LeaseExpiresAt = &deadline
	return r, err
}

// extendStarted tells the workflow the new end. It is best effort: the row
// holds the end, and a workflow that missed the update reads it when its
// old end comes.
func (m methods) extendStarted(ctx context.Context, c *rpc.Call, _ ExtendInput) error {
	r, err := m.read(ctx, c.TenantID, c.Resource.ID)
	if err != nil || m.d.Temporal == nil {
		return err
	}
	var end int64
	if err := m.update(ctx, callerOf(c), r, reservationsact.UpdateExtend, &end, r.End); err != nil {
		if ce := core.AsError(err); ce.Code != core.CodeInvalidState { // INVALID_STATE: it already knows
			m.d.Logger.WarnContext(ctx, "telling a reservation's workflow its new end", "reservation", r.ID, "error", err)
		}
	}
	return nil
}

// read reads a reservation in a read-only transaction of its own, outside
// the call's (after its commit).
func (m methods) read(ctx context.Context, tenantID, id string) (r Reservation, err error) {
	var answer func() (Reservation, error)
	if err := m.d.Store.Read(ctx, func(b *store.Batch) { answer = domain.QueueLoad(b, tenantID, id) }); err != nil {
		return Reservation{}, err
	}
	return answer()
}

// ensureWorkflow starts a live reservation's workflow unless it runs or
// ran, and records the start (the reconciler starts those whose start was
// never recorded). Without a Temporal client (tests of the API alone)
// nothing drives reservations.
func (m methods) ensureWorkflow(ctx context.Context, r Reservation) error {
	if m.d.Temporal == nil {
		return nil
	}
	var active bool
	switch states.State(r.State) {
	case states.Placed, states.Binding:
	case states.Active, states.Expired, states.Releasing:
		active = true
	default:
		return nil
	}
	p := reservationsact.ReservationParams{TenantID: r.TenantID, ReservationID: r.ID, PoolID: r.PoolID, Start: r.Start, End: r.End, Active: active}
	if r.LeaseSeconds != nil {
		p.LeaseSeconds = *r.LeaseSeconds
	}
	if r.LeaseExpiresAt != nil {
		p.LeaseDeadline = *r.LeaseExpiresAt
	}
	if err := reservationsact.StartReservation(ctx, m.d.Temporal, m.d.TaskQueue, p); err != nil {
		return err
	}
	return m.d.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return store.MarkReservationWorkflowStarted(ctx, tx, r.ID)
	})
}

// update sends the reservation's workflow an update and waits for its
// result into out. When no run is found, the workflow is started (its
// start may have been lost) and the update sent once more. The workflow's
// INVALID_STATE rejections come back as INVALID_STATE; a Temporal that
// cannot be reached is UNAVAILABLE.
//
// caller, the API caller's identity id, travels with the update
// (visibility.CallerPropagator), so the workflow knows who asked.
func (m methods) update(ctx context.Context, caller string, r Reservation, name string, out any, args ...any) error {
	if m.d.Temporal == nil {
		return core.Errorf(core.CodeUnavailable, "no workflow engine is configured")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ctx = visibility.WithCaller(ctx, caller)
	update := func() error {
		h, err := m.d.Temporal.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
			WorkflowID: r.ID, UpdateName: name, Args: args, WaitForStage: client.WorkflowUpdateStageCompleted,
		})
		if err != nil {
			return err
		}
		return h.Get(ctx, out)
	}
	var gone *serviceerror.NotFound
	err := update()
	if errors.As(err, &gone) { // no run: its start may have been lost
		if err := m.ensureWorkflow(ctx, r); err != nil {
			return core.Wrap(core.CodeUnavailable, err, "could not start reservation "+r.ID+"'s workflow")
		}
		err = update()
	}
	var app *temporal.ApplicationError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &app) && app.Type() == string(core.CodeInvalidState):
		return core.Errorf(core.CodeInvalidState, "%s", app.Message()).WithDetails(map[string]any{"reservationId": r.ID})
	case errors.As(err, &gone):
		return core.Errorf(core.CodeInvalidState, "reservation %s's workflow has ended", r.ID).WithDetails(map[string]any{"reservationId": r.ID})
	default:
		return core.Wrap(core.CodeUnavailable, err, "reservation "+r.ID+"'s workflow did not answer "+name)
	}
}

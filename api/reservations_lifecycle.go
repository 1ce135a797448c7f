package api

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	capdomain "github.com/better-compute/better-compute/store/capacity"
	pooldomain "github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/workflows"
)

// A reservation's life after placement. PostgreSQL holds the truth and the
// reservation's workflow (workflows.ReservationWorkflow, id = the
// reservation id) drives it; the methods here check the row in the call's
// transaction and, once it commits, tell the workflow:
//
//	release  active -> releasing -> released, by the workflow's release
//	         update (its activity cuts the bookings); idempotent on a
//	         reservation already ending or released
//	cancel   before it is active: -> cancelled and its bookings cut, in
//	         the call's transaction; the workflow is then signalled to stop
//	         waiting (a missed signal is found by its activation activity)
//	renew    restarts an active reservation's allocation lease (the renew
//	         update); it answers the new leaseExpiresAt
//	extend   an admission: the new total duration is written to the
//	         authorization row and decided on (a policy bounding
//	         durationHours sees the extended request), then the extra time
//	         is booked on the same atoms (CONFLICT when another booking holds
//	         them) and the workflow's extend update moves its end (a missed
//	         update is found by its expiry activity, which reads the row)
//	list     the tenant's reservations, newest first; scope mine (the
//	         default) keeps the caller's own in SQL

// reservationRef is the input of release, cancel and renew.
type reservationRef struct {
	ReservationID string `json:"reservationId"`
}

// lockedReservation decodes reservationId and locks the tenant's
// reservation.
func lockedReservation(ctx context.Context, c *Call, tx store.Tx) (Reservation, error) {
	var in reservationRef
	if err := decode(c.Input, &in); err != nil {
		return Reservation{}, err
	}
	return loadReservation(ctx, tx, c.TenantID, in.ReservationID, true)
}

func stateError(r Reservation, verb, hint string) error {
	details := map[string]any{"state": r.State, "reservationId": r.ID}
	msg := "reservation %s is %s and cannot be %s"
	if hint != "" {
		details["hint"] = hint
		msg += "; use " + hint
	}
	return core.Errorf(core.CodeInvalidState, msg, r.ID, r.State, verb).WithDetails(details)
}

func (s *Server) reservationsRelease(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	r, err := lockedReservation(ctx, c, tx)
	if err != nil {
		return nil, err
	}
	switch reservations.State(r.State) {
	case reservations.Active, reservations.Expired, reservations.Releasing, reservations.Released:
		return r, nil
	case reservations.AwaitingConfirmation, reservations.Pending, reservations.Placed, reservations.Binding:
		return nil, stateError(r, "released", "reservations.cancel")
	default:
		return nil, stateError(r, "released", "")
	}
}

// afterRelease asks the workflow to release an active reservation and
// answers the reservation as it then is.
func (s *Server) afterRelease(ctx context.Context, c *Call, out any) (any, error) {
	r := out.(Reservation)
	if r.State == string(reservations.Active) {
		var final string
		if err := s.updateReservation(ctx, r, workflows.UpdateRelease, &final); err != nil {
			return nil, err
		}
	}
	return s.readReservation(ctx, r.TenantID, r.ID)
}

func (s *Server) reservationsCancel(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	r, err := lockedReservation(ctx, c, tx)
	if err != nil {
		return nil, err
	}
	from := reservations.State(r.State)
	switch from {
	case reservations.Cancelled:
		return r, nil
	case reservations.AwaitingConfirmation, reservations.Pending, reservations.Placed, reservations.Binding:
	case reservations.Active:
		return nil, stateError(r, "cancelled", "reservations.release")
	default:
		return nil, stateError(r, "cancelled", "")
	}
	if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, from, reservations.Cancelled, nil); err != nil {
		return nil, err
	}
	if err := store.CutReservationBookings(ctx, tx, r.TenantID, r.ID); err != nil {
		return nil, err
	}
	return loadReservation(ctx, tx, c.TenantID, r.ID, false)
}

// afterCancel tells the workflow to stop waiting. It is best effort: a
// workflow that misses the signal finds the reservation cancelled when it
// tries to activate it.
func (s *Server) afterCancel(ctx context.Context, c *Call, out any) (any, error) {
	r := out.(Reservation)
	if s.deps.Temporal != nil {
		err := s.deps.Temporal.SignalWorkflow(ctx, r.ID, "", workflows.SignalCancel, nil)
		var gone *serviceerror.NotFound
		if err != nil && !errors.As(err, &gone) {
			s.deps.Logger.WarnContext(ctx, "signalling a cancelled reservation's workflow", "reservation", r.ID, "error", err)
		}
	}
	return r, nil
}

func (s *Server) reservationsRenew(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	r, err := lockedReservation(ctx, c, tx)
	if err != nil {
		return nil, err
	}
	if r.LeaseSeconds == nil {
		return nil, core.Errorf(core.CodeInvalidState, "reservation %s was made without leaseSeconds: it has no lease to renew", r.ID).
			WithDetails(map[string]any{"reason": "noLease", "reservationId": r.ID})
	}
	if r.State != string(reservations.Active) {
		return nil, stateError(r, "renewed", "")
	}
	return r, nil
}

// afterRenew restarts the lease in the workflow, which owns the timer, and
// records the new deadline on the row for readers.
func (s *Server) afterRenew(ctx context.Context, c *Call, out any) (any, error) {
	r := out.(Reservation)
	var deadline int64
	if err := s.updateReservation(ctx, r, workflows.UpdateRenew, &deadline); err != nil {
		return nil, err
	}
	err := s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE reservations SET lease_expires_at = timestamptz 'epoch' + $2::bigint * interval '1 millisecond'
			WHERE id = $1 AND (lease_expires_at IS NULL OR lease_expires_at < timestamptz 'epoch' + $2::bigint * interval '1 millisecond')`,
			r.ID, deadline)
		return err
	})
	if err != nil {
		return nil, err
	}
	r, err = s.readReservation(ctx, r.TenantID, r.ID)
	r.LeaseExpiresAt = &deadline
	return r, err
}

// reservations.extend, an admission on the existing row.

func (s *Server) reservationsExtendAdmission() *rpc.ErasedAdmission {
	return &rpc.ErasedAdmission{Prepare: s.extendPrepare, Complete: s.extendComplete,
		Denied: s.extendUndo, Failed: func(ctx context.Context, c *Call, tx store.Tx, _ error) error { return s.extendUndo(ctx, c, tx) },
		Started: s.extendStarted}
}

type extendInput struct {
	ReservationID string `json:"reservationId"`
	// Duration is the reservation's new total duration in seconds, counted
	// from its start (so a retry asks for the same end).
	Duration int64 `json:"duration"`
}

// extendable says whether a reservation in state st can still be extended.
func extendable(st reservations.State) bool {
	return st == reservations.Placed || st == reservations.Binding || st == reservations.Active
}

// extendPrepare (transaction 1) records the requested end and writes the
// authorization row with the new durationHours, so the one decision sees
// the extended request.
func (s *Server) extendPrepare(ctx context.Context, c *Call, tx store.Tx, _ string) (iam.Resource, error) {
	var in extendInput
	if err := decode(c.Input, &in); err != nil {
		return iam.Resource{}, err
	}
	if in.Duration <= 0 || in.Duration > capdomain.MaxPreviewDurationSeconds {
		return iam.Resource{}, badField("duration", "range", "duration must be in [1, %d] seconds", capdomain.MaxPreviewDurationSeconds)
	}
	r, err := loadReservation(ctx, tx, c.TenantID, in.ReservationID, true)
	if err != nil {
		return iam.Resource{}, err
	}
	if !extendable(reservations.State(r.State)) {
		return iam.Resource{}, stateError(r, "extended", "")
	}
	end := r.Start + in.Duration*1000
	if end < r.End {
		return iam.Resource{}, badField("duration", "range",
			"duration %d s ends before the reservation's current end; a reservation can only be extended", in.Duration)
	}
	pool, err := pooldomain.View(ctx, tx, c.TenantID, r.PoolID)
	if err != nil {
		return iam.Resource{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE reservations SET pending_ends_at = timestamptz 'epoch' + $2::bigint * interval '1 millisecond'
		WHERE id = $1`, r.ID, end); err != nil {
		return iam.Resource{}, err
	}
	row := s.reservationAuthzRow(r.TenantID, r.ID, r.OwnerIdentityID, pool, r.Devices, in.Duration, r.Binding, r.ProjectID, r.Spot)
	if err := store.PutAuthzResource(ctx, tx, row); err != nil {
		return iam.Resource{}, err
	}
	return iam.Resource{Type: row.Type, ID: row.ID}, nil
}

// extendComplete (transaction 2) books [end, new end) on the reservation's
// atoms by stretching each booking, so the EXCLUDE constraint refuses the
// stretch when another booking holds an atom then.
func (s *Server) extendComplete(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in extendInput
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	r, err := loadReservation(ctx, tx, c.TenantID, in.ReservationID, true)
	if err != nil {
		return nil, err
	}
	end := r.Start + in.Duration*1000
	var pending *int64
	if err := tx.QueryRow(ctx, `SELECT (extract(epoch FROM pending_ends_at) * 1000)::bigint FROM reservations WHERE id = $1`,
		r.ID).Scan(&pending); err != nil {
		return nil, err
	}
	switch {
	case !extendable(reservations.State(r.State)):
		return nil, stateError(r, "extended", "")
	case pending == nil || *pending != end:
		// Another extension wrote the authorization row after this one: the
		// decision may have been made on its duration.
		return nil, core.Errorf(core.CodeConflict, "a concurrent extension of reservation %s changed the request; retry", r.ID).
			WithDetails(map[string]any{"reason": "concurrentExtension", "reservationId": r.ID})
	}
	if end > r.End {
		pool, err := pooldomain.View(ctx, tx, c.TenantID, r.PoolID)
		if err != nil {
			return nil, err
		}
		if err := checkLimits(ctx, tx, c.TenantID, pool, r, r.End, end, false); err != nil {
			return nil, err
		}
		tag, err := tx.Exec(ctx, `UPDATE device_bookings b
			SET during = tstzrange(lower(b.during), timestamptz 'epoch' + $3::bigint * interval '1 millisecond')
			FROM allocations a
			WHERE a.reservation_id = $1 AND b.allocation_id = a.id
				AND upper(b.during) = timestamptz 'epoch' + $2::bigint * interval '1 millisecond'`, r.ID, r.End, end)
		if pgState(err) == "23P01" {
			return nil, core.Errorf(core.CodeConflict, "another booking holds some of reservation %s's atoms before the new end", r.ID).
				WithDetails(map[string]any{"reason": "atomsTaken", "reservationId": r.ID})
		}
		if err != nil {
			return nil, err
		}
		if tag.RowsAffected() == 0 {
			return nil, core.Errorf(core.CodeInternal, "reservation %s has no bookings ending at its end", r.ID)
		}
		if err := store.PublishEvent(ctx, tx, store.Event{TenantID: r.TenantID, Type: "reservation.extended",
			ResourceType: "reservation", ResourceID: r.ID, ProjectID: r.ProjectID,
			Data: map[string]any{"from": r.End, "to": end, "poolId": r.PoolID}}); err != nil {
			return nil, err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE reservations SET ends_at = timestamptz 'epoch' + $2::bigint * interval '1 millisecond',
		pending_ends_at = NULL, updated_at = now() WHERE id = $1`, r.ID, end); err != nil {
		return nil, err
	}
	return loadReservation(ctx, tx, c.TenantID, r.ID, false)
}

// extendUndo puts the authorization row back to the reservation's real
// duration after a denial or a refusal, so later decisions on the
// reservation do not see the request that was turned down.
func (s *Server) extendUndo(ctx context.Context, c *Call, tx store.Tx) error {
	var in extendInput
	if err := decode(c.Input, &in); err != nil {
		return err
	}
	r, err := loadReservation(ctx, tx, c.TenantID, in.ReservationID, true)
	if err != nil {
		return err
	}
	pool, err := pooldomain.View(ctx, tx, c.TenantID, r.PoolID)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE reservations SET pending_ends_at = NULL
		WHERE id = $1 AND pending_ends_at = timestamptz 'epoch' + $2::bigint * interval '1 millisecond'`,
		r.ID, r.Start+in.Duration*1000); err != nil {
		return err
	}
	seconds := (r.End - r.Start + 999) / 1000
	return store.PutAuthzResource(ctx, tx, s.reservationAuthzRow(r.TenantID, r.ID, r.OwnerIdentityID, pool, r.Devices,
		seconds, r.Binding, r.ProjectID, r.Spot))
}

// extendStarted tells the workflow the new end. It is best effort: the row
// holds the end, and a workflow that missed the update reads it when its
// old end comes.
func (s *Server) extendStarted(ctx context.Context, c *Call) error {
	r, err := s.readReservation(ctx, c.TenantID, c.Resource.ID)
	if err != nil || s.deps.Temporal == nil {
		return err
	}
	var end int64
	if err := s.updateReservation(ctx, r, workflows.UpdateExtend, &end, r.End); err != nil {
		if ce := core.AsError(err); ce.Code != core.CodeInvalidState { // INVALID_STATE: it already knows
			s.deps.Logger.WarnContext(ctx, "telling a reservation's workflow its new end", "reservation", r.ID, "error", err)
		}
	}
	return nil
}

// checkLimits checks a request for r's atoms over [from, to) (a new
// reservation's window, or an extension's added time), before it is
// booked, against the tenant's limits on the pool, under one lock per
// (tenant, pool) held to the commit, so two requests cannot share the same
// headroom (QUOTA_EXCEEDED with the limit either way). Checking before
// placement also keeps one tenant's concurrent requests from all placing
// onto the same free atoms and re-placing after each other's commits.
//
//   - on a pool offered to the tenant, the atoms of r's class the tenant
//     has booked in the pool over [from, to), plus r's, stay within the
//     offer's quota;
//   - with newReservation starting in the future and the pool's
//     policy.maxPending, the tenant's other reservations in the pool that
//     have not begun yet stay below it, so no tenant hoards the pool's
//     future (a reservation starting now is never held back by it).
func checkLimits(ctx context.Context, tx store.Tx, tenantID string, pool pooldomain.Pool, r Reservation, from, to int64, newReservation bool) error {
	offered := pool.TenantID != tenantID && pool.Offer != nil
	maxPending := pool.Policy.MaxPending
	if !newReservation {
		maxPending = nil
	}
	if !offered && maxPending == nil {
		return nil
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "quota:"+tenantID+":"+pool.ID); err != nil {
		return err
	}
	if offered {
		req := r.Devices
		limit := pool.Offer.Quota[req.Class]
		inUse, err := capdomain.BookedInPool(ctx, tx, tenantID, pool.ID, req.Class, from, to)
		if err != nil {
			return err
		}
		if inUse+int64(req.Count) > limit {
			return core.Errorf(core.CodeQuotaExceeded, "%d %s booked over the window plus %d requested exceeds the quota of %d",
				inUse, req.Class, req.Count, limit).
				WithDetails(map[string]any{"resource": req.Class, "limit": limit, "inUse": inUse, "requested": req.Count, "reservationId": r.ID})
		}
	}
	if maxPending != nil {
		var pending int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM reservations
			WHERE tenant_id = $1 AND pool_id = $2 AND id <> $3 AND starts_at > now()
				AND state IN ('awaiting-confirmation', 'pending', 'placed', 'binding')
				AND timestamptz 'epoch' + $4::bigint * interval '1 millisecond' > now()`,
			tenantID, pool.ID, r.ID, r.Start).Scan(&pending); err != nil {
			return err
		}
		if pending >= *maxPending {
			return core.Errorf(core.CodeQuotaExceeded, "%d reservations in pool %s have not begun yet; the pool allows %d",
				pending, pool.ID, *maxPending).
				WithDetails(map[string]any{"resource": "pendingReservations", "limit": *maxPending, "inUse": pending, "reservationId": r.ID})
		}
	}
	return nil
}

// updateReservation sends the reservation's workflow an update and waits for
// its result into out. When no run is found, the workflow is started (its
// start may have been lost) and the update sent once more.
// The workflow's INVALID_STATE rejections come back as INVALID_STATE; a
// Temporal that cannot be reached is UNAVAILABLE.
func (s *Server) updateReservation(ctx context.Context, r Reservation, name string, out any, args ...any) error {
	if s.deps.Temporal == nil {
		return core.Errorf(core.CodeUnavailable, "no workflow engine is configured")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	update := func() error {
		h, err := s.deps.Temporal.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
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
		if err := s.ensureReservationWorkflow(ctx, r); err != nil {
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

// readReservation reads a reservation in a read-only transaction of its
// own, outside the call's (after its commit).
func (s *Server) readReservation(ctx context.Context, tenantID, id string) (r Reservation, err error) {
	err = s.store.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
		r, err = loadReservation(ctx, tx, tenantID, id, false)
		return err
	})
	return r, err
}

// ReservationList is reservations.list's answer.
type ReservationList struct {
	Items []Reservation `json:"items"`
}

func (s *Server) reservationsList(ctx context.Context, c *Call, tx store.Tx) (rpc.Page, error) {
	var in struct {
		State     string `json:"state"`
		PoolID    string `json:"poolId"`
		ProjectID string `json:"projectId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return rpc.Page{}, err
	}
	owner := ""
	if c.Scope == rpc.ScopeMine {
		owner = c.Caller.IdentityID
	}
	// The SQL pre-filter: the tenant's decided reservations (drafts are not
	// listed) of which the projection holds a row.
	rows, err := tx.Query(ctx, `SELECT `+reservationColumns+` FROM reservations r
		WHERE r.tenant_id = $1 AND r.state <> 'draft'
			AND ($2 = '' OR r.owner_identity_id = $2) AND ($3 = '' OR r.state = $3)
			AND ($4 = '' OR r.pool_id = $4) AND ($5 = '' OR r.project_id = $5)
			AND EXISTS (SELECT 1 FROM authz_resources a WHERE a.type = $6 AND a.id = r.id AND a.tenant_id = $1)
		ORDER BY r.created_at DESC, r.id DESC LIMIT $7`,
		c.TenantID, owner, in.State, in.PoolID, in.ProjectID, s.catalog.FullName("reservation"), listLimit)
	if err != nil {
		return rpc.Page{}, err
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Reservation, error) { return scanReservation(row) })
	if err != nil {
		return rpc.Page{}, err
	}
	if err := withAllocations(ctx, tx, items); err != nil {
		return rpc.Page{}, err
	}
	return rpc.PageOf(items, func(r Reservation) iam.Resource {
		return iam.Resource{Type: s.catalog.FullName("reservation"), ID: r.ID}
	},
		func(kept []Reservation) any { return ReservationList{Items: kept} }), nil
}

package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/workflows"
)

// reservations.create is an admission (admission.go):
//
//	prepare (transaction 1): the pool must resolve in the tenant's view (own
//	or offered; NOT_FOUND otherwise); the draft row (state draft) and its
//	authorization row (compute-reservation, parent the pool, owner the
//	caller, attributes region, gpuModel, gpuCount, durationHours, binding,
//	projectId, spot) are written.
//	the decision on the draft; a denial leaves it denied.
//	complete (transaction 2): draft -> pending; on an offered pool the
//	tenant's atoms of the class booked in the pool over the window plus the
//	request must stay within the offer's quota (QUOTA_EXCEEDED, details.limit);
//	the pool's free atoms over [start, end) are read as capacity.preview
//	reads them and core/placement places the request; one allocation per
//	node and one device_bookings row per atom are inserted under a
//	SAVEPOINT. A concurrent booking that won (23P01, or a deadlock 40P01)
//	rolls back to the savepoint, and the atoms are read and placed again:
//	each conflict means another booking committed, so a few attempts
//	suffice (after maxPlaceAttempts, UNAVAILABLE: retry with the same key).
//	On success pending -> placed.
//
// When nothing fits the answer is INVALID_STATE with details.reason
// "noCapacity" and the placement reasons in details.reasons (the spec's
// codes have no capacity code: QUOTA_EXCEEDED is the tenant's quota,
// UNAVAILABLE a transient failure). A refused reservation (no capacity, over
// quota) is marked failed with its failure recorded; since transaction 2
// rolls back with the error, the mark is its own transaction, run once
// transaction 2 has let its connection go (the admission's failed hook).
//
// Only this file changes a reservation's state, always through
// core/reservations.Transition (setState).

const maxPlaceAttempts = 16

// Reservation is a reservation as reservations.create and .get answer it.
type Reservation struct {
	ID              string                  `json:"id"`
	TenantID        string                  `json:"tenantId"`
	OwnerIdentityID string                  `json:"ownerIdentityId"`
	PoolID          string                  `json:"poolId"`
	ProjectID       string                  `json:"projectId,omitempty"`
	State           string                  `json:"state"`
	Devices         placement.Request       `json:"devices"`
	Start           int64                   `json:"start"` // epoch ms
	End             int64                   `json:"end"`   // epoch ms, exclusive
	Binding         string                  `json:"binding"`
	LeaseSeconds    *int64                  `json:"leaseSeconds,omitempty"`
	Spot            bool                    `json:"spot"`
	Failure         json.RawMessage         `json:"failure,omitempty"`
	Allocations     []ReservationAllocation `json:"allocations"`
	CreatedAt       int64                   `json:"createdAt"`
	UpdatedAt       int64                   `json:"updatedAt"`
}

// ReservationAllocation is one node's share of a reservation.
type ReservationAllocation struct {
	ID     string   `json:"id"`
	NodeID string   `json:"nodeId"`
	Atoms  []string `json:"atoms"`
}

// gpuClasses are the classes whose count is the draft's gpuCount.
var gpuClasses = map[string]bool{placement.ClassGPU: true, placement.ClassMIG: true, placement.ClassSlot: true}

func (s *Server) reservationsAdmission() *admission {
	return &admission{prepare: s.reservationsPrepare, complete: s.reservationsComplete,
		denied: s.reservationsDenied, failed: s.reservationsFailed, started: s.reservationsStarted}
}

type reservationInput struct {
	PoolID       string          `json:"poolId"`
	Devices      json.RawMessage `json:"devices"`
	Start        *int64          `json:"start"`
	Duration     int64           `json:"duration"`
	Binding      string          `json:"binding"`
	LeaseSeconds *int64          `json:"leaseSeconds"`
	ProjectID    string          `json:"projectId"`
	Spot         bool            `json:"spot"`
}

func (s *Server) reservationsPrepare(ctx context.Context, c *Call, tx store.Tx, draftID string) (iam.Resource, error) {
	var in reservationInput
	if err := decode(c.Input, &in); err != nil {
		return iam.Resource{}, err
	}
	if err := exactKeys(in.Devices, "devices", previewKeys); err != nil {
		return iam.Resource{}, err
	}
	var req placement.Request
	if err := json.NewDecoder(bytes.NewReader(in.Devices)).Decode(&req); err != nil {
		return iam.Resource{}, core.Wrap(core.CodeInvalidInput, err, "devices does not match {class, count, selector, topology}").
			WithDetails(map[string]any{"field": "devices", "reason": "type"})
	}
	req, verr := placement.Normalize(req, "devices.")
	if verr != nil {
		return iam.Resource{}, verr
	}
	if in.Binding == "" {
		in.Binding = "hold"
	}
	switch {
	case in.Start != nil && (*in.Start < 0 || *in.Start > maxPreviewStart):
		return iam.Resource{}, badField("start", "range", "start must be epoch milliseconds in [0, %d]", maxPreviewStart)
	case in.Duration <= 0 || in.Duration > MaxPreviewDurationSeconds:
		return iam.Resource{}, badField("duration", "range", "duration must be in [1, %d] seconds", MaxPreviewDurationSeconds)
	case in.LeaseSeconds != nil && *in.LeaseSeconds <= 0:
		return iam.Resource{}, badField("leaseSeconds", "range", "leaseSeconds must be at least 1")
	case in.Binding == "node":
		return iam.Resource{}, core.Errorf(core.CodeUnsupported, "binding node is planned for v0.5").
			WithDetails(map[string]any{"field": "binding", "reason": "planned", "phase": "v0.5"})
	}
	pool, err := s.viewPool(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return iam.Resource{}, err
	}
	if pool.ArchivedAt != nil {
		return iam.Resource{}, core.Errorf(core.CodeInvalidState, "pool %s is archived", pool.ID).
			WithDetails(map[string]any{"reason": "archived"})
	}
	if in.ProjectID != "" {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM projects WHERE id = $1 AND tenant_id = $2 AND archived_at IS NULL`, in.ProjectID, c.TenantID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return iam.Resource{}, core.Errorf(core.CodeNotFound, "project %s not found", in.ProjectID)
		} else if err != nil {
			return iam.Resource{}, err
		}
	}
	start := int64(0)
	if in.Start != nil {
		start = *in.Start
	} else {
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return iam.Resource{}, err
		}
		start = now.UnixMilli()
	}
	end := start + in.Duration*1000
	devices, err := json.Marshal(req)
	if err != nil {
		return iam.Resource{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO reservations (id, tenant_id, owner_identity_id, pool_id, project_id, state, devices,
			starts_at, ends_at, binding, lease_seconds, spot)
		VALUES ($1, $2, $3, $4, $5, $6, $7, timestamptz 'epoch' + $8::bigint * interval '1 millisecond',
			timestamptz 'epoch' + $9::bigint * interval '1 millisecond', $10, $11, $12)`,
		draftID, c.TenantID, c.Caller.IdentityID, pool.ID, in.ProjectID, string(reservations.Draft), devices,
		start, end, in.Binding, in.LeaseSeconds, in.Spot); err != nil {
		return iam.Resource{}, err
	}
	attrs := map[string]any{"region": pool.Region, "gpuModel": pool.GPUModel,
		"durationHours": (in.Duration + 3599) / 3600, "binding": in.Binding, "spot": in.Spot}
	if gpuClasses[req.Class] {
		attrs["gpuCount"] = req.Count
	}
	if in.ProjectID != "" {
		attrs["projectId"] = in.ProjectID
	}
	row := store.AuthzResource{Type: s.catalog.FullName("reservation"), ID: draftID, TenantID: c.TenantID,
		OwnerID: c.Caller.IdentityID, ParentType: s.catalog.FullName("pool"), ParentID: pool.ID, Attributes: attrs}
	if err := store.PutAuthzResource(ctx, tx, row); err != nil {
		return iam.Resource{}, err
	}
	return iam.Resource{Type: row.Type, ID: row.ID}, nil
}

func (s *Server) reservationsDenied(ctx context.Context, c *Call, tx store.Tx) error {
	r, err := loadReservation(ctx, tx, c.TenantID, c.Resource.ID, true)
	if err != nil {
		return err
	}
	if r.State != string(reservations.Draft) {
		return nil
	}
	return setState(ctx, tx, r.ID, reservations.Draft, reservations.Denied, nil)
}

func (s *Server) reservationsComplete(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	r, err := loadReservation(ctx, tx, c.TenantID, c.Resource.ID, true)
	if err != nil {
		return nil, err
	}
	if r.State == string(reservations.Failed) && r.Failure != nil {
		return nil, failureError(r)
	}
	if err := setState(ctx, tx, r.ID, reservations.State(r.State), reservations.Pending, nil); err != nil {
		return nil, err
	}
	pool, err := s.viewPool(ctx, tx, c.TenantID, r.PoolID)
	if err != nil {
		return nil, err
	}
	req := r.Devices
	if pool.TenantID != c.TenantID && pool.Offer != nil {
		// One quota check at a time per (tenant, pool), so two requests
		// cannot both fit under the same headroom.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "quota:"+c.TenantID+":"+pool.ID); err != nil {
			return nil, err
		}
		limit := pool.Offer.Quota[req.Class]
		var inUse int64
		if err := tx.QueryRow(ctx, previewInUse, c.TenantID, pool.ID, req.Class, r.Start, r.End).Scan(&inUse); err != nil {
			return nil, err
		}
		if inUse+int64(req.Count) > limit {
			err := core.Errorf(core.CodeQuotaExceeded, "%d %s booked over the window plus %d requested exceeds the quota of %d",
				inUse, req.Class, req.Count, limit).
				WithDetails(map[string]any{"resource": req.Class, "limit": limit, "inUse": inUse, "requested": req.Count, "reservationId": r.ID})
			return nil, err
		}
	}
	for attempt := 0; attempt < maxPlaceAttempts; attempt++ {
		nodes, err := freeNodes(ctx, tx, pool.ID, req.Class, r.Start, r.End)
		if err != nil {
			return nil, err
		}
		plan, reasons := placement.Place(req, nodes)
		if len(reasons) > 0 {
			err := core.Errorf(core.CodeInvalidState, "the request does not fit in pool %s over the window", pool.ID).
				WithDetails(map[string]any{"reason": "noCapacity", "reasons": reasons, "reservationId": r.ID})
			return nil, err
		}
		sp, err := tx.Begin(ctx) // a SAVEPOINT
		if err != nil {
			return nil, err
		}
		if err := book(ctx, sp, r, plan); err != nil {
			if rerr := sp.Rollback(ctx); rerr != nil {
				return nil, rerr
			}
			if st := pgState(err); st == "23P01" || st == "40P01" {
				continue // a concurrent booking won: read and place again
			}
			return nil, err
		}
		if err := sp.Commit(ctx); err != nil {
			return nil, err
		}
		if err := setState(ctx, tx, r.ID, reservations.Pending, reservations.Placed, nil); err != nil {
			return nil, err
		}
		return loadReservation(ctx, tx, c.TenantID, r.ID, false)
	}
	return nil, core.Errorf(core.CodeUnavailable, "concurrent bookings kept taking the atoms; retry with the same idempotencyKey").
		WithDetails(map[string]any{"reason": "contention", "reservationId": r.ID})
}

func (s *Server) reservationsGet(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		ReservationID string `json:"reservationId"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return loadReservation(ctx, tx, c.TenantID, in.ReservationID, false)
}

// failureError is the error a failed reservation was refused with.
func failureError(r Reservation) error {
	var f struct {
		Code    core.Code      `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details"`
	}
	_ = json.Unmarshal(r.Failure, &f)
	if f.Code == "" {
		f.Code = core.CodeInvalidState
	}
	return core.Errorf(f.Code, "reservation %s failed: %s", r.ID, f.Message).WithDetails(f.Details)
}

// reservationsFailed records a final refusal (no capacity, over quota):
// draft or pending -> failed, with the error a replay of the key answers.
func (s *Server) reservationsFailed(ctx context.Context, c *Call, tx store.Tx, cause error) error {
	ce := core.AsError(cause)
	if ce.Code != core.CodeQuotaExceeded && !(ce.Code == core.CodeInvalidState && ce.Details["reason"] == "noCapacity") {
		return nil // not final: a retry with the same key may still place it
	}
	failure, err := json.Marshal(map[string]any{"code": ce.Code, "message": ce.Message, "details": ce.Details})
	if err != nil {
		return err
	}
	r, err := loadReservation(ctx, tx, c.TenantID, c.Resource.ID, true)
	if err != nil {
		return err
	}
	from := reservations.State(r.State)
	if from == reservations.Draft {
		if err := setState(ctx, tx, r.ID, from, reservations.Pending, nil); err != nil {
			return err
		}
		from = reservations.Pending
	}
	if from != reservations.Pending {
		return nil // placed by a retry meanwhile, or already failed
	}
	return setState(ctx, tx, r.ID, from, reservations.Failed, failure)
}

// setState is the one writer of reservations.state.
func setState(ctx context.Context, tx store.Tx, id string, from, to reservations.State, failure json.RawMessage) error {
	if err := reservations.Transition(from, to); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `UPDATE reservations SET state = $3, failure = COALESCE($4, failure), updated_at = now()
		WHERE id = $1 AND state = $2`, id, string(from), string(to), failure)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return core.Errorf(core.CodeConflict, "reservation %s is no longer %s", id, from)
	}
	return nil
}

// book inserts the plan's allocations and their bookings. Allocations come
// sorted by node and atoms by id, so concurrent bookers take the atoms'
// locks in one order.
func book(ctx context.Context, tx store.Tx, r Reservation, plan placement.Plan) error {
	for _, a := range plan.Allocations {
		id := core.NewID("alloc")
		if _, err := tx.Exec(ctx, `INSERT INTO allocations (id, tenant_id, reservation_id, node_id, atoms) VALUES ($1, $2, $3, $4, $5)`,
			id, r.TenantID, r.ID, a.NodeID, a.Atoms); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
			SELECT $1, atom, $3, $4, $5, tstzrange(timestamptz 'epoch' + $6::bigint * interval '1 millisecond',
				timestamptz 'epoch' + $7::bigint * interval '1 millisecond'), $8
			FROM unnest($2::text[]) WITH ORDINALITY AS u(atom, n) ORDER BY n`,
			a.NodeID, a.Atoms, id, r.TenantID, r.PoolID, r.Start, r.End, r.Binding); err != nil {
			return err
		}
	}
	return nil
}

func pgState(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

// loadReservation reads one of the tenant's reservations with its
// allocations (NOT_FOUND for another tenant's); lock locks the row.
func loadReservation(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (Reservation, error) {
	q := `SELECT id, tenant_id, owner_identity_id, pool_id, project_id, state, devices,
			(extract(epoch FROM starts_at) * 1000)::bigint, (extract(epoch FROM ends_at) * 1000)::bigint,
			binding, lease_seconds, spot, failure,
			(extract(epoch FROM created_at) * 1000)::bigint, (extract(epoch FROM updated_at) * 1000)::bigint
		FROM reservations WHERE id = $1 AND tenant_id = $2`
	if lock {
		q += ` FOR UPDATE`
	}
	var r Reservation
	var failure []byte
	err := tx.QueryRow(ctx, q, id, tenantID).Scan(&r.ID, &r.TenantID, &r.OwnerIdentityID, &r.PoolID, &r.ProjectID, &r.State,
		&r.Devices, &r.Start, &r.End, &r.Binding, &r.LeaseSeconds, &r.Spot, &failure, &r.CreatedAt, &r.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, core.Errorf(core.CodeNotFound, "reservation %s not found", id)
	}
	if err != nil {
		return r, err
	}
	if failure != nil {
		r.Failure = failure
	}
	rows, err := tx.Query(ctx, `SELECT id, node_id, atoms FROM allocations WHERE reservation_id = $1 ORDER BY node_id, id`, id)
	if err != nil {
		return r, err
	}
	r.Allocations, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReservationAllocation, error) {
		var a ReservationAllocation
		return a, row.Scan(&a.ID, &a.NodeID, &a.Atoms)
	})
	if r.Allocations == nil {
		r.Allocations = []ReservationAllocation{}
	}
	return r, err
}

// reservationsStarted starts the reservation's workflow (id = the
// reservation id) once it is placed. It is idempotent: an existing run is
// used, and a finished one is not started again. Without a Temporal client
// (tests of the API alone) nothing drives reservations.
func (s *Server) reservationsStarted(ctx context.Context, c *Call) error {
	if s.deps.Temporal == nil {
		return nil
	}
	var r Reservation
	err := s.store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		r, err = loadReservation(ctx, tx, c.TenantID, c.Resource.ID, false)
		return err
	})
	if err != nil {
		return err
	}
	switch reservations.State(r.State) {
	case reservations.Placed, reservations.Binding, reservations.Active:
	default:
		return nil
	}
	params := workflows.ReservationParams{TenantID: r.TenantID, ReservationID: r.ID, Start: r.Start, End: r.End}
	if r.LeaseSeconds != nil {
		params.LeaseSeconds = *r.LeaseSeconds
	}
	_, err = s.deps.Temporal.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       r.ID,
		TaskQueue:                s.deps.TaskQueue,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
	}, workflows.ReservationWorkflowName, params)
	var done *serviceerror.WorkflowExecutionAlreadyStarted
	if errors.As(err, &done) {
		return nil // it ran and finished: nothing to start
	}
	return err
}

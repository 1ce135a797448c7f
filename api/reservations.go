package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	"github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	capdomain "github.com/better-compute/better-compute/store/capacity"
	pooldomain "github.com/better-compute/better-compute/store/pools"
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
//	complete (transaction 2): draft -> pending; the tenant's limits are
//	checked (checkLimits: an offered pool's quota, QUOTA_EXCEEDED with
//	details.limit, and policy.maxPending) under a per-(tenant, pool) lock
//	held to the commit; the pool's free atoms over [start, end) are read as
//	capacity.preview reads them and core/placement places the request; one
//	allocation per node and one device_bookings row per atom are inserted
//	under a SAVEPOINT. A concurrent booking that won (23P01, or a deadlock
//	40P01) rolls back to the savepoint, and the atoms are read and placed
//	again: each conflict means another booking committed, so a few attempts
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
// A reservation's state changes only through store.SetReservationState,
// which checks the edge with core/reservations.Transition and publishes the
// change as an event in the same transaction.

const maxPlaceAttempts = 16

// Reservation is a reservation as reservations.create and .get answer it.
type Reservation struct {
	ID              string            `json:"id"`
	TenantID        string            `json:"tenantId"`
	OwnerIdentityID string            `json:"ownerIdentityId"`
	PoolID          string            `json:"poolId"`
	ProjectID       string            `json:"projectId,omitempty"`
	State           string            `json:"state"`
	Devices         placement.Request `json:"devices"`
	Start           int64             `json:"start"` // epoch ms
	End             int64             `json:"end"`   // epoch ms, exclusive
	Binding         string            `json:"binding"`
	LeaseSeconds    *int64            `json:"leaseSeconds,omitempty"`
	// LeaseExpiresAt is when the allocation lease lapses unless renewed
	// (epoch ms), as of the activation or the last renewal.
	LeaseExpiresAt *int64                  `json:"leaseExpiresAt,omitempty"`
	Spot           bool                    `json:"spot"`
	Failure        json.RawMessage         `json:"failure,omitempty"`
	Allocations    []ReservationAllocation `json:"allocations"`
	CreatedAt      int64                   `json:"createdAt"`
	UpdatedAt      int64                   `json:"updatedAt"`
}

// ReservationAllocation is one node's share of a reservation.
type ReservationAllocation struct {
	ID     string   `json:"id"`
	NodeID string   `json:"nodeId"`
	Atoms  []string `json:"atoms"`
}

// gpuClasses are the classes whose count is the draft's gpuCount.
var gpuClasses = map[string]bool{placement.ClassGPU: true, placement.ClassMIG: true, placement.ClassSlot: true}

func (s *Server) reservationsAdmission() *rpc.ErasedAdmission {
	return &rpc.ErasedAdmission{Prepare: s.reservationsPrepare, Complete: s.reservationsComplete,
		Denied: s.reservationsDenied, Failed: s.reservationsFailed, Started: s.reservationsStarted}
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
	case in.Start != nil && (*in.Start < 0 || *in.Start > capdomain.MaxPreviewStart):
		return iam.Resource{}, badField("start", "range", "start must be epoch milliseconds in [0, %d]", capdomain.MaxPreviewStart)
	case in.Duration <= 0 || in.Duration > capdomain.MaxPreviewDurationSeconds:
		return iam.Resource{}, badField("duration", "range", "duration must be in [1, %d] seconds", capdomain.MaxPreviewDurationSeconds)
	case in.LeaseSeconds != nil && *in.LeaseSeconds <= 0:
		return iam.Resource{}, badField("leaseSeconds", "range", "leaseSeconds must be at least 1")
	case in.Binding == "node":
		return iam.Resource{}, core.Errorf(core.CodeUnsupported, "binding node is planned for v0.5").
			WithDetails(map[string]any{"field": "binding", "reason": "planned", "phase": "v0.5"})
	}
	pool, err := pooldomain.View(ctx, tx, c.TenantID, in.PoolID)
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
	row := s.reservationAuthzRow(c.TenantID, draftID, c.Caller.IdentityID, pool, req, in.Duration, in.Binding, in.ProjectID, in.Spot)
	if err := store.PutAuthzResource(ctx, tx, row); err != nil {
		return iam.Resource{}, err
	}
	return iam.Resource{Type: row.Type, ID: row.ID}, nil
}

// reservationAuthzRow is a reservation's authorization row: parent its pool,
// owner its creator, and the attributes policies decide on, durationHours
// rounded up from durationSeconds.
func (s *Server) reservationAuthzRow(tenantID, id, ownerID string, pool pooldomain.Pool, req placement.Request,
	durationSeconds int64, binding, projectID string, spot bool) store.AuthzResource {
	attrs := map[string]any{"region": pool.Region, "gpuModel": pool.GPUModel,
		"durationHours": (durationSeconds + 3599) / 3600, "binding": binding, "spot": spot}
	if gpuClasses[req.Class] {
		attrs["gpuCount"] = req.Count
	}
	if projectID != "" {
		attrs["projectId"] = projectID
	}
	return store.AuthzResource{Type: s.catalog.FullName("reservation"), ID: id, TenantID: tenantID,
		OwnerID: ownerID, ParentType: s.catalog.FullName("pool"), ParentID: pool.ID, Attributes: attrs}
}

func (s *Server) reservationsDenied(ctx context.Context, c *Call, tx store.Tx) error {
	r, err := loadReservation(ctx, tx, c.TenantID, c.Resource.ID, true)
	if err != nil {
		return err
	}
	if r.State != string(reservations.Draft) {
		return nil
	}
	return store.SetReservationState(ctx, tx, r.TenantID, r.ID, reservations.Draft, reservations.Denied, nil)
}

func (s *Server) reservationsComplete(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	r, err := loadReservation(ctx, tx, c.TenantID, c.Resource.ID, true)
	if err != nil {
		return nil, err
	}
	if r.State == string(reservations.Failed) && r.Failure != nil {
		return nil, failureError(r)
	}
	if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, reservations.State(r.State), reservations.Pending, nil); err != nil {
		return nil, err
	}
	pool, err := pooldomain.View(ctx, tx, c.TenantID, r.PoolID)
	if err != nil {
		return nil, err
	}
	if err := checkLimits(ctx, tx, c.TenantID, pool, r, r.Start, r.End, true); err != nil {
		return nil, err
	}
	req := r.Devices
	for attempt := 0; attempt < maxPlaceAttempts; attempt++ {
		nodes, err := capdomain.FreeNodes(ctx, tx, pool.ID, req.Class, r.Start, r.End, false)
		if err != nil {
			return nil, err
		}
		plan, reasons := placement.Place(req, nodes)
		var victims []spotVictim
		if len(reasons) > 0 && !r.Spot {
			// Atoms held only by spot reservations are this request's
			// for the taking.
			if nodes, err = capdomain.FreeNodes(ctx, tx, pool.ID, req.Class, r.Start, r.End, true); err != nil {
				return nil, err
			}
			if p, rs := placement.Place(req, nodes); len(rs) == 0 {
				if victims, err = spotVictims(ctx, tx, p, r.Start, r.End); err != nil {
					return nil, err
				}
				plan, reasons = p, nil
			}
		}
		if len(reasons) > 0 {
			err := core.Errorf(core.CodeInvalidState, "the request does not fit in pool %s over the window", pool.ID).
				WithDetails(map[string]any{"reason": "noCapacity", "reasons": reasons, "reservationId": r.ID})
			return nil, err
		}
		sp, err := tx.Begin(ctx) // a SAVEPOINT
		if err != nil {
			return nil, err
		}
		err = preempt(ctx, sp, victims, r)
		if err == nil {
			err = book(ctx, sp, r, plan)
		}
		if err != nil {
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
		if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, reservations.Pending, reservations.Placed, nil); err != nil {
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
	return core.Errorf(f.Code, "reservation %s Failed: %s", r.ID, f.Message).WithDetails(f.Details)
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
		if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, from, reservations.Pending, nil); err != nil {
			return err
		}
		from = reservations.Pending
	}
	if from != reservations.Pending {
		return nil // placed by a retry meanwhile, or already failed
	}
	return store.SetReservationState(ctx, tx, r.TenantID, r.ID, from, reservations.Failed, failure)
}

// spotVictim is a spot reservation a placement preempts.
type spotVictim struct{ tenantID, id string }

// spotVictims are the spot reservations holding the plan's atoms (or a
// whole-node device of their nodes) over [start, end), by id so that
// concurrent preemptions lock them in one order.
func spotVictims(ctx context.Context, tx store.Tx, plan placement.Plan, start, end int64) ([]spotVictim, error) {
	var nodeIDs, atoms []string
	for _, a := range plan.Allocations {
		for _, atom := range a.Atoms {
			nodeIDs, atoms = append(nodeIDs, a.NodeID), append(atoms, atom)
		}
	}
	rows, err := tx.Query(ctx, `SELECT DISTINCT rs.tenant_id, rs.id FROM device_bookings b
		JOIN devices d ON d.node_id = b.device_node_id AND d.device_id = b.device_id
		JOIN allocations a ON a.id = b.allocation_id JOIN reservations rs ON rs.id = a.reservation_id
		WHERE rs.spot AND b.during && tstzrange(timestamptz 'epoch' + $3::bigint * interval '1 millisecond',
				timestamptz 'epoch' + $4::bigint * interval '1 millisecond')
			AND ((b.device_node_id, b.device_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
				OR (d.class = 'node' AND b.device_node_id = ANY($1)))
		ORDER BY rs.id`, nodeIDs, atoms, start, end)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (spotVictim, error) {
		var v spotVictim
		return v, row.Scan(&v.tenantID, &v.id)
	})
}

// preempt ends the spot victims of reservation r, their atoms freed from
// r's start (or now, if that is later: what has run stays booked).
func preempt(ctx context.Context, tx store.Tx, victims []spotVictim, r Reservation) error {
	at := time.UnixMilli(r.Start)
	if now := time.Now(); now.Before(at) {
		at = now
	}
	for _, v := range victims {
		if err := store.PreemptReservation(ctx, tx, v.tenantID, v.id, r.ID, at); err != nil {
			return err
		}
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

// reservationColumns are what scanReservation reads, from reservations r.
const reservationColumns = `r.id, r.tenant_id, r.owner_identity_id, r.pool_id, r.project_id, r.state, r.devices,
	(extract(epoch FROM r.starts_at) * 1000)::bigint, (extract(epoch FROM r.ends_at) * 1000)::bigint,
	r.binding, r.lease_seconds, (extract(epoch FROM r.lease_expires_at) * 1000)::bigint, r.spot, r.failure,
	(extract(epoch FROM r.created_at) * 1000)::bigint, (extract(epoch FROM r.updated_at) * 1000)::bigint`

func scanReservation(row pgx.Row) (Reservation, error) {
	var r Reservation
	var failure []byte
	err := row.Scan(&r.ID, &r.TenantID, &r.OwnerIdentityID, &r.PoolID, &r.ProjectID, &r.State, &r.Devices, &r.Start, &r.End,
		&r.Binding, &r.LeaseSeconds, &r.LeaseExpiresAt, &r.Spot, &failure, &r.CreatedAt, &r.UpdatedAt)
	if failure != nil {
		r.Failure = failure
	}
	r.Allocations = []ReservationAllocation{}
	return r, err
}

// loadReservation reads one of the tenant's reservations with its
// allocations (NOT_FOUND for another tenant's); lock locks the row.
func loadReservation(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (Reservation, error) {
	q := `SELECT ` + reservationColumns + ` FROM reservations r WHERE r.id = $1 AND r.tenant_id = $2`
	if lock {
		q += ` FOR UPDATE`
	}
	r, err := scanReservation(tx.QueryRow(ctx, q, id, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, core.Errorf(core.CodeNotFound, "reservation %s not found", id)
	}
	if err != nil {
		return r, err
	}
	list := []Reservation{r}
	err = withAllocations(ctx, tx, list)
	return list[0], err
}

// withAllocations fills in the reservations' allocations with one query.
func withAllocations(ctx context.Context, tx store.Tx, list []Reservation) error {
	ids := make([]string, len(list))
	at := make(map[string]int, len(list))
	for i, r := range list {
		ids[i], at[r.ID] = r.ID, i
	}
	rows, err := tx.Query(ctx, `SELECT reservation_id, id, node_id, atoms FROM allocations
		WHERE reservation_id = ANY($1) ORDER BY reservation_id, node_id, id`, ids)
	if err != nil {
		return err
	}
	var rid string
	var a ReservationAllocation
	_, err = pgx.ForEachRow(rows, []any{&rid, &a.ID, &a.NodeID, &a.Atoms}, func() error {
		r := &list[at[rid]]
		r.Allocations = append(r.Allocations, ReservationAllocation{ID: a.ID, NodeID: a.NodeID, Atoms: slices.Clone(a.Atoms)})
		return nil
	})
	return err
}

// reservationsStarted starts the reservation's workflow once it is placed
// (the admission's started hook, run after the commit and on every replay).
func (s *Server) reservationsStarted(ctx context.Context, c *Call) error {
	r, err := s.readReservation(ctx, c.TenantID, c.Resource.ID)
	if err != nil {
		return err
	}
	return s.ensureReservationWorkflow(ctx, r)
}

// ensureReservationWorkflow starts a live reservation's workflow unless it
// runs or ran, and records the start (the reconciler starts those whose
// start was never recorded). Without a Temporal client (tests of the API
// alone) nothing drives reservations.
func (s *Server) ensureReservationWorkflow(ctx context.Context, r Reservation) error {
	if s.deps.Temporal == nil {
		return nil
	}
	var active bool
	switch reservations.State(r.State) {
	case reservations.Placed, reservations.Binding:
	case reservations.Active, reservations.Expired, reservations.Releasing:
		active = true
	default:
		return nil
	}
	p := workflows.ReservationParams{TenantID: r.TenantID, ReservationID: r.ID, Start: r.Start, End: r.End, Active: active}
	if r.LeaseSeconds != nil {
		p.LeaseSeconds = *r.LeaseSeconds
	}
	if r.LeaseExpiresAt != nil {
		p.LeaseDeadline = *r.LeaseExpiresAt
	}
	if err := workflows.StartReservation(ctx, s.deps.Temporal, s.deps.TaskQueue, p); err != nil {
		return err
	}
	return s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return store.MarkReservationWorkflowStarted(ctx, tx, r.ID)
	})
}

// previewKeys are the keys devices may have (encoding/json matches names
// case-insensitively, so they are checked exactly).
var previewKeys = map[string]map[string]bool{
	"devices":          {"class": true, "count": true, "selector": true, "topology": true},
	"devices.selector": {"gpuModel": true, "gpuProduct": true, "minMemoryGiB": true, "migProfile": true},
	"devices.topology": {"type": true, "nodes": true, "perNode": true},
}

// Package reservations is the reservations domain as the API drives it:
// the rows, the draft an admission decides on, the booking of a placed
// request (with the preemption of spot reservations), the limits a
// tenant books within, and the lifecycle checks of release, cancel, renew
// and extend.
//
// A reservation's state changes only through store.SetReservationState,
// which checks the edge with core/reservations.Transition and publishes
// the change as an event in the same transaction. It stays in store, with
// the bookings' cut and the preemption, because the reservation and node
// workflows' activities make the same writes.
package reservations

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/placement"
	states "github.com/better-compute/better-compute/core/reservations"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/capacity"
	"github.com/better-compute/better-compute/store/pools"
)

// ResourceType is the catalog type a reservation is decided on.
const ResourceType = "reservation"

// Reservation is a reservation as the API answers it.
type Reservation struct {
	ID              string `json:"id"`
	TenantID        string `json:"tenantId"`
	OwnerIdentityID string `json:"ownerIdentityId"`
	PoolID          string `json:"poolId"`
	ProjectID       string `json:"projectId,omitempty"`
	State           string `json:"state"`
	// WorkflowID is the id of the Temporal workflow that drives it (the
	// reservation id: activities/reservations.StartReservation); drafts
	// have none.
	WorkflowID   string            `json:"workflowId,omitempty"`
	Devices      placement.Request `json:"devices"`
	Start        int64             `json:"start" unit:"epoch-ms"`
	End          int64             `json:"end" unit:"epoch-ms"` // exclusive
	Binding      string            `json:"binding"`
	LeaseSeconds *int64            `json:"leaseSeconds,omitempty"`
	// LeaseExpiresAt is when the allocation lease lapses unless renewed
	// (epoch ms), as of the activation or the last renewal.
	LeaseExpiresAt *int64          `json:"leaseExpiresAt,omitempty"`
	Spot           bool            `json:"spot"`
	Failure        json.RawMessage `json:"failure,omitempty"`
	// EndReason says why it ended (core/reservations.EndReasons), once its
	// ending began; EndedAt when it reached a terminal state (epoch ms).
	EndReason string `json:"endReason,omitempty"`
	EndedAt   *int64 `json:"endedAt,omitempty"`
	// Conditions are what is wrong with it now (nodelost.go).
	Conditions  []Condition  `json:"conditions"`
	Allocations []Allocation `json:"allocations"`
	CreatedAt   int64        `json:"createdAt"`
	UpdatedAt   int64        `json:"updatedAt"`
}

// Allocation is one node's share of a reservation. An active
// reservation's allocations also say how its workload reaches them: the
// CDI devices the node's agent exposed (what a container runtime is
// given, e.g. "nvidia.com/gpu=res_x-0") and the node's address.
type Allocation struct {
	ID     string   `json:"id"`
	NodeID string   `json:"nodeId"`
	Atoms  []string `json:"atoms"`
	// CDIDevices are the fully qualified CDI names of the spec the node's
	// cdi.expose command wrote, once it succeeded.
	CDIDevices []string `json:"cdiDevices,omitempty"`
	// NodeAddress is the host name the node reported in its latest
	// inventory (system.hostname).
	NodeAddress string `json:"nodeAddress,omitempty"`
}

// Types are the catalog's full names of the types a reservation's
// authorization row names: its own and its parent pool's.
type Types struct {
	Reservation, Pool string
}

// plannedBinding says whether the schema names binding but no driver
// serves it yet, and which phase will: a reservation with one would go
// active with nothing bound.
func plannedBinding(binding string) (phase string, planned bool) {
	if binding == "node" {
		return "v0.5", true
	}
	return "", false
}

// maxPlaceAttempts bounds the placements of one request that concurrent
// bookings refuse: each refusal means another booking committed.
const maxPlaceAttempts = 16

// gpuClasses are the classes whose count is the draft's gpuCount.
var gpuClasses = map[string]bool{placement.ClassGPU: true, placement.ClassMIG: true, placement.ClassSlot: true}

// columns are what scan reads, from reservations r.
const columns = `r.id, r.tenant_id, r.owner_identity_id, r.pool_id, r.project_id, r.state, r.devices,
	(extract(epoch FROM r.starts_at) * 1000)::bigint, (extract(epoch FROM r.ends_at) * 1000)::bigint,
	r.binding, r.lease_seconds, (extract(epoch FROM r.lease_expires_at) * 1000)::bigint, r.spot, r.failure,
	COALESCE(r.end_reason, ''), (extract(epoch FROM r.ended_at) * 1000)::bigint, r.conditions,
	(extract(epoch FROM r.created_at) * 1000)::bigint, (extract(epoch FROM r.updated_at) * 1000)::bigint`

func scan(row pgx.Row) (Reservation, error) { return scanRow(row) }

// scanRow scans columns and then the extra columns into more.
func scanRow(row pgx.Row, more ...any) (Reservation, error) {
	var r Reservation
	var failure []byte
	err := row.Scan(append([]any{&r.ID, &r.TenantID, &r.OwnerIdentityID, &r.PoolID, &r.ProjectID, &r.State, &r.Devices, &r.Start, &r.End,
		&r.Binding, &r.LeaseSeconds, &r.LeaseExpiresAt, &r.Spot, &failure, &r.EndReason, &r.EndedAt, &r.Conditions, &r.CreatedAt, &r.UpdatedAt},
		more...)...)
	if failure != nil {
		r.Failure = failure
	}
	r.Allocations = []Allocation{}
	if r.State != string(states.Draft) {
		r.WorkflowID = r.ID
	}
	return r, err
}

// Load reads one of the tenant's reservations with its allocations
// (NOT_FOUND for another tenant's); lock locks the row first, so the read
// that follows sees what committed while the lock was awaited.
func Load(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (Reservation, error) {
	if lock {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM reservations WHERE id = $1 AND tenant_id = $2 FOR UPDATE`, id, tenantID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return Reservation{}, notFound(id)
		}
		if err != nil {
			return Reservation{}, err
		}
	}
	return scanLoaded(tx.QueryRow(ctx, loadSQL, loadArgs(tenantID, id)...), id)
}

// QueueLoad queues Load's read (unlocked) in b, for a read that runs in
// one round trip (store.Read); the answer is valid once b has run.
func QueueLoad(b *store.Batch, tenantID, id string) func() (Reservation, error) {
	return store.QueueRow(b, func(row pgx.Row) (Reservation, error) { return scanLoaded(row, id) }, loadSQL, loadArgs(tenantID, id)...)
}

func notFound(id string) error { return core.Errorf(core.CodeNotFound, "reservation %s not found", id) }

// loadSQL reads a reservation and, in the same statement, its allocations
// as JSON, each with how an active reservation's workload reaches it: the
// kind and number of the CDI devices of the allocation's cdi.expose
// command that succeeded (the agent names a spec's devices after the
// command's, in order), and the host name of the node's latest inventory.
// Reading them in the statement that reads the row lets a read decision on
// the reservation cover them, in one statement. $3 is the bind key of the
// reservation with an empty allocation id, to which the allocation's id is
// appended.
const loadSQL = `SELECT ` + columns + `, COALESCE((
		SELECT json_agg(json_build_object('id', a.id, 'nodeId', a.node_id, 'atoms', a.atoms,
			'cdiKind', x.kind, 'cdiDevices', x.devices, 'nodeAddress', h.hostname) ORDER BY a.node_id, a.id)
		FROM allocations a
		LEFT JOIN LATERAL (
			SELECT COALESCE(c.args->>'kind', '') AS kind, jsonb_array_length(c.args->'devices') AS devices
			FROM node_commands c
			WHERE r.state = 'active' AND c.node_id = a.node_id AND c.idempotency_key = $3 || a.id
				AND c.kind = 'cdi.expose' AND c.state = 'succeeded' AND jsonb_typeof(c.args->'devices') = 'array'
		) x ON true
		LEFT JOIN LATERAL (
			SELECT COALESCE(i.document->'system'->>'hostname', '') AS hostname
			FROM node_inventories i
			WHERE r.state = 'active' AND i.node_id = a.node_id ORDER BY i.seq DESC LIMIT 1
		) h ON true
		WHERE a.reservation_id = r.id), '[]')
	FROM reservations r WHERE r.id = $1 AND r.tenant_id = $2`

func loadArgs(tenantID, id string) []any { return []any{id, tenantID, store.BindKey(id, "")} }

// loadedAllocation is one allocation as loadSQL answers it.
type loadedAllocation struct {
	ID          string   `json:"id"`
	NodeID      string   `json:"nodeId"`
	Atoms       []string `json:"atoms"`
	CDIKind     string   `json:"cdiKind"`
	CDIDevices  int      `json:"cdiDevices"`
	NodeAddress string   `json:"nodeAddress"`
}

func scanLoaded(row pgx.Row, id string) (Reservation, error) {
	var allocations []byte
	r, err := scanRow(row, &allocations)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, notFound(id)
	}
	if err != nil {
		return r, err
	}
	var loaded []loadedAllocation
	if err := json.Unmarshal(allocations, &loaded); err != nil {
		return r, fmt.Errorf("reservation %s: allocations: %w", id, err)
	}
	for _, l := range loaded {
		a := Allocation{ID: l.ID, NodeID: l.NodeID, Atoms: l.Atoms, NodeAddress: l.NodeAddress}
		for d := range l.CDIDevices {
			a.CDIDevices = append(a.CDIDevices, protocol.CDIDevice(l.CDIKind, r.ID, d))
		}
		r.Allocations = append(r.Allocations, a)
	}
	return r, nil
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
	var a Allocation
	_, err = pgx.ForEachRow(rows, []any{&rid, &a.ID, &a.NodeID, &a.Atoms}, func() error {
		r := &list[at[rid]]
		r.Allocations = append(r.Allocations, Allocation{ID: a.ID, NodeID: a.NodeID, Atoms: slices.Clone(a.Atoms)})
		return nil
	})
	return err
}

// Filter narrows a list: the owner's only (scope mine), one state, pool or
// project; "" keeps every value.
type Filter struct {
	Owner, State, PoolID, ProjectID string
}

// List reads the tenant's decided reservations (drafts are not listed) of
// which the projection holds a row (typ is the reservation type's full
// name), newest first (creation millisecond, then id, both descending):
// the page's rows before its key, plus one.
func List(ctx context.Context, tx store.Tx, typ, tenantID string, f Filter, page store.PageQuery) ([]Reservation, error) {
	// The key is createdAt exactly as columns answers it (rounded to the
	// millisecond, not cut), so a cursor compares equal to its own row.
	const createdMs = "(extract(epoch FROM r.created_at) * 1000)::bigint"
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+columns+` FROM reservations r
		WHERE r.tenant_id = $1 AND r.state <> 'draft'
			AND ($2 = '' OR r.owner_identity_id = $2) AND ($3 = '' OR r.state = $3)
			AND ($4 = '' OR r.pool_id = $4) AND ($5 = '' OR r.project_id = $5)
			AND `+store.VisibleIn("r.id", "$1", "$6", false)+`
			AND ($8 OR (`+createdMs+`, r.id) < ($9, $10))
		ORDER BY `+createdMs+` DESC, r.id DESC LIMIT $7`,
		tenantID, f.Owner, f.State, f.PoolID, f.ProjectID, typ, page.Fetch(), page.First(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Reservation, error) { return scan(row) })
	if err != nil {
		return nil, err
	}
	return items, withAllocations(ctx, tx, items)
}

// authzRow is a reservation's authorization row: parent its pool, owner
// its creator, and the attributes policies decide on, durationHours
// rounded up from durationSeconds.
func authzRow(types Types, tenantID, id, ownerID string, pool pools.Pool, req placement.Request,
	durationSeconds int64, binding, projectID string, spot bool) store.AuthzResource {
	attrs := map[string]any{"region": pool.Region, "gpuModel": pool.GPUModel,
		"durationHours": (durationSeconds + 3599) / 3600, "binding": binding, "spot": spot}
	if gpuClasses[req.Class] {
		attrs["gpuCount"] = req.Count
	}
	if projectID != "" {
		attrs["projectId"] = projectID
	}
	return store.AuthzResource{Type: types.Reservation, ID: id, TenantID: tenantID,
		OwnerID: ownerID, ParentType: types.Pool, ParentID: pool.ID, Attributes: attrs}
}

// Request is what reservations.create asks for. Start nil is now;
// Duration is in seconds. MaxAhead bounds how far ahead Start may be (0:
// DefaultMaxAhead), a server-wide setting rather than the caller's.
type Request struct {
	PoolID       string
	Devices      placement.Request
	Start        *int64
	Duration     int64
	Binding      string
	LeaseSeconds *int64
	ProjectID    string
	Spot         bool
	MaxAhead     time.Duration
}

// A booking window's start is checked against the database's clock (the
// one every booking, cut and bind is made on): it may lie at most
// StartTolerance in the past (a client's clock a little behind) and at
// most the server's MaxAhead (by default DefaultMaxAhead) in the future.
const (
	StartTolerance  = 60 * time.Second
	DefaultMaxAhead = 365 * 24 * time.Hour
)

// secondsHint explains a start sent in epoch seconds: below 10^11 (a date
// in 1973 in milliseconds, but a plausible epoch-seconds value) and, read
// as seconds, inside the window.
func secondsHint(start, earliest, latest int64) string {
	if start <= 0 || start >= 1e11 {
		return ""
	}
	if ms := start * 1000; ms >= earliest && ms <= latest {
		return fmt.Sprintf("start is epoch milliseconds; did you mean %d?", ms)
	}
	return "start is epoch milliseconds, not seconds"
}

// checkStart refuses a start before now - StartTolerance or after now +
// maxAhead (INVALID_INPUT naming start), now being the transaction's.
func checkStart(ctx context.Context, tx store.Tx, start *int64, maxAhead time.Duration) error {
	if start == nil {
		return nil
	}
	if maxAhead <= 0 {
		maxAhead = DefaultMaxAhead
	}
	now, err := dbNow(ctx, tx)
	if err != nil {
		return err
	}
	earliest, latest := now.Add(-StartTolerance).UnixMilli(), now.Add(maxAhead).UnixMilli()
	switch {
	case *start < earliest:
		details := map[string]any{"field": "start", "reason": "past", "minimum": earliest}
		if hint := secondsHint(*start, earliest, latest); hint != "" {
			details["hint"] = hint
		}
		return core.Errorf(core.CodeInvalidInput, "start %d is in the past (now is %d; %s of clock skew is tolerated)",
			*start, now.UnixMilli(), StartTolerance).WithDetails(details)
	case *start > latest:
		return core.Errorf(core.CodeInvalidInput, "start %d is more than %s ahead (now is %d)", *start, maxAhead, now.UnixMilli()).
			WithDetails(map[string]any{"field": "start", "reason": "tooFarAhead", "maximum": latest})
	}
	return nil
}

// Draft writes the draft reservation draftID (state draft) and its
// authorization row, which the decision is made on: the pool must resolve
// in the tenant's view (own or offered; NOT_FOUND otherwise) and be live,
// the project be the tenant's live one, and the start within the window
// checkStart allows. Binding defaults to hold; instance is for vps-host
// pools and one node (checkInstanceBinding); node is not served yet
// (UNSUPPORTED).
func Draft(ctx context.Context, tx store.Tx, types Types, tenantID, draftID, ownerID string, in Request) (store.AuthzResource, error) {
	req, verr := placement.Normalize(in.Devices, "devices.")
	if verr != nil {
		return store.AuthzResource{}, verr
	}
	if in.Binding == "" {
		in.Binding = "hold"
	}
	if phase, planned := plannedBinding(in.Binding); planned {
		return store.AuthzResource{}, core.Errorf(core.CodeUnsupported, "binding %s is planned for %s", in.Binding, phase).
			WithDetails(map[string]any{"field": "binding", "reason": "planned", "phase": phase})
	}
	if err := checkStart(ctx, tx, in.Start, in.MaxAhead); err != nil {
		return store.AuthzResource{}, err
	}
	pool, err := pools.View(ctx, tx, tenantID, in.PoolID)
	if err != nil {
		return store.AuthzResource{}, err
	}
	if pool.ArchivedAt != nil {
		return store.AuthzResource{}, core.Errorf(core.CodeInvalidState, "pool %s is archived", pool.ID).
			WithDetails(map[string]any{"reason": "archived"})
	}
	if in.Binding == BindingInstance {
		if req, err = checkInstanceBinding(pool, req); err != nil {
			return store.AuthzResource{}, err
		}
	}
	if in.ProjectID != "" {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM projects WHERE id = $1 AND tenant_id = $2 AND archived_at IS NULL`, in.ProjectID, tenantID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.AuthzResource{}, core.Errorf(core.CodeNotFound, "project %s not found", in.ProjectID)
		} else if err != nil {
			return store.AuthzResource{}, err
		}
	}
	start, err := capacity.Start(ctx, tx, in.Start)
	if err != nil {
		return store.AuthzResource{}, err
	}
	end := start + in.Duration*1000
	devices, err := json.Marshal(req)
	if err != nil {
		return store.AuthzResource{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO reservations (id, tenant_id, owner_identity_id, pool_id, project_id, state, devices,
			starts_at, ends_at, binding, lease_seconds, spot)
		VALUES ($1, $2, $3, $4, $5, $6, $7, timestamptz 'epoch' + $8::bigint * interval '1 millisecond',
			timestamptz 'epoch' + $9::bigint * interval '1 millisecond', $10, $11, $12)`,
		draftID, tenantID, ownerID, pool.ID, in.ProjectID, string(states.Draft), devices,
		start, end, in.Binding, in.LeaseSeconds, in.Spot); err != nil {
		return store.AuthzResource{}, err
	}
	row := authzRow(types, tenantID, draftID, ownerID, pool, req, in.Duration, in.Binding, in.ProjectID, in.Spot)
	return row, store.PutAuthzResource(ctx, tx, row)
}

// Deny records a denial on the draft: draft -> denied.
func Deny(ctx context.Context, tx store.Tx, tenantID, id string) error {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return err
	}
	if r.State != string(states.Draft) {
		return nil
	}
	return store.SetReservationState(ctx, tx, r.TenantID, r.ID, states.Draft, states.Denied, nil)
}

// Place books the admitted draft: draft -> pending; the pool's free atoms
// over [start, end) are read as capacity.preview reads them and
// core/placement places the request (ties broken by the reservation's
// seed, so concurrent requests choose different atoms); one allocation
// per node and one device_bookings row per atom are inserted under a
// SAVEPOINT, each atom under its booking lock (atomlocks.go). An atom
// another transaction is booking is left aside; a concurrent booking that
// won (23P01, or a deadlock 40P01) rolls back to the savepoint, and the
// request is placed again without the plan's atoms, and on the atoms read
// again when nothing else fits (after maxPlaceAttempts, UNAVAILABLE:
// retry with the same key). Then the tenant's limits are checked
// (checkLimits) under a per-(tenant, pool) lock held to the commit. On
// success pending -> placed. A request that only fits on atoms held by
// spot reservations (and is not spot itself) preempts them.
//
// When nothing fits the answer is INVALID_STATE with details.reason
// "noCapacity" and the placement reasons in details.reasons (the spec's
// codes have no capacity code: QUOTA_EXCEEDED is the tenant's quota,
// UNAVAILABLE a transient failure). A replay of a refused reservation
// answers the refusal it recorded (Fail).
//
// Place refuses a request the tenant's committed bookings already leave no
// room for (each time it reads the free atoms), but takes no limits lock:
// CheckLimits must run after it, last in its transaction, so that the lock
// it holds to the commit is held for as little as possible.
func Place(ctx context.Context, tx store.Tx, tenantID, id string) (Reservation, error) {
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return Reservation{}, err
	}
	if r.State == string(states.Failed) && r.Failure != nil {
		return Reservation{}, FailureError(r)
	}
	if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, states.State(r.State), states.Pending, nil); err != nil {
		return Reservation{}, err
	}
	pool, err := pools.View(ctx, tx, tenantID, r.PoolID)
	if err != nil {
		return Reservation{}, err
	}
	if err := placeAndBook(ctx, tx, pool, r); err != nil {
		return Reservation{}, err
	}
	if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, states.Pending, states.Placed, nil); err != nil {
		return Reservation{}, err
	}
	return Load(ctx, tx, tenantID, r.ID, false)
}

// placeAndBook places r's request over [r.Start, r.End) on the pool's free
// atoms and books the plan (preempting spot reservations when r is not
// spot), leaving aside the atoms other transactions are booking and
// re-placing when a concurrent booking wins; see Place.
func placeAndBook(ctx context.Context, tx store.Tx, pool pools.Pool, r Reservation) error {
	req := r.Devices
	seed := placement.Seed(r.ID)
	var (
		nodes, spotNodes []placement.Node
		read, spotRead   bool             // nodes (spotNodes) are of this attempt's snapshot
		busy             map[atomKey]bool // atoms others are booking
		aside            map[atomKey]bool // busy ones, and those lost to a commit since the read
		lost             bool             // aside holds atoms lost to a commit
		probed           bool             // busy holds pg_locks' view, not only failed tries
	)
	setAside := func(keys ...atomKey) {
		if aside == nil {
			aside = map[atomKey]bool{}
		}
		for _, k := range keys {
			aside[k] = true
		}
	}
	// choose places on the free atoms but those set aside (and, when that
	// fails and r is not spot, on those held only by spot reservations
	// too); reasons are the plain placement's, as a refusal reports them.
	round := 0
	choose := func() (placement.Plan, []spotVictim, []placement.Reason, error) {
		free := without(nodes, aside)
		if len(aside) > 0 {
			// A try collided: the concurrent requests that would all walk
			// the same best-fit order try different halves first.
			if plan, reasons := placement.PlaceSpread(req, contendedHalf(free, seed, round), seed); len(reasons) == 0 {
				return plan, nil, nil, nil
			}
		}
		plan, reasons := placement.PlaceSpread(req, free, seed)
		if len(reasons) == 0 || r.Spot {
			return plan, nil, reasons, nil
		}
		if !spotRead {
			var err error
			// Atoms held only by spot reservations are this request's
			// for the taking.
			if spotNodes, err = capacity.FreeNodes(ctx, tx, pool.ID, req.Class, r.Start, r.End, true); err != nil {
				return placement.Plan{}, nil, nil, err
			}
			spotRead = true
		}
		p, rs := placement.PlaceSpread(req, without(spotNodes, aside), seed)
		if len(rs) > 0 {
			return plan, nil, reasons, nil
		}
		victims, err := spotVictims(ctx, tx, p, r.Start, r.End)
		return p, victims, nil, err
	}
	// fitsAll: whether the request fits the atoms read, busy ones
	// included; when it does not, no booking in flight can make it.
	fitsAll := func() bool {
		if _, rs := placement.PlaceSpread(req, nodes, seed); len(rs) == 0 {
			return true
		}
		if r.Spot || !spotRead {
			return false
		}
		_, rs := placement.PlaceSpread(req, spotNodes, seed)
		return len(rs) == 0
	}
	for attempt := 0; attempt < maxPlaceAttempts; attempt++ {
		round = attempt
		if !read {
			var err error
			// A request over the tenant's limits by what others have
			// committed is refused before it races them for atoms: the
			// losers of a burst over the quota leave the race as soon as
			// the winners commit, rather than exhaust their attempts.
			if err := limitsHold(ctx, tx, r.TenantID, pool, r, r.Start, r.End, pool.Policy.MaxPending, false); err != nil {
				return err
			}
			if nodes, err = capacity.FreeNodes(ctx, tx, pool.ID, req.Class, r.Start, r.End, false); err != nil {
				return err
			}
			read, spotRead, busy, aside, lost, probed = true, false, nil, nil, false, false
		}
		plan, victims, reasons, err := choose()
		if err != nil {
			return err
		}
		if len(reasons) > 0 && lost {
			read = false // what was lost may not be all: read again
			continue
		}
		if len(reasons) > 0 {
			if len(busy) == 0 || !fitsAll() {
				// Nothing free fits, and no booking in flight could
				// change that: refuse at once.
				return core.Errorf(core.CodeInvalidState, "the request does not fit in pool %s over the window", pool.ID).
					WithDetails(map[string]any{"reason": "noCapacity", "reasons": reasons, "reservationId": r.ID})
			}
			// It fits only with atoms others are booking: wait for
			// those bookings to end, then read again (once, rather
			// than once per booking that commits).
			if err := awaitBookings(ctx, tx, slices.Collect(maps.Keys(busy))); err != nil && !errors.Is(err, errLostRace) {
				return err
			}
			read = false
			continue
		}
		taken, err := tryBook(ctx, tx, r, plan, victims)
		switch {
		case errors.Is(err, errLostRace):
			// A booking committed since the read holds some of the
			// plan's atoms: place again without them (which of them is
			// not said), reading again only when nothing else fits.
			for _, a := range plan.Allocations {
				for _, atom := range a.Atoms {
					setAside(atomKey{a.NodeID, atom})
				}
			}
			lost = true
			continue
		case err != nil:
			return err
		case len(taken) == 0:
			return nil
		}
		if busy == nil {
			busy = map[atomKey]bool{}
		}
		for _, k := range taken {
			busy[k] = true
		}
		setAside(taken...)
		if !probed {
			more, err := beingBooked(ctx, tx, nodes, spotNodes)
			if err != nil {
				return err
			}
			for k := range more {
				busy[k] = true
				setAside(k)
			}
			probed = true
		}
	}
	return core.Errorf(core.CodeUnavailable, "concurrent bookings kept taking the atoms; retry with the same idempotencyKey").
		WithDetails(map[string]any{"reason": "contention", "reservationId": r.ID})
}

// tryBook preempts the victims and books the plan inside a savepoint. It
// answers the plan's atoms another transaction is booking (their locks
// taken; nothing is booked then), or errLostRace when a concurrent booking
// won; either way the savepoint is rolled back.
func tryBook(ctx context.Context, tx store.Tx, r Reservation, plan placement.Plan, victims []spotVictim) ([]atomKey, error) {
	sp, err := tx.Begin(ctx) // a SAVEPOINT
	if err != nil {
		return nil, err
	}
	err = preempt(ctx, sp, victims, r)
	var taken []atomKey
	if err == nil {
		taken, err = book(ctx, sp, r, plan)
	}
	if err != nil || len(taken) > 0 {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return nil, rerr
		}
		if st := pgState(err); st == "23P01" || st == "40P01" {
			return nil, errLostRace
		}
		return taken, err
	}
	return nil, sp.Commit(ctx)
}

// FailureError is the error a failed reservation was refused with.
func FailureError(r Reservation) error {
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

// Fail records a final refusal of Place (no capacity, over quota): draft
// or pending -> failed, with the error a replay of the key answers. It
// runs in a transaction of its own, since Place's rolled back with the
// error. Any other cause is not final (a retry may still place it) and
// changes nothing.
func Fail(ctx context.Context, tx store.Tx, tenantID, id string, cause error) error {
	ce := core.AsError(cause)
	if ce.Code != core.CodeQuotaExceeded && !(ce.Code == core.CodeInvalidState && ce.Details["reason"] == "noCapacity") {
		return nil
	}
	failure, err := json.Marshal(map[string]any{"code": ce.Code, "message": ce.Message, "details": ce.Details})
	if err != nil {
		return err
	}
	r, err := Load(ctx, tx, tenantID, id, true)
	if err != nil {
		return err
	}
	from := states.State(r.State)
	if from == states.Draft {
		if err := store.SetReservationState(ctx, tx, r.TenantID, r.ID, from, states.Pending, nil); err != nil {
			return err
		}
		from = states.Pending
	}
	if from != states.Pending {
		return nil // placed by a retry meanwhile, or already failed
	}
	return store.SetReservationState(ctx, tx, r.TenantID, r.ID, from, states.Failed, failure)
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

// dbNow is the transaction's now(), the clock every booking is made on and
// checked against (the bind step exposes only what a booking covers at
// now()); as epoch ms it is truncated, so a booking from it has begun.
func dbNow(ctx context.Context, tx store.Tx) (time.Time, error) {
	var now time.Time
	err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now)
	return now, err
}

// preempt ends the spot victims of reservation r, their atoms freed from
// r's start (or now, if that is later: what has run stays booked), now
// being the transaction's, the clock every booking is made on.
func preempt(ctx context.Context, tx store.Tx, victims []spotVictim, r Reservation) error {
	if len(victims) == 0 {
		return nil
	}
	at := time.UnixMilli(r.Start)
	now, err := dbNow(ctx, tx)
	if err != nil {
		return err
	}
	if now.Before(at) {
		at = now
	}
	for _, v := range victims {
		if err := store.PreemptReservation(ctx, tx, v.tenantID, v.id, r.ID, at); err != nil {
			return err
		}
	}
	return nil
}

// book inserts the plan's allocations and their bookings, each atom's
// under its booking lock (atomlocks.go) when the plan is small enough. It
// answers the atoms whose lock another transaction holds: then some of
// the plan is not booked, and the caller rolls back. Allocations come
// sorted by node and atoms by id, so concurrent bookers take the atoms'
// locks in one order.
func book(ctx context.Context, tx store.Tx, r Reservation, plan placement.Plan) ([]atomKey, error) {
	lock := 0
	for _, a := range plan.Allocations {
		lock += len(a.Atoms)
	}
	locked := lock <= maxLockedAtoms
	var taken []atomKey
	for _, a := range plan.Allocations {
		id := core.NewID("alloc")
		if _, err := tx.Exec(ctx, `INSERT INTO allocations (id, tenant_id, reservation_id, node_id, atoms) VALUES ($1, $2, $3, $4, $5)`,
			id, r.TenantID, r.ID, a.NodeID, a.Atoms); err != nil {
			return nil, err
		}
		keys := make([]int64, len(a.Atoms))
		for i, atom := range a.Atoms {
			keys[i] = atomKey{a.NodeID, atom}.lockKey()
		}
		rows, err := tx.Query(ctx, `INSERT INTO device_bookings (device_node_id, device_id, allocation_id, tenant_id, pool_id, during, kind)
			SELECT $1, atom, $3, $4, $5, tstzrange(timestamptz 'epoch' + $6::bigint * interval '1 millisecond',
				timestamptz 'epoch' + $7::bigint * interval '1 millisecond'), $8
			FROM unnest($2::text[], $9::bigint[]) WITH ORDINALITY AS u(atom, lock_key, n)
			WHERE NOT $10::bool OR pg_try_advisory_xact_lock(lock_key)
			ORDER BY n
			RETURNING device_id`,
			a.NodeID, a.Atoms, id, r.TenantID, r.PoolID, r.Start, r.End, r.Binding, keys, locked)
		if err != nil {
			return nil, err
		}
		booked, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		if len(booked) == len(a.Atoms) {
			continue
		}
		for _, atom := range a.Atoms {
			if !slices.Contains(booked, atom) {
				taken = append(taken, atomKey{a.NodeID, atom})
			}
		}
		return taken, nil
	}
	return nil, nil
}

func pgState(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

// CheckLimits checks a placed reservation against the tenant's limits on
// its pool (checkLimits, with its bookings counted): the last statements
// of the transaction that placed it, since its lock is held to the commit.
func CheckLimits(ctx context.Context, tx store.Tx, tenantID, id string) error {
	r, err := Load(ctx, tx, tenantID, id, false)
	if err != nil {
		return err
	}
	pool, err := pools.View(ctx, tx, tenantID, r.PoolID)
	if err != nil {
		return err
	}
	return checkLimits(ctx, tx, tenantID, pool, r, r.Start, r.End, true, true)
}

// checkLimits checks r's atoms over [from, to) (a new reservation's
// window, or an extension's added time), booked in this transaction
// (booked) or not, against the tenant's limits on the pool, under one lock per
// (tenant, pool) held to the commit, so two requests cannot share the same
// headroom (QUOTA_EXCEEDED with the limit either way). The count runs
// after the lock is granted: in READ COMMITTED its snapshot then shows the
// commit of the transaction that held the lock before, and this
// transaction's own bookings. Booking first keeps the lock from covering
// placement: one tenant's requests wait for each other only from their
// counts to their commits (a create counts last in its transaction:
// CheckLimits), and place concurrently (see Place).
//
//   - on a pool offered to the tenant, the atoms of r's class the tenant
//     has booked in the pool over [from, to), r's included, stay within the
//     offer's quota;
//   - with newReservation starting in the future and the pool's
//     policy.maxPending, the tenant's other reservations in the pool that
//     have not begun yet stay below it, so no tenant hoards the pool's
//     future (a reservation starting now is never held back by it).
func checkLimits(ctx context.Context, tx store.Tx, tenantID string, pool pools.Pool, r Reservation, from, to int64, newReservation, booked bool) error {
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
	return limitsHold(ctx, tx, tenantID, pool, r, from, to, maxPending, booked)
}

// limitsHold is checkLimits' count, without its lock: under the lock it is
// the decision; without it (placement's precheck) it sees only what other
// transactions committed, so a refusal is final but a pass proves nothing.
func limitsHold(ctx context.Context, tx store.Tx, tenantID string, pool pools.Pool, r Reservation, from, to int64, maxPending *int, booked bool) error {
	offered := pool.TenantID != tenantID && pool.Offer != nil
	if offered {
		req := r.Devices
		limit := pool.Offer.Quota[req.Class]
		inUse, err := capacity.BookedInPool(ctx, tx, tenantID, pool.ID, req.Class, from, to)
		if err != nil {
			return err
		}
		if booked {
			// r's atoms are booked over [from, to) and no other
			// booking of them overlaps it (the exclusion constraint):
			// the rest is what the tenant had.
			inUse -= int64(req.Count)
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

// sweepBatch bounds the drafts one sweep deletes.
const sweepBatch = 1000

// SweepDrafts deletes up to sweepBatch drafts created longer than maxAge
// ago, with their idempotency rows and authorization rows, and answers how
// many. A draft outlives its admission only when the process crashed
// between the admission's two transactions and the caller never retried;
// a draft counts against nothing meanwhile (lists, limits and capacity
// skip drafts: they hold no bookings). A draft a retry holds locked right
// now is skipped.
func SweepDrafts(ctx context.Context, tx store.Tx, maxAge time.Duration) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `WITH stale AS (
			SELECT r.id, r.tenant_id FROM reservations r
			WHERE r.state = 'draft' AND r.created_at < now() - $1 * interval '1 millisecond'
				AND NOT EXISTS (SELECT 1 FROM allocations a WHERE a.reservation_id = r.id)
			ORDER BY r.created_at LIMIT $2 FOR UPDATE SKIP LOCKED),
		keys AS (DELETE FROM idempotency_keys k USING stale
			WHERE k.tenant_id = stale.tenant_id AND k.resource_id = stale.id AND k.completed_at IS NULL RETURNING 1),
		authz AS (DELETE FROM authz_resources z USING stale
			WHERE z.id = stale.id AND z.tenant_id = stale.tenant_id RETURNING 1),
		drafts AS (DELETE FROM reservations r USING stale WHERE r.id = stale.id RETURNING 1)
		SELECT count(*) FROM drafts`, maxAge.Milliseconds(), sweepBatch).Scan(&n)
	return n, err
}

// Package nodes is the nodes domain: a node's rows (nodes and its
// satellites: inventories, devices, events, identities, join tokens and
// join requests), its rules that need the database, and every write of
// them. Nothing else writes the nodes table.
package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
)

// ResourceType is the catalog type a node is decided on; PoolType its
// parent's, SiteType a site node's parent's.
const (
	ResourceType = "node"
	PoolType     = "pool"
	SiteType     = "site"
)

// Types are the catalog's full names of a node, of its pool and of a site
// node's site, as the authorization rows hold them.
type Types struct {
	Node, Pool, Site string
}

// TypesOf names the node, pool and site types in c.
func TypesOf(c *core.Catalog) Types {
	return Types{Node: c.FullName(ResourceType), Pool: c.FullName(PoolType), Site: c.FullName(SiteType)}
}

// Node is a node as the API returns it: every state axis on its own, the
// computed schedulability with the clauses that fail, and its device and
// atom counts (live devices; atoms are the bookable ones).
type Node struct {
	ID       string `json:"id"`
	TenantID string `json:"tenantId"` // the pool's owner (a site node's: the site's)
	// PoolID is "" for a site agent's node (role site), which serves its
	// whole site; SiteID is the pool's site, or the site node's own.
	PoolID         string `json:"poolId"`
	SiteID         string `json:"siteId"`
	Region         string `json:"region"`
	Name           string `json:"name"`
	ProvisionState string `json:"provisionState"`
	Maintenance    bool   `json:"maintenance"`
	Cordoned       bool   `json:"cordoned"`
	// DrainState is "" (not draining), "draining" or "drained"; DrainMode
	// "wait" or "release" while a drain is on.
	DrainState         string            `json:"drainState,omitempty"`
	DrainMode          string            `json:"drainMode,omitempty"`
	Power              string            `json:"power"`
	Connectivity       string            `json:"connectivity"`
	Conditions         []Condition       `json:"conditions"`
	Role               string            `json:"role"`
	Trust              string            `json:"trust"`
	Adapter            string            `json:"adapter"`
	DriverBindings     map[string]string `json:"driverBindings"`
	OwnerTenantID      string            `json:"ownerTenantId,omitempty"`
	DedicatedTo        string            `json:"dedicatedTo,omitempty"`
	Generation         int64             `json:"generation"`
	ObservedGeneration int64             `json:"observedGeneration"`
	Labels             map[string]string `json:"labels"`
	Taints             []Taint           `json:"taints"`
	NoScheduleReasons  []string          `json:"noScheduleReasons"`
	HardwareKey        string            `json:"hardwareKey"`
	HardwareKeyTrusted bool              `json:"hardwareKeyTrusted"`
	GPUModel           string            `json:"gpuModel"`
	GPUCount           int               `json:"gpuCount"`
	// Schedulable is core/nodes.Schedulable; UnschedulableReasons names
	// each failing clause (empty when schedulable).
	Schedulable          bool     `json:"schedulable"`
	UnschedulableReasons []string `json:"unschedulableReasons"`
	Devices              int      `json:"devices"`
	Atoms                int      `json:"atoms"`
	CreatedAt            int64    `json:"createdAt"`
	UpdatedAt            int64    `json:"updatedAt"`
	DeletedAt            *int64   `json:"deletedAt,omitempty"`
}

// Condition is a typed node condition. Since is when it last changed
// status (epoch ms); Device names the device it is about, if any.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"` // "True" while raised
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Since   int64  `json:"since"`
	Device  string `json:"device,omitempty"`
}

// Taint repels work from a node, Kubernetes style; one per key and effect.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

// Event is one entry of a node's history.
type Event struct {
	ID      string         `json:"id"`
	NodeID  string         `json:"nodeId"`
	At      int64          `json:"at"`
	Type    string         `json:"type"`
	Message string         `json:"message"`
	Details map[string]any `json:"details"`
	// atMicros is At to the microsecond: one ingest writes several events
	// within a millisecond, and the history keeps their order.
	atMicros int64
}

// Key is the event's place in its node's history, for paging.
func (e Event) Key() store.Key { return store.Key{At: e.atMicros, ID: e.ID} }

// Node event types.
const (
	EventCreated         = "Created"
	EventCordoned        = "Cordoned"
	EventUncordoned      = "Uncordoned"
	EventLabelsChanged   = "LabelsChanged"
	EventTaintsChanged   = "TaintsChanged"
	EventDeleted         = "Deleted"
	EventInventory       = "InventoryChanged"
	EventHardwareKey     = "HardwareKeyChanged"
	EventDevicesChanged  = "DevicesChanged"
	EventConditionRaised = "ConditionRaised"
	EventConditionClear  = "ConditionCleared"
	EventDraining        = "Draining"
	EventDrained         = "Drained"
	EventAdopted         = "Adopted"
	EventJoined          = "Joined"
	EventIdentityIssued  = "IdentityIssued"
	EventIdentityRevoked = "IdentityRevoked"
	// EventConnectivity records a change of the connectivity axis
	// (details: from, to, epoch when a session made it).
	EventConnectivity = "ConnectivityChanged"
)

// A node's bounds.
const (
	MaxLabels = nodestate.MaxLabels
	MaxTaints = nodestate.MaxTaints
)

// nodeSelect reads nodes n with their site s: their pool's, or for a site
// agent's node (role site, no pool) its own.
const nodeSelect = `SELECT n.id, n.tenant_id, COALESCE(n.pool_id, ''), s.id, s.region, n.name, n.provision_state, n.maintenance, n.cordoned,
	n.power, n.connectivity, n.conditions, n.role, n.trust, n.adapter, n.driver_bindings, n.owner_tenant_id, n.dedicated_to,
	n.generation, n.observed_generation, n.labels, n.taints, n.no_schedule_reasons, n.hardware_key, n.hardware_key_trusted,
	n.gpu_model, n.gpu_count, n.created_at, n.updated_at, n.deleted_at, n.drain_state, n.drain_mode,
	(SELECT count(*) FROM devices d WHERE d.node_id = n.id AND d.removed_at IS NULL),
	(SELECT count(*) FROM devices d WHERE d.node_id = n.id AND d.removed_at IS NULL AND d.bookable)
	FROM nodes n LEFT JOIN pools p ON p.id = n.pool_id JOIN sites s ON s.id = COALESCE(p.site_id, n.site_id)`

func scanNode(row pgx.Row) (Node, error) {
	var n Node
	var conditions, bindings, labels, taints []byte
	var created, updated time.Time
	var deleted *time.Time
	var devices, atoms int64
	err := row.Scan(&n.ID, &n.TenantID, &n.PoolID, &n.SiteID, &n.Region, &n.Name, &n.ProvisionState, &n.Maintenance, &n.Cordoned,
		&n.Power, &n.Connectivity, &conditions, &n.Role, &n.Trust, &n.Adapter, &bindings, &n.OwnerTenantID, &n.DedicatedTo,
		&n.Generation, &n.ObservedGeneration, &labels, &taints, &n.NoScheduleReasons, &n.HardwareKey, &n.HardwareKeyTrusted,
		&n.GPUModel, &n.GPUCount, &created, &updated, &deleted, &n.DrainState, &n.DrainMode, &devices, &atoms)
	if err != nil {
		return Node{}, err
	}
	for _, f := range []struct {
		raw []byte
		v   any
	}{{conditions, &n.Conditions}, {bindings, &n.DriverBindings}, {labels, &n.Labels}, {taints, &n.Taints}} {
		if err := json.Unmarshal(f.raw, f.v); err != nil {
			return Node{}, fmt.Errorf("node %s: %w", n.ID, err)
		}
	}
	if n.NoScheduleReasons == nil {
		n.NoScheduleReasons = []string{}
	}
	n.CreatedAt, n.UpdatedAt, n.DeletedAt = created.UnixMilli(), updated.UnixMilli(), msPtr(deleted)
	n.Devices, n.Atoms = int(devices), int(atoms)
	n.Schedulable, n.UnschedulableReasons = nodestate.Schedulable(n.view(), n.TenantID)
	return n, nil
}

// view is what the schedulability predicate reads. The node's tenant is
// its pool's owner, so the pool owner passed to Schedulable is TenantID.
func (n Node) view() nodestate.NodeView {
	return nodestate.NodeView{ProvisionState: nodestate.ProvisionState(n.ProvisionState), Role: nodestate.Role(n.Role),
		Maintenance: n.Maintenance, Cordoned: n.Cordoned, Connectivity: nodestate.Connectivity(n.Connectivity),
		NoScheduleReasons: n.NoScheduleReasons, ObservedGeneration: n.ObservedGeneration,
		Trust: nodestate.Trust(n.Trust), OwnerTenant: n.OwnerTenantID}
}

func msPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	ms := t.UnixMilli()
	return &ms
}

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

func collectStrings(rows pgx.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// NotFound is the error of a node the caller may not see or that is gone.
func NotFound(id string) error { return core.Errorf(core.CodeNotFound, "node %s not found", id) }

// PutAuthz writes the node's projection row (parent: its pool, or a site
// node's site) in the transaction that changed the node.
func PutAuthz(ctx context.Context, tx store.Tx, t Types, n Node) error {
	parentType, parentID := t.Pool, n.PoolID
	if n.PoolID == "" {
		parentType, parentID = t.Site, n.SiteID
	}
	return store.PutAuthzResource(ctx, tx, store.AuthzResource{
		Type: t.Node, ID: n.ID, TenantID: n.TenantID,
		ParentType: parentType, ParentID: parentID,
		Attributes: map[string]any{"region": n.Region, "gpuModel": n.GPUModel, "gpuCount": n.GPUCount,
			"lifecycle": n.ProvisionState, "trust": n.Trust, "dedicatedTo": n.DedicatedTo},
	})
}

// Get reads a live node of the tenant; lock takes it for a change.
// Another tenant's node, a deleted one or none is NOT_FOUND.
func Get(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (Node, error) {
	q := getSQL
	if lock {
		q += ` FOR UPDATE OF n`
	}
	return scanGot(tx.QueryRow(ctx, q, tenantID, id), id)
}

// QueueGet queues Get's read (unlocked) in b (store.Read); the answer is
// valid once b has run.
func QueueGet(b *store.Batch, tenantID, id string) func() (Node, error) {
	return store.QueueRow(b, func(row pgx.Row) (Node, error) { return scanGot(row, id) }, getSQL, tenantID, id)
}

const getSQL = nodeSelect + ` WHERE n.tenant_id = $1 AND n.id = $2 AND n.deleted_at IS NULL`

func scanGot(row pgx.Row, id string) (Node, error) {
	n, err := scanNode(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return Node{}, NotFound(id)
	}
	return n, err
}

// lockAny reads any live node, locked (ingestion: the agent is the node
// itself, not a tenant's caller).
func lockAny(ctx context.Context, tx store.Tx, id string) (Node, error) {
	n, err := scanNode(tx.QueryRow(ctx, nodeSelect+` WHERE n.id = $1 AND n.deleted_at IS NULL FOR UPDATE OF n`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Node{}, NotFound(id)
	}
	return n, err
}

// Filter narrows List; empty fields do not filter.
type Filter struct {
	PoolID, ProvisionState, Connectivity string
	// Schedulable, when set, keeps the nodes whose computed
	// schedulability is that.
	Schedulable *bool
}

// List reads the tenant's live nodes the projection holds (typ is the node
// type's full name), filtered, oldest first (creation millisecond, then
// id), the page's rows after its key plus one. Schedulability is not
// filtered here: the caller drops the nodes Keep refuses once it has cut
// the page, so the one predicate (core/nodes) decides it and the cursor
// still follows the last row read.
func List(ctx context.Context, tx store.Tx, typ, tenantID string, f Filter, page store.PageQuery) ([]Node, error) {
	after := page.AfterKey()
	rows, err := tx.Query(ctx, nodeSelect+`
		WHERE n.tenant_id = $1 AND n.deleted_at IS NULL
		  AND ($2 = '' OR n.pool_id = $2) AND ($3 = '' OR n.provision_state = $3) AND ($4 = '' OR n.connectivity = $4)
		  AND EXISTS (SELECT 1 FROM authz_resources a WHERE a.type = $5 AND a.id = n.id AND a.tenant_id = $1)
		  AND (`+store.MsOf("n.created_at")+`, n.id) > ($7, $8)
		ORDER BY `+store.MsOf("n.created_at")+`, n.id LIMIT $6`,
		tenantID, f.PoolID, f.ProvisionState, f.Connectivity, typ, page.Fetch(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Node, error) { return scanNode(r) })
}

// Keep reports whether n passes the filter's schedulability.
func (f Filter) Keep(n Node) bool {
	return f.Schedulable == nil || n.Schedulable == *f.Schedulable
}

// microsOf is node_events.at as epoch microseconds, its full precision.
const microsOf = "(floor(extract(epoch FROM at) * 1000000)::bigint)"

// Events reads the history of the tenant's live node, newest first (the
// event's microsecond, then id, both descending; Event.Key is the cursor's
// key): the page's rows before its key, plus one.
func Events(ctx context.Context, tx store.Tx, tenantID, nodeID string, page store.PageQuery) ([]Event, error) {
	if _, err := Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return nil, err
	}
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT id, node_id, at, type, message, details FROM node_events
		WHERE node_id = $1 AND ($3 OR (`+microsOf+`, id) < ($4, $5))
		ORDER BY `+microsOf+` DESC, id DESC LIMIT $2`, nodeID, page.Fetch(), page.First(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		var at time.Time
		var details []byte
		if err := r.Scan(&e.ID, &e.NodeID, &at, &e.Type, &e.Message, &details); err != nil {
			return e, err
		}
		e.At, e.atMicros = at.UnixMilli(), at.UnixMicro()
		return e, json.Unmarshal(details, &e.Details)
	})
}

// NewNode is what Create needs. Empty axes take the table's defaults:
// adopting, unassigned, platform, bcd/v1, power unknown, disconnected.
type NewNode struct {
	PoolID             string
	Name               string
	ProvisionState     nodestate.ProvisionState
	Role               nodestate.Role
	Trust              nodestate.Trust
	Adapter            nodestate.Adapter
	Power              nodestate.Power
	Connectivity       nodestate.Connectivity
	OwnerTenantID      string
	DedicatedTo        string
	DriverBindings     map[string]string
	ObservedGeneration int64
}

// Create makes a node in a live pool, with its projection row and a
// Created event, in the caller's transaction. It is not an API method: the
// join flow, tests, tools and the dev stack's demo fleet call it. The
// node's tenant is the pool's owner.
func Create(ctx context.Context, tx store.Tx, t Types, in NewNode) (Node, error) {
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	pool, err := pools.Get(ctx, tx, in.PoolID)
	if err != nil {
		return Node{}, err
	}
	if pool.ArchivedAt != nil {
		return Node{}, core.Errorf(core.CodeInvalidState, "pool %s is archived", pool.ID)
	}
	if in.Name == "" {
		return Node{}, badField("name", "required", "a node needs a name")
	}
	if in.Role == nodestate.RoleSite {
		// A site node has no pool: RegisterSiteAgent makes it.
		return Node{}, badField("role", "invalid", "a site agent's node is made by its registration, not in a pool")
	}
	bindings := in.DriverBindings
	if bindings == nil {
		bindings = map[string]string{}
	}
	rawBindings, err := json.Marshal(bindings)
	if err != nil {
		return Node{}, err
	}
	id := core.NewID("node")
	_, err = tx.Exec(ctx, `INSERT INTO nodes (id, tenant_id, pool_id, name, provision_state, role, trust, adapter, power,
		connectivity, owner_tenant_id, dedicated_to, driver_bindings, observed_generation)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14)`,
		id, pool.TenantID, pool.ID, in.Name, or(string(in.ProvisionState), string(nodestate.Adopting)),
		or(string(in.Role), string(nodestate.RoleUnassigned)), or(string(in.Trust), string(nodestate.TrustPlatform)),
		or(string(in.Adapter), string(nodestate.AdapterBCD)), or(string(in.Power), string(nodestate.PowerUnknown)),
		or(string(in.Connectivity), string(nodestate.Disconnected)), in.OwnerTenantID, in.DedicatedTo, string(rawBindings),
		in.ObservedGeneration)
	if isUniqueViolation(err) {
		return Node{}, core.Errorf(core.CodeConflict, "a node named %q exists in this tenant", in.Name).WithDetails(map[string]any{"field": "name"})
	}
	if err != nil {
		return Node{}, err
	}
	if err := AddEvent(ctx, tx, id, EventCreated, "node created in pool "+pool.ID, map[string]any{"poolId": pool.ID}); err != nil {
		return Node{}, err
	}
	n, err := Get(ctx, tx, pool.TenantID, id, false)
	if err != nil {
		return Node{}, err
	}
	return n, PutAuthz(ctx, tx, t, n)
}

// SetCordon cordons or uncordons the tenant's node. It is idempotent: a
// node already in the wanted state is answered as it is, with no event.
// Uncordoning ends a drain too (its workflow then stops).
func SetCordon(ctx context.Context, tx store.Tx, tenantID, id string, cordon bool, by string) (Node, error) {
	n, err := Get(ctx, tx, tenantID, id, true)
	if err != nil || n.Cordoned == cordon {
		return n, err
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET cordoned = $2, generation = generation + 1, updated_at = now(),
			drain_state = CASE WHEN $2 THEN drain_state ELSE '' END, drain_mode = CASE WHEN $2 THEN drain_mode ELSE '' END
		WHERE id = $1`, n.ID, cordon); err != nil {
		return Node{}, err
	}
	typ, msg := EventCordoned, "cordoned"
	if !cordon {
		typ, msg = EventUncordoned, "uncordoned"
	}
	if err := AddEvent(ctx, tx, n.ID, typ, msg+" by "+by, map[string]any{"by": by}); err != nil {
		return Node{}, err
	}
	return Get(ctx, tx, tenantID, n.ID, false)
}

// Label sets and removes labels of the tenant's node; a key both set and
// removed is refused. No change writes no event.
func Label(ctx context.Context, tx store.Tx, tenantID, id string, set map[string]string, remove []string, by string) (Node, error) {
	if len(set) == 0 && len(remove) == 0 {
		return Node{}, badField("set", "required", "nodes.label needs set or remove")
	}
	for k, v := range set {
		if err := nodestate.CheckLabelKey("set", k); err != nil {
			return Node{}, err
		}
		if err := nodestate.CheckLabelValue("set", k, v); err != nil {
			return Node{}, err
		}
	}
	for _, k := range remove {
		if err := nodestate.CheckLabelKey("remove", k); err != nil {
			return Node{}, err
		}
		if _, both := set[k]; both {
			return Node{}, badField("remove", "conflict", "label %q is both set and removed", k)
		}
	}
	n, err := Get(ctx, tx, tenantID, id, true)
	if err != nil {
		return Node{}, err
	}
	labels := maps.Clone(n.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, set)
	for _, k := range remove {
		delete(labels, k)
	}
	if len(labels) > MaxLabels {
		return Node{}, badField("set", "maxItems", "a node has at most %d labels", MaxLabels)
	}
	if maps.Equal(labels, n.Labels) {
		return n, nil
	}
	raw, err := json.Marshal(labels)
	if err != nil {
		return Node{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET labels = $2, generation = generation + 1, updated_at = now() WHERE id = $1`, n.ID, string(raw)); err != nil {
		return Node{}, err
	}
	removed := slices.DeleteFunc(slices.Clone(remove), func(k string) bool { _, had := n.Labels[k]; return !had })
	if err := AddEvent(ctx, tx, n.ID, EventLabelsChanged, "labels changed",
		map[string]any{"set": set, "removed": removed, "by": by}); err != nil {
		return Node{}, err
	}
	return Get(ctx, tx, tenantID, n.ID, false)
}

// TaintRef names taints to remove: by key, and by effect when given.
type TaintRef struct {
	Key    string `json:"key"`
	Effect string `json:"effect,omitempty"`
}

// SetTaints adds taints to the tenant's node (replacing the value of one
// with the same key and effect) and removes them by key, and by effect
// when given.
func SetTaints(ctx context.Context, tx store.Tx, tenantID, id string, add []Taint, remove []TaintRef, by string) (Node, error) {
	if len(add) == 0 && len(remove) == 0 {
		return Node{}, badField("add", "required", "nodes.taint needs add or remove")
	}
	for _, t := range add {
		if err := nodestate.CheckLabelKey("add", t.Key); err != nil {
			return Node{}, err
		}
		if err := nodestate.CheckLabelValue("add", t.Key, t.Value); err != nil {
			return Node{}, err
		}
		if !slices.Contains(nodestate.TaintEffects, t.Effect) {
			return Node{}, badField("add", "enum", "taint effect %q is not one of %s", t.Effect, strings.Join(nodestate.TaintEffects, ", "))
		}
	}
	for _, r := range remove {
		if err := nodestate.CheckLabelKey("remove", r.Key); err != nil {
			return Node{}, err
		}
		if r.Effect != "" && !slices.Contains(nodestate.TaintEffects, r.Effect) {
			return Node{}, badField("remove", "enum", "taint effect %q is not one of %s", r.Effect, strings.Join(nodestate.TaintEffects, ", "))
		}
	}
	n, err := Get(ctx, tx, tenantID, id, true)
	if err != nil {
		return Node{}, err
	}
	taints := slices.Clone(n.Taints)
	for _, r := range remove {
		taints = slices.DeleteFunc(taints, func(t Taint) bool { return t.Key == r.Key && (r.Effect == "" || t.Effect == r.Effect) })
	}
	for _, a := range add {
		i := slices.IndexFunc(taints, func(t Taint) bool { return t.Key == a.Key && t.Effect == a.Effect })
		if i >= 0 {
			taints[i] = a
		} else {
			taints = append(taints, a)
		}
	}
	if len(taints) > MaxTaints {
		return Node{}, badField("add", "maxItems", "a node has at most %d taints", MaxTaints)
	}
	if slices.Equal(taints, n.Taints) {
		return n, nil
	}
	if taints == nil {
		taints = []Taint{}
	}
	raw, err := json.Marshal(taints)
	if err != nil {
		return Node{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET taints = $2, generation = generation + 1, updated_at = now() WHERE id = $1`, n.ID, string(raw)); err != nil {
		return Node{}, err
	}
	if err := AddEvent(ctx, tx, n.ID, EventTaintsChanged, "taints changed",
		map[string]any{"taints": taints, "by": by}); err != nil {
		return Node{}, err
	}
	return Get(ctx, tx, tenantID, n.ID, false)
}

// Delete soft-deletes the tenant's cordoned node: it leaves every list and
// read, its devices are marked removed, its name is free again.
func Delete(ctx context.Context, tx store.Tx, tenantID, id, by string) (Node, error) {
	n, err := Get(ctx, tx, tenantID, id, true)
	if err != nil {
		return Node{}, err
	}
	if !n.Cordoned {
		return Node{}, core.Errorf(core.CodeInvalidState, "node %s must be cordoned before it is deleted", n.ID).
			WithDetails(map[string]any{"reason": "not-cordoned"})
	}
	var deleted time.Time
	if err := tx.QueryRow(ctx, `UPDATE nodes SET deleted_at = now(), updated_at = now() WHERE id = $1 RETURNING deleted_at`, n.ID).Scan(&deleted); err != nil {
		return Node{}, err
	}
	if _, err := tx.Exec(ctx, `UPDATE devices SET removed_at = now(), updated_at = now() WHERE node_id = $1 AND removed_at IS NULL`, n.ID); err != nil {
		return Node{}, err
	}
	if err := AddEvent(ctx, tx, n.ID, EventDeleted, "deleted by "+by, map[string]any{"by": by}); err != nil {
		return Node{}, err
	}
	n.DeletedAt, n.Devices, n.Atoms = msPtr(&deleted), 0, 0
	return n, nil
}

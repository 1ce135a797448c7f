package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	pooldomain "github.com/better-compute/better-compute/store/pools"
)

// Node is a node as the API returns it: every state axis on its own, the
// computed schedulability with the clauses that fail, and its device and
// atom counts (live devices; atoms are the bookable ones).
type Node struct {
	ID             string `json:"id"`
	TenantID       string `json:"tenantId"` // the pool's owner
	PoolID         string `json:"poolId"`
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
	Conditions         []NodeCondition   `json:"conditions"`
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

// NodeCondition is a typed node condition. Since is when it last changed
// status (epoch ms); Device names the device it is about, if any.
type NodeCondition struct {
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

// NodeList is nodes.list's answer.
type NodeList struct {
	Items []Node `json:"items"`
}

// NodeEvent is one nodes.events entry.
type NodeEvent struct {
	ID      string         `json:"id"`
	NodeID  string         `json:"nodeId"`
	At      int64          `json:"at"`
	Type    string         `json:"type"`
	Message string         `json:"message"`
	Details map[string]any `json:"details"`
}

// NodeEventList is nodes.events' answer, newest first.
type NodeEventList struct {
	Items []NodeEvent `json:"items"`
}

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
)

// Limits of nodes.events and inventory.history.
const (
	defaultEventLimit = 100
	maxEventLimit     = 500
	maxLabels         = 64
	maxTaints         = 32
)

const nodeSelect = `SELECT n.id, n.tenant_id, n.pool_id, s.region, n.name, n.provision_state, n.maintenance, n.cordoned,
	n.power, n.connectivity, n.conditions, n.role, n.trust, n.adapter, n.driver_bindings, n.owner_tenant_id, n.dedicated_to,
	n.generation, n.observed_generation, n.labels, n.taints, n.no_schedule_reasons, n.hardware_key, n.hardware_key_trusted,
	n.gpu_model, n.gpu_count, n.created_at, n.updated_at, n.deleted_at, n.drain_state, n.drain_mode,
	(SELECT count(*) FROM devices d WHERE d.node_id = n.id AND d.removed_at IS NULL),
	(SELECT count(*) FROM devices d WHERE d.node_id = n.id AND d.removed_at IS NULL AND d.bookable)
	FROM nodes n JOIN pools p ON p.id = n.pool_id JOIN sites s ON s.id = p.site_id`

func scanNode(row pgx.Row) (Node, error) {
	var n Node
	var conditions, bindings, labels, taints []byte
	var created, updated time.Time
	var deleted *time.Time
	var devices, atoms int64
	err := row.Scan(&n.ID, &n.TenantID, &n.PoolID, &n.Region, &n.Name, &n.ProvisionState, &n.Maintenance, &n.Cordoned,
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
	n.Schedulable, n.UnschedulableReasons = nodes.Schedulable(n.view(), n.TenantID)
	return n, nil
}

// view is what the schedulability predicate reads. The node's tenant is
// its pool's owner, so the pool owner passed to Schedulable is TenantID.
func (n Node) view() nodes.NodeView {
	return nodes.NodeView{ProvisionState: nodes.ProvisionState(n.ProvisionState), Role: nodes.Role(n.Role),
		Maintenance: n.Maintenance, Cordoned: n.Cordoned, Connectivity: nodes.Connectivity(n.Connectivity),
		NoScheduleReasons: n.NoScheduleReasons, ObservedGeneration: n.ObservedGeneration,
		Trust: nodes.Trust(n.Trust), OwnerTenant: n.OwnerTenantID}
}

func (s *Server) nodeResource(id string) iam.Resource {
	return iam.Resource{Type: s.catalog.FullName("node"), ID: id}
}

// putNodeAuthz writes the node's projection row (parent: its pool) in the
// transaction that changed the node.
func (s *Server) putNodeAuthz(ctx context.Context, tx store.Tx, n Node) error {
	return store.PutAuthzResource(ctx, tx, store.AuthzResource{
		Type: s.catalog.FullName("node"), ID: n.ID, TenantID: n.TenantID,
		ParentType: s.catalog.FullName("pool"), ParentID: n.PoolID,
		Attributes: map[string]any{"region": n.Region, "gpuModel": n.GPUModel, "gpuCount": n.GPUCount,
			"lifecycle": n.ProvisionState, "trust": n.Trust, "dedicatedTo": n.DedicatedTo},
	})
}

func nodeNotFound(id string) error { return core.Errorf(core.CodeNotFound, "node %s not found", id) }

// lockedNode decodes the input's nodeId and locks the tenant's node
// (NOT_FOUND for another tenant's).
func (s *Server) lockedNode(ctx context.Context, c *Call, tx store.Tx) (Node, error) {
	var in nodeIDInput
	if err := decode(c.Input, &in); err != nil {
		return Node{}, err
	}
	return s.loadNode(ctx, tx, c.TenantID, in.NodeID, true)
}

// loadNode reads a live node of the tenant; lock takes it for a change.
// Another tenant's node, a deleted one or none is NOT_FOUND.
func (s *Server) loadNode(ctx context.Context, tx store.Tx, tenantID, id string, lock bool) (Node, error) {
	q := nodeSelect + ` WHERE n.tenant_id = $1 AND n.id = $2 AND n.deleted_at IS NULL`
	if lock {
		q += ` FOR UPDATE OF n`
	}
	n, err := scanNode(tx.QueryRow(ctx, q, tenantID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Node{}, nodeNotFound(id)
	}
	return n, err
}

// loadNodeByID reads any live node, locked (ingestion: the agent is the
// node itself, not a tenant's caller).
func (s *Server) loadNodeByID(ctx context.Context, tx store.Tx, id string) (Node, error) {
	n, err := scanNode(tx.QueryRow(ctx, nodeSelect+` WHERE n.id = $1 AND n.deleted_at IS NULL FOR UPDATE OF n`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Node{}, nodeNotFound(id)
	}
	return n, err
}

// addNodeEvent appends one event to the node's history.
func addNodeEvent(ctx context.Context, tx store.Tx, nodeID, typ, message string, details map[string]any) error {
	return store.AddNodeEvent(ctx, tx, nodeID, typ, message, details)
}

// NewNode is what CreateNode needs. Empty axes take the table's defaults:
// adopting, unassigned, platform, bcd/v1, power unknown, disconnected.
type NewNode struct {
	PoolID             string
	Name               string
	ProvisionState     nodes.ProvisionState
	Role               nodes.Role
	Trust              nodes.Trust
	Adapter            nodes.Adapter
	Power              nodes.Power
	Connectivity       nodes.Connectivity
	OwnerTenantID      string
	DedicatedTo        string
	DriverBindings     map[string]string
	ObservedGeneration int64
}

// CreateNode makes a node in a live pool, with its projection row and a
// Created event, in the caller's transaction. It is not an API method: the
// join and adopt flows (the agent's issue), tests and the dev stack's demo
// fleet call it. The node's tenant is the pool's owner.
func (s *Server) CreateNode(ctx context.Context, tx store.Tx, in NewNode) (Node, error) {
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	pool, err := pooldomain.Get(ctx, tx, in.PoolID)
	if err != nil {
		return Node{}, err
	}
	if pool.ArchivedAt != nil {
		return Node{}, core.Errorf(core.CodeInvalidState, "pool %s is archived", pool.ID)
	}
	if in.Name == "" {
		return Node{}, badField("name", "required", "a node needs a name")
	}
	bindings, err := json.Marshal(nonNilMap(in.DriverBindings))
	if err != nil {
		return Node{}, err
	}
	id := core.NewID("node")
	_, err = tx.Exec(ctx, `INSERT INTO nodes (id, tenant_id, pool_id, name, provision_state, role, trust, adapter, power,
		connectivity, owner_tenant_id, dedicated_to, driver_bindings, observed_generation)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14)`,
		id, pool.TenantID, pool.ID, in.Name, or(string(in.ProvisionState), string(nodes.Adopting)),
		or(string(in.Role), string(nodes.RoleUnassigned)), or(string(in.Trust), string(nodes.TrustPlatform)),
		or(string(in.Adapter), string(nodes.AdapterBCD)), or(string(in.Power), string(nodes.PowerUnknown)),
		or(string(in.Connectivity), string(nodes.Disconnected)), in.OwnerTenantID, in.DedicatedTo, string(bindings),
		in.ObservedGeneration)
	if isUniqueViolation(err) {
		return Node{}, core.Errorf(core.CodeConflict, "a node named %q exists in this tenant", in.Name).WithDetails(map[string]any{"field": "name"})
	}
	if err != nil {
		return Node{}, err
	}
	if err := addNodeEvent(ctx, tx, id, EventCreated, "node created in pool "+pool.ID, map[string]any{"poolId": pool.ID}); err != nil {
		return Node{}, err
	}
	n, err := s.loadNode(ctx, tx, pool.TenantID, id, false)
	if err != nil {
		return Node{}, err
	}
	return n, s.putNodeAuthz(ctx, tx, n)
}

func nonNilMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

type nodeIDInput struct {
	NodeID string `json:"nodeId"`
}

func (s *Server) nodesGet(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in nodeIDInput
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	return s.loadNode(ctx, tx, c.TenantID, in.NodeID, false)
}

// nodesList answers the tenant's live nodes the projection holds, filtered
// by pool, provision state, connectivity and computed schedulability.
// Schedulability is filtered after the page is read, so the one predicate
// (core/nodes) decides it.
func (s *Server) nodesList(ctx context.Context, c *Call, tx store.Tx) (rpc.Page, error) {
	var in struct {
		PoolID         string `json:"poolId"`
		ProvisionState string `json:"provisionState"`
		Connectivity   string `json:"connectivity"`
		Schedulable    *bool  `json:"schedulable"`
	}
	if err := decode(c.Input, &in); err != nil {
		return rpc.Page{}, err
	}
	rows, err := tx.Query(ctx, nodeSelect+`
		WHERE n.tenant_id = $1 AND n.deleted_at IS NULL
		  AND ($2 = '' OR n.pool_id = $2) AND ($3 = '' OR n.provision_state = $3) AND ($4 = '' OR n.connectivity = $4)
		  AND EXISTS (SELECT 1 FROM authz_resources a WHERE a.type = $5 AND a.id = n.id AND a.tenant_id = $1)
		ORDER BY n.created_at, n.id LIMIT $6`,
		c.TenantID, in.PoolID, in.ProvisionState, in.Connectivity, s.catalog.FullName("node"), listLimit)
	if err != nil {
		return rpc.Page{}, err
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Node, error) { return scanNode(r) })
	if err != nil {
		return rpc.Page{}, err
	}
	if in.Schedulable != nil {
		list = slices.DeleteFunc(list, func(n Node) bool { return n.Schedulable != *in.Schedulable })
	}
	return rpc.PageOf(list, func(n Node) iam.Resource { return s.nodeResource(n.ID) },
		func(kept []Node) any { return NodeList{Items: kept} }), nil
}

func (s *Server) nodesEvents(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		NodeID string `json:"nodeId"`
		Limit  *int   `json:"limit"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	limit, err := limitOf(in.Limit, defaultEventLimit, maxEventLimit)
	if err != nil {
		return nil, err
	}
	if _, err := s.loadNode(ctx, tx, c.TenantID, in.NodeID, false); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT id, node_id, at, type, message, details FROM node_events
		WHERE node_id = $1 ORDER BY at DESC, id DESC LIMIT $2`, in.NodeID, limit)
	if err != nil {
		return nil, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeEvent, error) {
		var e NodeEvent
		var at time.Time
		var details []byte
		if err := r.Scan(&e.ID, &e.NodeID, &at, &e.Type, &e.Message, &details); err != nil {
			return e, err
		}
		e.At = at.UnixMilli()
		return e, json.Unmarshal(details, &e.Details)
	})
	if err != nil {
		return nil, err
	}
	return NodeEventList{Items: items}, nil
}

// limitOf reads an optional limit in [1, max].
func limitOf(v *int, def, max int) (int, error) {
	if v == nil {
		return def, nil
	}
	if *v < 1 || *v > max {
		return 0, badField("limit", "range", "limit must be in [1, %d]", max)
	}
	return *v, nil
}

func (s *Server) nodesCordon(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	return s.setCordon(ctx, c, tx, true)
}

func (s *Server) nodesUncordon(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	return s.setCordon(ctx, c, tx, false)
}

// setCordon is idempotent: a node already in the wanted state is answered
// as it is, with no event.
func (s *Server) setCordon(ctx context.Context, c *Call, tx store.Tx, cordon bool) (any, error) {
	n, err := s.lockedNode(ctx, c, tx)
	if err != nil || n.Cordoned == cordon {
		return n, err
	}
	// Uncordoning ends a drain too (its workflow then stops).
	if _, err := tx.Exec(ctx, `UPDATE nodes SET cordoned = $2, generation = generation + 1, updated_at = now(),
			drain_state = CASE WHEN $2 THEN drain_state ELSE '' END, drain_mode = CASE WHEN $2 THEN drain_mode ELSE '' END
		WHERE id = $1`, n.ID, cordon); err != nil {
		return nil, err
	}
	typ, msg := EventCordoned, "cordoned"
	if !cordon {
		typ, msg = EventUncordoned, "uncordoned"
	}
	if err := addNodeEvent(ctx, tx, n.ID, typ, msg+" by "+c.Caller.IdentityID, map[string]any{"by": c.Caller.IdentityID}); err != nil {
		return nil, err
	}
	return s.loadNode(ctx, tx, c.TenantID, n.ID, false)
}

// Kubernetes label syntax: a key is an optional DNS-subdomain prefix and
// "/", then a name of at most 63 characters; a value is empty or a name.
var (
	labelNamePattern   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelPrefixPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// checkLabelKey validates a Kubernetes-style key; field names the input.
func checkLabelKey(field, key string) error {
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	if hasPrefix && (prefix == "" || len(prefix) > 253 || !labelPrefixPattern.MatchString(prefix)) {
		return badField(field, "pattern", "key %q: the prefix must be a DNS subdomain of at most 253 characters", key)
	}
	if len(name) > 63 || !labelNamePattern.MatchString(name) {
		return badField(field, "pattern", "key %q: the name must be 1-63 characters, alphanumerics with -, _ or . inside", key)
	}
	return nil
}

func checkLabelValue(field, key, value string) error {
	if value != "" && (len(value) > 63 || !labelNamePattern.MatchString(value)) {
		return badField(field, "pattern", "value of %q must be empty or 1-63 characters, alphanumerics with -, _ or . inside", key)
	}
	return nil
}

// nodesLabel sets and removes labels; a key both set and removed is
// refused. No change writes no event.
func (s *Server) nodesLabel(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		NodeID string            `json:"nodeId"`
		Set    map[string]string `json:"set"`
		Remove []string          `json:"remove"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if len(in.Set) == 0 && len(in.Remove) == 0 {
		return nil, badField("set", "required", "nodes.label needs set or remove")
	}
	for k, v := range in.Set {
		if err := checkLabelKey("set", k); err != nil {
			return nil, err
		}
		if err := checkLabelValue("set", k, v); err != nil {
			return nil, err
		}
	}
	for _, k := range in.Remove {
		if err := checkLabelKey("remove", k); err != nil {
			return nil, err
		}
		if _, both := in.Set[k]; both {
			return nil, badField("remove", "conflict", "label %q is both set and removed", k)
		}
	}
	n, err := s.loadNode(ctx, tx, c.TenantID, in.NodeID, true)
	if err != nil {
		return nil, err
	}
	labels := maps.Clone(n.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, in.Set)
	for _, k := range in.Remove {
		delete(labels, k)
	}
	if len(labels) > maxLabels {
		return nil, badField("set", "maxItems", "a node has at most %d labels", maxLabels)
	}
	if maps.Equal(labels, n.Labels) {
		return n, nil
	}
	raw, err := json.Marshal(labels)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET labels = $2, generation = generation + 1, updated_at = now() WHERE id = $1`, n.ID, string(raw)); err != nil {
		return nil, err
	}
	removed := slices.DeleteFunc(slices.Clone(in.Remove), func(k string) bool { _, had := n.Labels[k]; return !had })
	if err := addNodeEvent(ctx, tx, n.ID, EventLabelsChanged, "labels changed",
		map[string]any{"set": in.Set, "removed": removed, "by": c.Caller.IdentityID}); err != nil {
		return nil, err
	}
	return s.loadNode(ctx, tx, c.TenantID, n.ID, false)
}

// nodesTaint adds taints (replacing the value of one with the same key and
// effect) and removes them by key, and by effect when given.
func (s *Server) nodesTaint(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	var in struct {
		NodeID string  `json:"nodeId"`
		Add    []Taint `json:"add"`
		Remove []struct {
			Key    string `json:"key"`
			Effect string `json:"effect"`
		} `json:"remove"`
	}
	if err := decode(c.Input, &in); err != nil {
		return nil, err
	}
	if len(in.Add) == 0 && len(in.Remove) == 0 {
		return nil, badField("add", "required", "nodes.taint needs add or remove")
	}
	for _, t := range in.Add {
		if err := checkLabelKey("add", t.Key); err != nil {
			return nil, err
		}
		if err := checkLabelValue("add", t.Key, t.Value); err != nil {
			return nil, err
		}
		if !slices.Contains(nodes.TaintEffects, t.Effect) {
			return nil, badField("add", "enum", "taint effect %q is not one of %s", t.Effect, strings.Join(nodes.TaintEffects, ", "))
		}
	}
	for _, r := range in.Remove {
		if err := checkLabelKey("remove", r.Key); err != nil {
			return nil, err
		}
		if r.Effect != "" && !slices.Contains(nodes.TaintEffects, r.Effect) {
			return nil, badField("remove", "enum", "taint effect %q is not one of %s", r.Effect, strings.Join(nodes.TaintEffects, ", "))
		}
	}
	n, err := s.loadNode(ctx, tx, c.TenantID, in.NodeID, true)
	if err != nil {
		return nil, err
	}
	taints := slices.Clone(n.Taints)
	for _, r := range in.Remove {
		taints = slices.DeleteFunc(taints, func(t Taint) bool { return t.Key == r.Key && (r.Effect == "" || t.Effect == r.Effect) })
	}
	for _, a := range in.Add {
		i := slices.IndexFunc(taints, func(t Taint) bool { return t.Key == a.Key && t.Effect == a.Effect })
		if i >= 0 {
			taints[i] = a
		} else {
			taints = append(taints, a)
		}
	}
	if len(taints) > maxTaints {
		return nil, badField("add", "maxItems", "a node has at most %d taints", maxTaints)
	}
	if slices.Equal(taints, n.Taints) {
		return n, nil
	}
	if taints == nil {
		taints = []Taint{}
	}
	raw, err := json.Marshal(taints)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET taints = $2, generation = generation + 1, updated_at = now() WHERE id = $1`, n.ID, string(raw)); err != nil {
		return nil, err
	}
	if err := addNodeEvent(ctx, tx, n.ID, EventTaintsChanged, "taints changed",
		map[string]any{"taints": taints, "by": c.Caller.IdentityID}); err != nil {
		return nil, err
	}
	return s.loadNode(ctx, tx, c.TenantID, n.ID, false)
}

// nodesDelete soft-deletes a cordoned node: it leaves every list and read,
// its devices are marked removed, its name is free again. A node with a
// bookable atom in use is refused too once bookings exist (none yet).
func (s *Server) nodesDelete(ctx context.Context, c *Call, tx store.Tx) (any, error) {
	n, err := s.lockedNode(ctx, c, tx)
	if err != nil {
		return nil, err
	}
	if !n.Cordoned {
		return nil, core.Errorf(core.CodeInvalidState, "node %s must be cordoned before it is deleted", n.ID).
			WithDetails(map[string]any{"reason": "not-cordoned"})
	}
	var deleted time.Time
	if err := tx.QueryRow(ctx, `UPDATE nodes SET deleted_at = now(), updated_at = now() WHERE id = $1 RETURNING deleted_at`, n.ID).Scan(&deleted); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `UPDATE devices SET removed_at = now(), updated_at = now() WHERE node_id = $1 AND removed_at IS NULL`, n.ID); err != nil {
		return nil, err
	}
	if err := addNodeEvent(ctx, tx, n.ID, EventDeleted, "deleted by "+c.Caller.IdentityID, map[string]any{"by": c.Caller.IdentityID}); err != nil {
		return nil, err
	}
	n.DeletedAt, n.Devices, n.Atoms = msPtr(&deleted), 0, 0
	return n, nil
}

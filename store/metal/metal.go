// Package metal is the bare-metal domain's store: an enrolled node's BMC
// endpoints (node_bmcs, passwords as secret references only), its
// lifecycle (node_metal: the operation in flight, its op_seq, step,
// deadline and the owed workflow start), its ramdisk boots (metal_boots)
// and the machines that booted a site's discovery ramdisk
// (metal_discovered). The rules of which operation may start where are
// core/metal's; the nodes row itself is written through store/nodes.
package metal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
)

// RedfishEndpoint is how a site reaches a machine's Redfish service. The
// password is a secret reference (secret://<tenant>/<name>), never a value.
type RedfishEndpoint struct {
	Address            string `json:"address"`
	Username           string `json:"username"`
	PasswordSecret     string `json:"passwordSecret"`
	CAPEM              string `json:"caPem,omitempty"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`
}

// IPMIEndpoint is how a site reaches a machine's IPMI (host[:port]).
type IPMIEndpoint struct {
	Address        string `json:"address"`
	Username       string `json:"username"`
	PasswordSecret string `json:"passwordSecret"`
}

// BMC is a node's BMC endpoints and its boot MAC.
type BMC struct {
	Redfish *RedfishEndpoint `json:"redfish,omitempty"`
	IPMI    *IPMIEndpoint    `json:"ipmi,omitempty"`
	// BootMAC is the MAC the machine network-boots from; confirmed (epoch
	// ms) once an operator or a matching discovery confirmed it.
	BootMAC            string `json:"bootMac,omitempty"`
	BootMACConfirmedAt *int64 `json:"bootMacConfirmedAt,omitempty"`
}

// SecretRefs are the references the endpoints hold.
func (b BMC) SecretRefs() []string {
	var out []string
	if b.Redfish != nil {
		out = append(out, b.Redfish.PasswordSecret)
	}
	if b.IPMI != nil {
		out = append(out, b.IPMI.PasswordSecret)
	}
	return out
}

// LastError is the last failure of an operation on the node.
type LastError struct {
	Operation string `json:"operation"`
	// Origin is the stable state the failed operation started from, where
	// metal.recover's edge (core/metal Edge.RecoveryFrom) starts.
	Origin  string `json:"origin"`
	Step    string `json:"step,omitempty"`
	Code    string `json:"code,omitempty"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	At      int64  `json:"at"`
	// RecoverTo is the target of a failed recover (recovering again goes
	// there).
	RecoverTo string `json:"recoverTo,omitempty"`
	// WorkflowID is the provisioning workflow the operation ran, failed
	// with it (workflows.retry resumes only that one).
	WorkflowID string `json:"workflowId,omitempty"`
}

// Lifecycle is the node's bare-metal lifecycle as the API answers it.
type Lifecycle struct {
	// State is the node's provision state.
	State string `json:"state"`
	// Operation is the operation in flight ("" when none), OpSeq its
	// sequence number, Step its step in flight, Origin the state it
	// started from, Deadline (epoch ms) when it fails if still running.
	Operation        string `json:"operation,omitempty"`
	OpSeq            int64  `json:"opSeq"`
	Step             string `json:"step,omitempty"`
	Origin           string `json:"origin,omitempty"`
	Deadline         *int64 `json:"deadline,omitempty"`
	StartedAt        *int64 `json:"startedAt,omitempty"`
	WorkflowStarted  bool   `json:"workflowStarted"`
	AbortRequestedAt *int64 `json:"abortRequestedAt,omitempty"`
	Managed          bool   `json:"managed"`
	Inspected        bool   `json:"inspected"`
	// Power is the node's power axis as the BMC last read it back.
	Power     string     `json:"power"`
	LastError *LastError `json:"lastError,omitempty"`
	// Allowed lists the operations that may start now.
	Allowed []string `json:"allowed"`
	// args are the operation's arguments (the workflow's, not answered).
	args json.RawMessage
}

// Node is an enrolled node: the node, its lifecycle and its BMC.
type Node struct {
	Node      nodes.Node `json:"node"`
	Lifecycle Lifecycle  `json:"lifecycle"`
	BMC       BMC        `json:"bmc"`
}

// Event types of the metal lifecycle on the node's history.
const (
	EventEnrolled          = "Enrolled"
	EventOperationStarted  = "OperationStarted"
	EventStep              = "OperationStep"
	EventOperationFinished = "OperationFinished"
	EventOperationFailed   = "OperationFailed"
	EventAbortRequested    = "AbortRequested"
	EventCredentialsUsed   = "BMCCredentialsResolved"
	EventBootMACConfirmed  = "BootMACConfirmed"
	EventInspected         = "Inspected"
)

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

func isUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && (constraint == "" || pgErr.ConstraintName == constraint)
}

func ms(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	v := t.UnixMilli()
	return &v
}

// notMetal is the error of a node of the tenant that was not enrolled as
// bare metal (it joined with bcd): it has no lifecycle.
func notMetal(id string) error {
	return core.Errorf(core.CodeInvalidState, "node %s is not an enrolled bare-metal node", id).
		WithDetails(map[string]any{"reason": "notMetal"})
}

// Enrollment is what Enroll records.
type Enrollment struct {
	TenantID string
	PoolID   string
	Name     string
	BMC      BMC
	Bindings map[string]string
	Labels   map[string]string
	// RootTenant owns the platform's pools, whose nodes are platform
	// trusted; By is who enrolled it.
	RootTenant string
	By         string
}

// NormalizeMAC is a MAC in its stored form (lower case, colon separated);
// anything else than 6 octets is INVALID_INPUT naming field.
func NormalizeMAC(field, mac string) (string, error) {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return "", badField(field, "pattern", "%s must be a MAC address (six octets)", field)
	}
	return hw.String(), nil
}

// CheckEndpoints validates the endpoints' shapes (the addresses; the
// secret references are the caller's to check for existence).
func CheckEndpoints(b BMC) error {
	if b.Redfish == nil && b.IPMI == nil {
		return badField("bmc", "required", "bmc needs redfish or ipmi")
	}
	if r := b.Redfish; r != nil {
		u, err := url.Parse(r.Address)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return badField("bmc.redfish.address", "pattern", "bmc.redfish.address must be an https URL of the Redfish service (https://host[:port])")
		}
		if r.Username == "" {
			return badField("bmc.redfish.username", "required", "bmc.redfish.username is required")
		}
		if r.PasswordSecret == "" {
			return badField("bmc.redfish.passwordSecret", "required", "bmc.redfish.passwordSecret is required")
		}
		if r.CAPEM != "" && !strings.Contains(r.CAPEM, "-----BEGIN CERTIFICATE-----") {
			return badField("bmc.redfish.caPem", "pattern", "bmc.redfish.caPem must be PEM certificates")
		}
		if r.CAPEM != "" && r.InsecureSkipVerify {
			return badField("bmc.redfish.insecureSkipVerify", "conflict", "a CA and insecureSkipVerify exclude each other")
		}
	}
	if i := b.IPMI; i != nil {
		host, port := i.Address, ""
		if h, p, err := net.SplitHostPort(i.Address); err == nil {
			host, port = h, p
		}
		if host == "" || strings.ContainsAny(host, "/ ?#@") || (port != "" && !isPort(port)) {
			return badField("bmc.ipmi.address", "pattern", "bmc.ipmi.address must be host[:port]")
		}
		if i.Username == "" {
			return badField("bmc.ipmi.username", "required", "bmc.ipmi.username is required")
		}
		if i.PasswordSecret == "" {
			return badField("bmc.ipmi.passwordSecret", "required", "bmc.ipmi.passwordSecret is required")
		}
	}
	return nil
}

func isPort(p string) bool {
	var n int
	_, err := fmt.Sscanf(p, "%d", &n)
	return err == nil && n > 0 && n < 65536 && fmt.Sprint(n) == p
}

// Enroll makes the node of a machine behind a BMC in the tenant's own
// pool, in the caller's transaction: provision state enrolling, role host,
// trust as a join gives it (platform in the root tenant's pools, tenant
// owned elsewhere), with its node_bmcs and node_metal rows, its labels and
// its projection row. A BMC address another node of the site has is
// CONFLICT naming the field. The secret references must have been checked
// by the caller.
func Enroll(ctx context.Context, tx store.Tx, t nodes.Types, in Enrollment) (Node, error) {
	if err := CheckEndpoints(in.BMC); err != nil {
		return Node{}, err
	}
	pool, err := pools.View(ctx, tx, in.TenantID, in.PoolID)
	if err != nil {
		return Node{}, err
	}
	if pool.TenantID != in.TenantID {
		return Node{}, core.Errorf(core.CodeAccessDenied, "pool %s is offered to tenant %s: only its owner enrols machines in it", pool.ID, in.TenantID).
			WithDetails(map[string]any{"reason": "offeredPool", "poolId": pool.ID})
	}
	nn := nodes.NewNode{PoolID: pool.ID, Name: in.Name, ProvisionState: nodestate.Enrolling, Role: nodestate.RoleHost,
		Trust: nodestate.TrustPlatform, Connectivity: nodestate.Disconnected, Power: nodestate.PowerUnknown,
		DriverBindings: in.Bindings}
	if pool.TenantID != in.RootTenant {
		nn.Trust, nn.OwnerTenantID = nodestate.TrustTenantOwned, pool.TenantID
	}
	n, err := nodes.Create(ctx, tx, t, nn)
	if err != nil {
		return Node{}, err
	}
	if len(in.Labels) > 0 {
		if _, err := nodes.Label(ctx, tx, n.TenantID, n.ID, in.Labels, nil, in.By); err != nil {
			return Node{}, labelsField(err)
		}
	}
	r, i := in.BMC.Redfish, in.BMC.IPMI
	if r == nil {
		r = &RedfishEndpoint{}
	}
	if i == nil {
		i = &IPMIEndpoint{}
	}
	_, err = tx.Exec(ctx, `INSERT INTO node_bmcs (node_id, tenant_id, site_id, redfish_address, redfish_username,
		redfish_password_ref, redfish_ca_pem, redfish_insecure, ipmi_address, ipmi_username, ipmi_password_ref, boot_mac)
		VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)`,
		n.ID, n.TenantID, n.SiteID, r.Address, r.Username, r.PasswordSecret, r.CAPEM, r.InsecureSkipVerify,
		i.Address, i.Username, i.PasswordSecret, in.BMC.BootMAC)
	switch {
	case isUniqueViolation(err, "node_bmcs_site_redfish"):
		return Node{}, bmcTaken("bmc.redfish.address")
	case isUniqueViolation(err, "node_bmcs_site_ipmi"):
		return Node{}, bmcTaken("bmc.ipmi.address")
	case err != nil:
		return Node{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO node_metal (node_id, tenant_id) VALUES ($1, $2)`, n.ID, n.TenantID); err != nil {
		return Node{}, err
	}
	if err := nodes.AddEvent(ctx, tx, n.ID, EventEnrolled, "enrolled by "+in.By, map[string]any{
		"by": in.By, "redfish": r.Address, "ipmi": i.Address, "bindings": in.Bindings}); err != nil {
		return Node{}, err
	}
	return Get(ctx, tx, n.TenantID, n.ID, false)
}

// bmcTaken is the CONFLICT of an address another node of the site drives.
// It names no node: the other may be another tenant's (a shared site).
func bmcTaken(field string) error {
	return core.Errorf(core.CodeConflict, "another node of this site is enrolled with this BMC address").
		WithDetails(map[string]any{"field": field, "reason": "bmcAddressTaken"})
}

func labelsField(err error) error {
	var e *core.Error
	if errors.As(err, &e) && e.Code == core.CodeInvalidInput {
		return badField("labels", "invalid", "%s", e.Message)
	}
	return err
}

const metalSelect = `SELECT m.operation, m.op_seq, m.op_args, m.step, m.origin_state, m.op_started_at, m.deadline_at,
	m.workflow_started_at, m.abort_requested_at, m.managed_at, m.inspected_at, m.last_error,
	b.redfish_address, b.redfish_username, b.redfish_password_ref, b.redfish_ca_pem, b.redfish_insecure,
	b.ipmi_address, b.ipmi_username, b.ipmi_password_ref, b.boot_mac, b.boot_mac_confirmed_at
	FROM node_metal m JOIN node_bmcs b ON b.node_id = m.node_id WHERE m.node_id = $1`

// PoolAtPlatformSite says whether the pool is at a site the platform
// (rootTenant) owns, whose agent is the platform's.
func PoolAtPlatformSite(ctx context.Context, tx store.Tx, poolID, rootTenant string) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pools p JOIN sites s ON s.id = p.site_id
		WHERE p.id = $1 AND s.tenant_id = $2)`, poolID, rootTenant).Scan(&ok)
	return ok, err
}

// Get reads the tenant's enrolled node; lock takes its lifecycle row for
// a change. Another tenant's node is NOT_FOUND; a node of the tenant that
// was not enrolled is INVALID_STATE (reason notMetal).
func Get(ctx context.Context, tx store.Tx, tenantID, nodeID string, lock bool) (Node, error) {
	n, err := nodes.Get(ctx, tx, tenantID, nodeID, false)
	if err != nil {
		return Node{}, err
	}
	return load(ctx, tx, n, lock)
}

func load(ctx context.Context, tx store.Tx, n nodes.Node, lock bool) (Node, error) {
	q := metalSelect
	if lock {
		q += ` FOR UPDATE OF m`
	}
	m, err := scanMetal(tx.QueryRow(ctx, q, n.ID))
	if err != nil {
		return Node{}, err
	}
	if !m.found {
		return Node{}, notMetal(n.ID)
	}
	return m.of(n)
}

// QueueView queues the read of a node's lifecycle and BMC in b (a read
// that answers the node, nodes.get); the returned function completes it
// with the node once b ran: nil when the node was never enrolled.
func QueueView(b *store.Batch, nodeID string) func(n nodes.Node) (*Node, error) {
	get := store.QueueRow(b, scanMetal, metalSelect, nodeID)
	return func(n nodes.Node) (*Node, error) {
		m, err := get()
		if err != nil || !m.found {
			return nil, err
		}
		out, err := m.of(n)
		return &out, err
	}
}

// scannedMetal is a node's metal rows as read, before the node's axes
// complete them.
type scannedMetal struct {
	found                                                     bool
	l                                                         Lifecycle
	r                                                         RedfishEndpoint
	i                                                         IPMIEndpoint
	bootMAC                                                   string
	started, deadline, wfStarted, abortAt, managed, inspected *time.Time
	confirmed                                                 *time.Time
	lastErr                                                   []byte
}

func scanMetal(row pgx.Row) (scannedMetal, error) {
	var m scannedMetal
	l := &m.l
	err := row.Scan(&l.Operation, &l.OpSeq, &l.args, &l.Step, &l.Origin, &m.started, &m.deadline,
		&m.wfStarted, &m.abortAt, &m.managed, &m.inspected, &m.lastErr,
		&m.r.Address, &m.r.Username, &m.r.PasswordSecret, &m.r.CAPEM, &m.r.InsecureSkipVerify,
		&m.i.Address, &m.i.Username, &m.i.PasswordSecret, &m.bootMAC, &m.confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return m, nil
	}
	m.found = err == nil
	return m, err
}

func (m scannedMetal) of(n nodes.Node) (Node, error) {
	out := Node{Node: n, Lifecycle: m.l}
	l := &out.Lifecycle
	if m.r.Address != "" {
		out.BMC.Redfish = &m.r
	}
	if m.i.Address != "" {
		out.BMC.IPMI = &m.i
	}
	out.BMC.BootMAC = m.bootMAC
	out.BMC.BootMACConfirmedAt = ms(m.confirmed)
	l.State, l.Power = n.ProvisionState, n.Power
	l.StartedAt, l.Deadline, l.AbortRequestedAt = ms(m.started), ms(m.deadline), ms(m.abortAt)
	l.WorkflowStarted, l.Managed, l.Inspected = m.wfStarted != nil, m.managed != nil, m.inspected != nil
	if len(m.lastErr) > 0 {
		l.LastError = &LastError{}
		if err := json.Unmarshal(m.lastErr, l.LastError); err != nil {
			return Node{}, fmt.Errorf("node %s: last_error: %w", n.ID, err)
		}
	}
	l.Allowed = allowed(*l)
	return out, nil
}

// allowed lists the operations that may start now: abort alone while one
// is in flight, the table's otherwise.
func allowed(l Lifecycle) []string {
	if l.Operation != "" {
		return []string{"abort"}
	}
	ops := coremetal.Allowed(nodestate.ProvisionState(l.State), l.Managed, l.Inspected)
	out := make([]string, len(ops))
	for i, o := range ops {
		out[i] = string(o)
	}
	return out
}

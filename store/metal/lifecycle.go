package metal

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/workflows"
)

// Deadlines bound each in-flight state; a state missing takes
// core/metal.DefaultDeadlines'.
type Deadlines map[nodestate.ProvisionState]time.Duration

// For is the deadline of op running in state during.
func (d Deadlines) For(op coremetal.Operation, during nodestate.ProvisionState) time.Duration {
	if op == coremetal.Power {
		if v, ok := d[""]; ok && v > 0 {
			return v
		}
		return coremetal.PowerDeadline
	}
	if v, ok := d[during]; ok && v > 0 {
		return v
	}
	if v, ok := coremetal.DefaultDeadlines[during]; ok {
		return v
	}
	return 20 * time.Minute
}

// Begin is one operation an operator asks for.
type Begin struct {
	TenantID  string
	NodeID    string
	Operation coremetal.Operation
	// Args are the operation's arguments (a JSON object, or empty).
	Args      json.RawMessage
	By        string
	Deadlines Deadlines
	// Turns is how many operations run before this one's turn comes (a
	// bulk run's queue ahead of the node, 0 otherwise): its deadline
	// stretches by that many deadlines, so waiting in the queue does not
	// count against its own run.
	Turns int
}

// invalidState is INVALID_STATE with the allowed operations.
func invalidState(n Node, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidState, format, args...).WithDetails(map[string]any{
		"provisionState": n.Lifecycle.State, "allowed": n.Lifecycle.Allowed, "operation": n.Lifecycle.Operation})
}

// BeginOperation starts op on the tenant's enrolled node, in the caller's
// transaction, when core/metal's table allows it from the node's state
// (else INVALID_STATE with the allowed operations): the node moves to the
// operation's in-flight state, and node_metal records the operation, its
// op_seq (one more), first step, origin and target states, arguments and
// deadline, with its workflow start owed (workflow_started_at NULL).
func BeginOperation(ctx context.Context, tx store.Tx, t nodes.Types, b Begin) (Node, error) {
	n, err := Get(ctx, tx, b.TenantID, b.NodeID, true)
	if err != nil {
		return Node{}, err
	}
	l := n.Lifecycle
	if l.Operation != "" {
		return Node{}, invalidState(n, "node %s runs %s: abort it or wait", n.Node.ID, l.Operation)
	}
	state := nodestate.ProvisionState(l.State)
	if !coremetal.Allows(b.Operation, state, l.Managed, l.Inspected) {
		return Node{}, invalidState(n, "%s is not allowed from %s", b.Operation, l.State)
	}
	edge, _ := coremetal.EdgeOf(b.Operation)
	during, target := edge.DuringFrom(state), edge.Target(state)
	if b.Operation == coremetal.Recover {
		target = recoveryTarget(l.LastError)
	}
	args := b.Args
	if len(args) == 0 {
		args = json.RawMessage(`{}`)
	}
	deadline := b.Deadlines.For(b.Operation, during) * time.Duration(1+max(b.Turns, 0))
	step := ""
	if len(edge.Steps) > 0 {
		step = edge.Steps[0]
	}
	var seq int64
	if err := tx.QueryRow(ctx, `UPDATE node_metal SET operation = $2, op_seq = op_seq + 1, op_args = $3, step = $4,
			origin_state = $5, target_state = $6, requested_by = $7, op_started_at = now(),
			deadline_at = now() + make_interval(secs => $8), workflow_started_at = NULL, abort_requested_at = NULL,
			updated_at = now()
		WHERE node_id = $1 RETURNING op_seq`,
		n.Node.ID, string(b.Operation), string(args), step, l.State, string(target), b.By, deadline.Seconds()).Scan(&seq); err != nil {
		return Node{}, err
	}
	details := map[string]any{"operation": string(b.Operation), "opSeq": seq, "by": b.By, "target": string(target)}
	if err := nodes.AddEvent(ctx, tx, n.Node.ID, EventOperationStarted, string(b.Operation)+" started by "+b.By, details); err != nil {
		return Node{}, err
	}
	if err := transition(ctx, tx, t, n.Node.ID, during, string(b.Operation)+" in flight", details); err != nil {
		return Node{}, err
	}
	return Get(ctx, tx, b.TenantID, b.NodeID, false)
}

// recoveryTarget is where recover takes a node whose last failure is e:
// the failed operation's recovery state from where it started (a failed
// recover keeps the target of the recover it was).
func recoveryTarget(e *LastError) nodestate.ProvisionState {
	if e == nil {
		return nodestate.Enrolling
	}
	if e.RecoverTo != "" {
		return nodestate.ProvisionState(e.RecoverTo)
	}
	edge, ok := coremetal.EdgeOf(coremetal.Operation(e.Operation))
	if !ok || e.Origin == "" {
		return nodestate.Enrolling
	}
	return edge.RecoveryFrom(nodestate.ProvisionState(e.Origin))
}

// transition is the one writer of a metal node's provision state: the
// nodes row, its ProvisionStateChanged event and projection row
// (store/nodes.SetProvisionState).
func transition(ctx context.Context, tx store.Tx, t nodes.Types, nodeID string, to nodestate.ProvisionState,
	message string, details map[string]any) error {
	_, err := nodes.SetProvisionState(ctx, tx, t, nodeID, to, message, details)
	return err
}

// RequestAbort records an abort of the operation in flight on the tenant's
// node (abort_requested_at) and answers the node and the op_seq to abort;
// with none in flight it is INVALID_STATE with the allowed operations.
func RequestAbort(ctx context.Context, tx store.Tx, tenantID, nodeID, by string) (Node, error) {
	n, err := Get(ctx, tx, tenantID, nodeID, true)
	if err != nil {
		return Node{}, err
	}
	if n.Lifecycle.Operation == "" {
		return Node{}, invalidState(n, "node %s runs no operation to abort", nodeID)
	}
	if _, err := tx.Exec(ctx, `UPDATE node_metal SET abort_requested_at = COALESCE(abort_requested_at, now()), updated_at = now()
		WHERE node_id = $1`, nodeID); err != nil {
		return Node{}, err
	}
	if err := nodes.AddEvent(ctx, tx, nodeID, EventAbortRequested, "abort of "+n.Lifecycle.Operation+" requested by "+by,
		map[string]any{"operation": n.Lifecycle.Operation, "opSeq": n.Lifecycle.OpSeq, "by": by}); err != nil {
		return Node{}, err
	}
	return Get(ctx, tx, tenantID, nodeID, false)
}

// Superseded is the CONFLICT of a write for an operation that is no longer
// the node's operation in flight (its op_seq was finished, failed or
// replaced): the workflow of op N serves only op N.
func Superseded(nodeID string, opSeq int64) error {
	return core.Errorf(core.CodeConflict, "operation %d of node %s is no longer in flight", opSeq, nodeID).
		WithDetails(map[string]any{"reason": "superseded", "opSeq": opSeq})
}

// IsSuperseded reports whether err is Superseded's.
func IsSuperseded(err error) bool {
	var e *core.Error
	return errors.As(err, &e) && e.Code == core.CodeConflict && e.Details["reason"] == "superseded"
}

// MachineRef names the machine for the site's activities: where its BMC
// answers, without credentials.
type MachineRef struct {
	NodeID         string
	SiteID         string
	RedfishAddress string
	IPMIAddress    string
	Bindings       map[string]string
	BootMAC        string
}

// Operation is the operation in flight as its workflow reads it.
type Operation struct {
	TenantID  string
	NodeID    string
	PoolID    string
	SiteID    string
	Operation coremetal.Operation
	OpSeq     int64
	Step      string
	Args      json.RawMessage
	// Origin is the state it started from, Target where it ends, State
	// the node's provision state now.
	Origin, Target, State nodestate.ProvisionState
	Deadline              time.Time
	AbortRequested        bool
	Managed, Inspected    bool
	Power                 nodestate.Power
	HardwareKey           string
	Machine               MachineRef
}

// LoadOperation reads operation opSeq of the node, fenced: one that is no
// longer in flight is Superseded.
func LoadOperation(ctx context.Context, tx store.Tx, nodeID string, opSeq int64) (Operation, error) {
	var o Operation
	var op, origin, target, state, power string
	var deadline *time.Time
	var abort, managed, inspected bool
	err := tx.QueryRow(ctx, `SELECT n.tenant_id, COALESCE(n.pool_id, ''), b.site_id, m.operation, m.op_seq, m.step, m.op_args,
			m.origin_state, m.target_state, n.provision_state, m.deadline_at, m.abort_requested_at IS NOT NULL,
			m.managed_at IS NOT NULL, m.inspected_at IS NOT NULL, n.power, n.hardware_key,
			b.redfish_address, b.ipmi_address, n.driver_bindings, b.boot_mac
		FROM node_metal m JOIN nodes n ON n.id = m.node_id JOIN node_bmcs b ON b.node_id = m.node_id
		WHERE m.node_id = $1 AND n.deleted_at IS NULL`, nodeID).
		Scan(&o.TenantID, &o.PoolID, &o.SiteID, &op, &o.OpSeq, &o.Step, &o.Args, &origin, &target, &state, &deadline,
			&abort, &managed, &inspected, &power, &o.HardwareKey,
			&o.Machine.RedfishAddress, &o.Machine.IPMIAddress, &o.Machine.Bindings, &o.Machine.BootMAC)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, nodes.NotFound(nodeID)
	}
	if err != nil {
		return Operation{}, err
	}
	if op == "" || o.OpSeq != opSeq {
		return Operation{}, Superseded(nodeID, opSeq)
	}
	o.NodeID, o.Operation = nodeID, coremetal.Operation(op)
	o.Origin, o.Target, o.State = nodestate.ProvisionState(origin), nodestate.ProvisionState(target), nodestate.ProvisionState(state)
	o.AbortRequested, o.Managed, o.Inspected, o.Power = abort, managed, inspected, nodestate.Power(power)
	if deadline != nil {
		o.Deadline = *deadline
	}
	o.Machine.NodeID, o.Machine.SiteID = nodeID, o.SiteID
	return o, nil
}

// fence locks the node's lifecycle row and checks that opSeq is in flight.
func fence(ctx context.Context, tx store.Tx, nodeID string, opSeq int64) (Operation, error) {
	var seq int64
	var op string
	err := tx.QueryRow(ctx, `SELECT op_seq, operation FROM node_metal WHERE node_id = $1 FOR UPDATE`, nodeID).Scan(&seq, &op)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, nodes.NotFound(nodeID)
	}
	if err != nil {
		return Operation{}, err
	}
	if op == "" || seq != opSeq {
		return Operation{}, Superseded(nodeID, opSeq)
	}
	return LoadOperation(ctx, tx, nodeID, opSeq)
}

// SetStep records the step in flight of operation opSeq (fenced), with an
// event; the same step again writes nothing.
func SetStep(ctx context.Context, tx store.Tx, nodeID string, opSeq int64, step string) error {
	o, err := fence(ctx, tx, nodeID, opSeq)
	if err != nil || o.Step == step {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE node_metal SET step = $2, updated_at = now() WHERE node_id = $1`, nodeID, step); err != nil {
		return err
	}
	return nodes.AddEvent(ctx, tx, nodeID, EventStep, string(o.Operation)+": "+step,
		map[string]any{"operation": string(o.Operation), "opSeq": opSeq, "step": step})
}

// MarkStarted records that operation opSeq's workflow started: its start
// is no longer owed. A superseded operation is left alone.
func MarkStarted(ctx context.Context, db store.DBTX, nodeID string, opSeq int64) error {
	_, err := db.Exec(ctx, `UPDATE node_metal SET workflow_started_at = now() WHERE node_id = $1 AND op_seq = $2
		AND operation <> '' AND workflow_started_at IS NULL`, nodeID, opSeq)
	return err
}

// Finish is what an operation's success records.
type Finish struct {
	NodeID string
	OpSeq  int64
	// Managed and Inspected set those facts (never clear them); Power,
	// when set, is the power read back.
	Managed, Inspected bool
	Power              nodestate.Power
	Message            string
	// State, when set, is where the workflow ends it; else the target
	// fixed when it began.
	State nodestate.ProvisionState
	// WorkflowState ends the operation's provisioning workflow, if it has
	// one: "" succeeded, provisioning.WorkflowAborted after a safe abort.
	WorkflowState string
}

// FinishOperation ends operation opSeq (fenced) in its target state,
// records the facts it established, and on retire revokes the node's
// identities.
func FinishOperation(ctx context.Context, tx store.Tx, t nodes.Types, f Finish) error {
	o, err := fence(ctx, tx, f.NodeID, f.OpSeq)
	if err != nil {
		return err
	}
	wf, err := workflows.EndForOperation(ctx, tx, workflows.End{NodeID: f.NodeID, OpSeq: f.OpSeq, State: f.WorkflowState,
		Message: f.Message, Reason: coremetal.ReasonAborted})
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE node_metal SET operation = '', step = '', deadline_at = NULL, abort_requested_at = NULL,
			last_error = NULL, managed_at = CASE WHEN $2 THEN now() ELSE managed_at END,
			inspected_at = CASE WHEN $3 THEN now() ELSE inspected_at END, updated_at = now()
		WHERE node_id = $1`, f.NodeID, f.Managed, f.Inspected); err != nil {
		return err
	}
	if f.Power != "" {
		if err := nodes.SetPower(ctx, tx, f.NodeID, f.Power); err != nil {
			return err
		}
	}
	if o.Operation == coremetal.Retire {
		if _, err := nodes.RevokeIdentities(ctx, tx, f.NodeID, "retired", "metal.retire"); err != nil {
			return err
		}
	}
	details := map[string]any{"operation": string(o.Operation), "opSeq": f.OpSeq}
	if wf != "" {
		details["workflowId"] = wf
	}
	msg := f.Message
	if msg == "" {
		msg = string(o.Operation) + " finished"
	}
	if err := nodes.AddEvent(ctx, tx, f.NodeID, EventOperationFinished, msg, details); err != nil {
		return err
	}
	to := o.Target
	if f.State != "" {
		to = f.State
	}
	return transition(ctx, tx, t, f.NodeID, to, msg, details)
}

// Failure is what an operation's failure records.
type Failure struct {
	NodeID string
	OpSeq  int64
	// Reason is one of core/metal's Reason*; Code the error code
	// (CONFLICT for a hardware key another node has); Step the step it
	// failed in ("" for the step in flight).
	Reason, Code, Step, Message string
	// Power, when set, is the power read back.
	Power nodestate.Power
	// WorkflowState ends the operation's provisioning workflow, if it has
	// one: "" failed at its step, provisioning.WorkflowAborted after an
	// abort.
	WorkflowState string
}

// FailOperation ends operation opSeq (fenced) in failed, with the failure
// as the node's last error.
func FailOperation(ctx context.Context, tx store.Tx, t nodes.Types, f Failure) error {
	o, err := fence(ctx, tx, f.NodeID, f.OpSeq)
	if err != nil {
		return err
	}
	step := f.Step
	if step == "" {
		step = o.Step
	}
	wf, err := workflows.EndForOperation(ctx, tx, workflows.End{NodeID: f.NodeID, OpSeq: f.OpSeq, Failed: true,
		State: f.WorkflowState, Message: f.Message, Reason: f.Reason})
	if err != nil {
		return err
	}
	e := LastError{Operation: string(o.Operation), Origin: string(o.Origin), Step: step, Code: f.Code, Reason: f.Reason,
		Message: f.Message, At: time.Now().UnixMilli(), WorkflowID: wf}
	if o.Operation == coremetal.Recover {
		e.RecoverTo = string(o.Target)
	}
	raw, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE node_metal SET operation = '', deadline_at = NULL, last_error = $2, updated_at = now()
		WHERE node_id = $1`, f.NodeID, string(raw)); err != nil {
		return err
	}
	if f.Power != "" {
		if err := nodes.SetPower(ctx, tx, f.NodeID, f.Power); err != nil {
			return err
		}
	}
	details := map[string]any{"operation": string(o.Operation), "opSeq": f.OpSeq, "step": step, "reason": f.Reason, "code": f.Code}
	if wf != "" {
		details["workflowId"] = wf
	}
	msg := string(o.Operation) + " failed (" + f.Reason + "): " + f.Message
	if err := nodes.AddEvent(ctx, tx, f.NodeID, EventOperationFailed, msg, details); err != nil {
		return err
	}
	return transition(ctx, tx, t, f.NodeID, nodestate.Failed, msg, details)
}

// Pending is an operation in flight, as the reconciler lists them.
type Pending struct {
	TenantID string
	NodeID   string
	OpSeq    int64
	Step     string
	// Operation and Deadline are the operation's; Started whether its
	// workflow start was recorded.
	Operation coremetal.Operation
	Deadline  time.Time
	Started   bool
	Args      json.RawMessage
}

func listPending(ctx context.Context, tx store.Tx, where string, limit int, args ...any) ([]Pending, error) {
	rows, err := tx.Query(ctx, `SELECT tenant_id, node_id, op_seq, step, operation, deadline_at, workflow_started_at IS NOT NULL, op_args
		FROM node_metal WHERE operation <> '' AND `+where, append([]any{limit}, args...)...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Pending, error) {
		var p Pending
		var op string
		err := r.Scan(&p.TenantID, &p.NodeID, &p.OpSeq, &p.Step, &op, &p.Deadline, &p.Started, &p.Args)
		p.Operation = coremetal.Operation(op)
		return p, err
	})
}

// OwedStarts lists operations whose workflow start is owed for longer than
// olderThan (a start that failed after the commit, a crashed API),
// oldest first.
func OwedStarts(ctx context.Context, tx store.Tx, olderThan time.Duration, limit int) ([]Pending, error) {
	return listPending(ctx, tx, `workflow_started_at IS NULL AND op_started_at < now() - make_interval(secs => $2)
		ORDER BY op_started_at LIMIT $1`, limit, olderThan.Seconds())
}

// PastDeadline lists operations in flight past their deadline, oldest
// deadline first.
func PastDeadline(ctx context.Context, tx store.Tx, limit int) ([]Pending, error) {
	return listPending(ctx, tx, `deadline_at < now() ORDER BY deadline_at LIMIT $1`, limit)
}

// InFlight lists every operation in flight, oldest deadline first (the
// reconciler checks each has a running workflow).
func InFlight(ctx context.Context, tx store.Tx, limit int) ([]Pending, error) {
	return listPending(ctx, tx, `true ORDER BY deadline_at LIMIT $1`, limit)
}

// LoadNode reads the tenant's enrolled node's lifecycle as it stands (not
// fenced: the workflow reads it to learn what to run). Another tenant's
// node is NOT_FOUND.
func LoadNode(ctx context.Context, tx store.Tx, tenantID, nodeID string) (Operation, Node, error) {
	m, err := Get(ctx, tx, tenantID, nodeID, false)
	if err != nil {
		return Operation{}, Node{}, err
	}
	o, err := LoadOperation(ctx, tx, nodeID, m.Lifecycle.OpSeq)
	if IsSuperseded(err) {
		// No operation in flight: the row as it stands.
		err = nil
		o = Operation{TenantID: m.Node.TenantID, NodeID: nodeID, PoolID: m.Node.PoolID, SiteID: m.Node.SiteID,
			OpSeq: m.Lifecycle.OpSeq, State: nodestate.ProvisionState(m.Node.ProvisionState),
			Managed: m.Lifecycle.Managed, Inspected: m.Lifecycle.Inspected, Power: nodestate.Power(m.Node.Power),
			HardwareKey: m.Node.HardwareKey, Args: m.Lifecycle.args}
		o.Machine = MachineRef{NodeID: nodeID, SiteID: m.Node.SiteID, Bindings: m.Node.DriverBindings, BootMAC: m.BMC.BootMAC}
		if m.BMC.Redfish != nil {
			o.Machine.RedfishAddress = m.BMC.Redfish.Address
		}
		if m.BMC.IPMI != nil {
			o.Machine.IPMIAddress = m.BMC.IPMI.Address
		}
	}
	return o, m, err
}

// OpenBoot is the node's newest boot not finished ("" when none).
func OpenBoot(ctx context.Context, tx store.Tx, nodeID string) (string, error) {
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM metal_boots WHERE node_id = $1 AND finished_at IS NULL
		ORDER BY created_at DESC LIMIT 1`, nodeID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return id, err
}

// InFlightStarted lists operations in flight whose workflow was started
// more than grace ago, by node id after afterNodeID.
func InFlightStarted(ctx context.Context, tx store.Tx, afterNodeID string, grace time.Duration, limit int) ([]Pending, error) {
	return listPending(ctx, tx, `workflow_started_at < now() - make_interval(secs => $2) AND node_id > $3
		ORDER BY node_id LIMIT $1`, limit, grace.Seconds(), afterNodeID)
}

// Package metal is the bare-metal lifecycle as data: the operations an
// operator asks for, the provision state each is allowed from, the state a
// node is in while it runs (its step in flight is a separate field), where
// it ends, where a failure of it recovers to, and the default deadline of
// each in-flight state. The API checks a call against this table before
// anything changes, the workflow follows it, and docs/metal.md shows it.
// It adds no provision state: every step maps onto the domain model's.
package metal

import (
	"slices"
	"time"

	"github.com/better-compute/better-compute/core/nodes"
)

// Operation is a lifecycle operation on one node.
type Operation string

// The operations. Enroll creates the node (in enrolling) and is not run by
// the workflow; abort and power act on the workflow or the BMC.
const (
	Manage   Operation = "manage"
	Inspect  Operation = "inspect"
	Provide  Operation = "provide"
	Deploy   Operation = "deploy"
	Undeploy Operation = "undeploy"
	Rescue   Operation = "rescue"
	Unrescue Operation = "unrescue"
	Retire   Operation = "retire"
	Recover  Operation = "recover"
	Power    Operation = "power"
	// Retry runs a failed provisioning workflow again from its failed step
	// (workflows.retry; it is no metal.* method, so not in Operations).
	Retry Operation = "retry"
)

// Operations lists every operation the workflow runs.
var Operations = []Operation{Manage, Inspect, Provide, Deploy, Undeploy, Rescue, Unrescue, Retire, Recover, Power}

// Enum makes an input field of this type take only these values.
func (Operation) Enum() []string {
	out := make([]string, len(Operations))
	for i, o := range Operations {
		out[i] = string(o)
	}
	return out
}

// Requirement is a precondition beyond the provision state.
type Requirement string

// The requirements.
const (
	// NeedsManaged: the BMC was verified (manage succeeded).
	NeedsManaged Requirement = "managed"
	// NeedsInspected: an inspection recorded the hardware key.
	NeedsInspected Requirement = "inspected"
)

// Edge is one row of the lifecycle table.
type Edge struct {
	Operation Operation
	// From lists the stable states the operation may start in.
	From []nodes.ProvisionState
	// Requires lists preconditions checked with From.
	Requires []Requirement
	// During is the provision state while it runs; "" keeps the state it
	// started in (power).
	During nodes.ProvisionState
	// To is where it ends on success; "" is back where it started.
	To nodes.ProvisionState
	// RecoverTo is where metal.recover takes a node this operation failed
	// on: a state from which the machine is known again ("" is where the
	// operation started). A failed clean or release recovers to enrolling,
	// so the machine is cleaned again before it is ready.
	RecoverTo nodes.ProvisionState
	// Steps are the operation's steps in order, as the node's step field
	// shows them while they run.
	Steps []string
}

// Steps of the operations, as node_metal.step shows them.
const (
	StepVerifyBMC       = "verify-bmc"
	StepPowerOff        = "power-off"
	StepPowerOn         = "power-on"
	StepSetPower        = "set-power"
	StepInspectOOB      = "inspect-oob"
	StepBootRamdisk     = "boot-ramdisk"
	StepAwaitRamdisk    = "await-ramdisk"
	StepIngestInventory = "ingest-inventory"
	StepWipeDisks       = "wipe-disks"
	StepResetBIOS       = "reset-bios"
	StepAwaitRejoin     = "await-rejoin"
	StepBootDisk        = "boot-disk"
	StepRevokeIdentity  = "revoke-identities"
	StepEndBoot         = "end-boot"
	// StepProvision runs the operation's provisioning workflow
	// (core/provisioning): node_metal.step then shows the workflow's step
	// in flight by its name.
	StepProvision = "provision"
)

// Table is the lifecycle: one edge per operation.
var Table = []Edge{
	{Operation: Manage, From: []nodes.ProvisionState{nodes.Enrolling}, During: nodes.Enrolling, To: nodes.Enrolling,
		Steps: []string{StepVerifyBMC}},
	{Operation: Inspect, From: []nodes.ProvisionState{nodes.Enrolling, nodes.Ready}, Requires: []Requirement{NeedsManaged},
		During: nodes.Inspecting, Steps: []string{StepInspectOOB, StepBootRamdisk, StepAwaitRamdisk, StepIngestInventory, StepPowerOff}},
	{Operation: Provide, From: []nodes.ProvisionState{nodes.Enrolling}, Requires: []Requirement{NeedsManaged, NeedsInspected},
		During: nodes.Commissioning, To: nodes.Ready, RecoverTo: nodes.Enrolling,
		Steps: []string{StepResetBIOS, StepBootRamdisk, StepAwaitRamdisk, StepWipeDisks, StepPowerOff}},
	{Operation: Deploy, From: []nodes.ProvisionState{nodes.Ready}, During: nodes.Deploying, To: nodes.Deployed, RecoverTo: nodes.Ready,
		Steps: []string{StepProvision}},
	{Operation: Retry, From: []nodes.ProvisionState{nodes.Failed}, During: nodes.Deploying, To: nodes.Deployed, RecoverTo: nodes.Ready, Steps: []string{StepProvision}},
	{Operation: Undeploy, From: []nodes.ProvisionState{nodes.Deployed}, During: nodes.Releasing, To: nodes.Ready, RecoverTo: nodes.Enrolling,
		Steps: []string{StepPowerOff, StepBootRamdisk, StepAwaitRamdisk, StepWipeDisks, StepPowerOff}},
	{Operation: Rescue, From: []nodes.ProvisionState{nodes.Deployed}, During: nodes.Rescue, To: nodes.Rescue, RecoverTo: nodes.Deployed,
		Steps: []string{StepBootRamdisk, StepAwaitRamdisk}},
	{Operation: Unrescue, From: []nodes.ProvisionState{nodes.Rescue}, During: nodes.Rescue, To: nodes.Deployed, RecoverTo: nodes.Deployed,
		Steps: []string{StepPowerOff, StepEndBoot, StepBootDisk}},
	{Operation: Retire, From: []nodes.ProvisionState{nodes.Enrolling, nodes.Ready, nodes.Failed}, During: nodes.Retiring, To: nodes.Retired,
		Steps: []string{StepPowerOff, StepEndBoot, StepRevokeIdentity}},
	{Operation: Recover, From: []nodes.ProvisionState{nodes.Failed}, During: nodes.Failed,
		Steps: []string{StepVerifyBMC, StepPowerOff}},
	{Operation: Retry, From: []nodes.ProvisionState{nodes.Failed}, During: nodes.Deploying, To: nodes.Deployed, RecoverTo: nodes.Ready, Steps: []string{StepProvision}},
	{Operation: Power, From: []nodes.ProvisionState{nodes.Enrolling, nodes.Ready, nodes.Deployed, nodes.Rescue, nodes.Failed},
		Requires: []Requirement{NeedsManaged}, Steps: []string{StepSetPower}},
}

// EdgeOf is the table's row for op.
func EdgeOf(op Operation) (Edge, bool) {
	i := slices.IndexFunc(Table, func(e Edge) bool { return e.Operation == op })
	if i < 0 {
		return Edge{}, false
	}
	return Table[i], true
}

// Allowed lists the metal.* operations allowed from state (given the
// node's managed and inspected facts), in table order: INVALID_STATE's
// details. Retry is left out: it is workflows.retry's, and only a failure
// of a provisioning workflow allows it.
func Allowed(state nodes.ProvisionState, managed, inspected bool) []Operation {
	var out []Operation
	for _, e := range Table {
		if slices.Contains(Operations, e.Operation) && e.allows(state, managed, inspected) {
			out = append(out, e.Operation)
		}
	}
	return out
}

// Allows says whether op may start from state.
func Allows(op Operation, state nodes.ProvisionState, managed, inspected bool) bool {
	e, ok := EdgeOf(op)
	return ok && e.allows(state, managed, inspected)
}

func (e Edge) allows(state nodes.ProvisionState, managed, inspected bool) bool {
	if !slices.Contains(e.From, state) {
		return false
	}
	for _, r := range e.Requires {
		if (r == NeedsManaged && !managed) || (r == NeedsInspected && !inspected) {
			return false
		}
	}
	return true
}

// Target is where op ends when it succeeds from origin.
func (e Edge) Target(origin nodes.ProvisionState) nodes.ProvisionState {
	if e.To == "" {
		return origin
	}
	return e.To
}

// DuringFrom is the provision state while op runs from origin.
func (e Edge) DuringFrom(origin nodes.ProvisionState) nodes.ProvisionState {
	if e.During == "" {
		return origin
	}
	return e.During
}

// RecoveryFrom is where metal.recover takes a node that failed running this
// operation from origin.
func (e Edge) RecoveryFrom(origin nodes.ProvisionState) nodes.ProvisionState {
	if e.RecoverTo == "" {
		return origin
	}
	return e.RecoverTo
}

// DefaultDeadlines bound each in-flight state (MAAS uses 20 minutes for
// commissioning, 40 for deploying, 5 for releasing); past its deadline an
// operation fails with the reason and the step, so no node is ever stuck.
// Deployments configure them (tests shorten them).
var DefaultDeadlines = map[nodes.ProvisionState]time.Duration{
	nodes.Enrolling:     5 * time.Minute,
	nodes.Inspecting:    20 * time.Minute,
	nodes.Commissioning: 20 * time.Minute,
	nodes.Deploying:     40 * time.Minute,
	nodes.Releasing:     20 * time.Minute,
	nodes.Rescue:        20 * time.Minute,
	nodes.Retiring:      5 * time.Minute,
	nodes.Failed:        5 * time.Minute,
}

// PowerDeadline bounds a power operation in any state.
const PowerDeadline = 2 * time.Minute

// Failure reasons recorded in node_metal.last_error.reason.
const (
	ReasonAborted          = "aborted"
	ReasonDeadline         = "deadline"
	ReasonBMC              = "bmc"
	ReasonHardwareConflict = "hardwareKeyConflict"
	ReasonHardwareMismatch = "hardwareKeyMismatch"
	ReasonStepFailed       = "stepFailed"
	ReasonWorkflowLost     = "workflowLost"
	// ReasonStepTimeout: a provisioning step ran past its own timeout on
	// its last attempt.
	ReasonStepTimeout = "stepTimeout"
)

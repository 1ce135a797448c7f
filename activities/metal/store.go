package metal

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/nodes"
)

// Store is what the lifecycle's control-plane activities need from the
// database (store/metal implements it). Each method is one transaction.
// Every write that names an opSeq is fenced by it: when the node's
// node_metal.op_seq is no longer opSeq, or no operation is in flight, it
// changes nothing and answers ErrStale, so a retried or replayed activity of
// an operation that ended (or was superseded) can never touch the next one.
// A node of another tenant is ErrNotFound, never a different answer.
type Store interface {
	// Load reads a node's lifecycle as it stands.
	Load(ctx context.Context, tenantID, nodeID string) (Lifecycle, error)
	// MarkStarted records that the workflow of opSeq was started
	// (workflow_started_at), so the reconciler owes it nothing.
	MarkStarted(ctx context.Context, tenantID, nodeID string, opSeq int64) error
	// SetStep records the step in flight (node_metal.step) before it runs.
	SetStep(ctx context.Context, tenantID, nodeID string, opSeq int64, step string) error
	// Finish ends the operation successfully: the provision state becomes
	// f.State, the operation, step, deadline and abort request are cleared,
	// last_error is cleared, and the facts f carries are recorded. Finishing
	// an operation already finished with the same opSeq is ErrStale.
	Finish(ctx context.Context, f Finish) error
	// Fail ends the operation as failed: provision state failed, last_error
	// {operation, step, code, reason, message, at}, the operation cleared
	// (origin_state kept, so recover knows where to take the node).
	Fail(ctx context.Context, f Failure) error
	// SetPower records the power state read back from the BMC (the node's
	// power axis); it is not fenced, since a read-back is a fact whatever
	// the operation.
	SetPower(ctx context.Context, tenantID, nodeID string, power nodes.Power) error

	// Owed lists operations in flight whose workflow start is owed
	// (workflow_started_at NULL) for longer than grace, oldest first.
	Owed(ctx context.Context, grace time.Duration, limit int) ([]InFlight, error)
	// InFlight lists operations in flight whose workflow was started more
	// than grace ago, by node id after afterNodeID (a page).
	InFlight(ctx context.Context, afterNodeID string, grace time.Duration, limit int) ([]InFlight, error)

	// NewBoot creates the ramdisk boot (metal_boots row, id boot_…) of
	// opSeq with purpose, or answers the one that exists: it is created
	// once per (node, opSeq, purpose), so a retried step finds its boot.
	NewBoot(ctx context.Context, tenantID, nodeID string, opSeq int64, purpose string) (string, error)
	// SetBootSteps sets the steps the ramdisk is answered on its report
	// (metal_boots.steps).
	SetBootSteps(ctx context.Context, tenantID, bootID string, steps []protocol.RamdiskStep) error
	// BootStatus reads what a boot's ramdisk reported.
	BootStatus(ctx context.Context, tenantID, bootID string) (BootStatus, error)
	// CloseBoot marks the boot finished (finished_at): its token is refused
	// from then on. Closing a closed boot is a no-op.
	CloseBoot(ctx context.Context, tenantID, bootID string) error
	// IngestInspection ingests the inventory the boot reported into the
	// node (its devices and hardware key) and records it inspected. A
	// hardware key that is already another live node's ingests nothing and
	// answers that node in Conflict.
	IngestInspection(ctx context.Context, tenantID, nodeID string, opSeq int64, bootID string) (Ingest, error)
	// CheckRejoin compares the hardware key a deploy boot reported with the
	// node's.
	CheckRejoin(ctx context.Context, tenantID, nodeID, bootID string) (Rejoin, error)
	// RevokeIdentities revokes the node's agent identities and
	// certificates (retire).
	RevokeIdentities(ctx context.Context, tenantID, nodeID string, opSeq int64) error
}

// Errors a Store answers.
var (
	// ErrStale: the operation the write names is no longer in flight.
	ErrStale = errors.New("metal operation no longer in flight")
	// ErrNotFound: no such node (or boot) in the tenant.
	ErrNotFound = errors.New("metal node not found")
)

// Lifecycle is a node's lifecycle as Load reads it: node_metal, the node's
// provision state, and how its site reaches its BMC (without credentials).
type Lifecycle struct {
	TenantID string `json:"tenantId"`
	NodeID   string `json:"nodeId"`
	SiteID   string `json:"siteId"`
	// PoolID is the node's pool (search attributes).
	PoolID string               `json:"poolId,omitempty"`
	State  nodes.ProvisionState `json:"state"`
	Power  nodes.Power          `json:"power,omitempty"`
	// Operation is the operation in flight, "" when none.
	Operation coremetal.Operation `json:"operation"`
	OpSeq     int64               `json:"opSeq"`
	Step      string              `json:"step"`
	// Origin is the stable state the operation started from.
	Origin nodes.ProvisionState `json:"origin"`
	// OpArgs are the operation's arguments as the API stored them (power:
	// PowerArgs).
	OpArgs   json.RawMessage `json:"opArgs,omitempty"`
	Deadline time.Time       `json:"deadline"`
	// AbortRequested: metal.abort was called for this operation.
	AbortRequested bool `json:"abortRequested"`
	// WorkflowStarted: workflow_started_at is set.
	WorkflowStarted bool `json:"workflowStarted"`
	Managed         bool `json:"managed"`
	Inspected       bool `json:"inspected"`
	// LastError is the last failure (recover reads the operation that
	// failed from it), nil when none.
	LastError *LastError `json:"lastError,omitempty"`
	// The BMC as the site activities name it (workflows/metal.MachineRef
	// is built from these).
	RedfishAddress string            `json:"redfishAddress,omitempty"`
	IPMIAddress    string            `json:"ipmiAddress,omitempty"`
	Bindings       map[string]string `json:"bindings,omitempty"`
	BootMAC        string            `json:"bootMac,omitempty"`
	// OpenBoot is the node's latest boot not finished yet ("" when none):
	// a rescue's, which unrescue ends.
	OpenBoot string `json:"openBoot,omitempty"`
	// HardwareKey is the node's hardware key ("" until inspected).
	HardwareKey string `json:"hardwareKey,omitempty"`
}

// LastError is node_metal.last_error.
type LastError struct {
	Operation coremetal.Operation `json:"operation"`
	Step      string              `json:"step"`
	// Origin is the state the failed operation started from.
	Origin  nodes.ProvisionState `json:"origin,omitempty"`
	Code    string               `json:"code"`
	Reason  string               `json:"reason"`
	Message string               `json:"message"`
	At      time.Time            `json:"at"`
}

// PowerArgs are a power operation's op_args.
type PowerArgs struct {
	Action string `json:"action"`
}

// Finish is what Store.Finish records.
type Finish struct {
	TenantID string               `json:"tenantId"`
	NodeID   string               `json:"nodeId"`
	OpSeq    int64                `json:"opSeq"`
	State    nodes.ProvisionState `json:"state"`
	// Managed and Inspected set managed_at / inspected_at when true (never
	// clear them).
	Managed   bool `json:"managed,omitempty"`
	Inspected bool `json:"inspected,omitempty"`
	// Power is the power read back, "" to leave it.
	Power nodes.Power `json:"power,omitempty"`
	// WorkflowState ends the operation's provisioning workflow, if it has
	// one, in the same transaction: "" is succeeded; an abort that was safe
	// (no destructive step started) finishes back at the origin with
	// provisioning.WorkflowAborted.
	WorkflowState string `json:"workflowState,omitempty"`
}

// Failure is what Store.Fail records. Code is the API error code
// (e.g. CONFLICT, FAILED_PRECONDITION, DEADLINE_EXCEEDED); Reason one of
// core/metal's Reason* values.
type Failure struct {
	TenantID string `json:"tenantId"`
	NodeID   string `json:"nodeId"`
	OpSeq    int64  `json:"opSeq"`
	Step     string `json:"step"`
	Code     string `json:"code"`
	Reason   string `json:"reason"`
	Message  string `json:"message"`
	// WorkflowState ends the operation's provisioning workflow, if it has
	// one, in the same transaction: "" is failed (at Step, which a retry
	// runs again); provisioning.WorkflowAborted after an abort.
	WorkflowState string `json:"workflowState,omitempty"`
}

// InFlight is an operation in flight as the reconciler sees it.
type InFlight struct {
	MetalParams
	Operation coremetal.Operation `json:"operation"`
	Deadline  time.Time           `json:"deadline"`
	// OpArgs are the operation's op_args (a bulk run's nodes carry
	// BulkArgs there).
	OpArgs json.RawMessage `json:"opArgs,omitempty"`
}

// BootStatus is what a boot's ramdisk reported.
type BootStatus struct {
	// Reported: the ramdisk posted its inventory.
	Reported    bool   `json:"reported"`
	HardwareKey string `json:"hardwareKey,omitempty"`
	// Results are the results of its steps, as posted.
	Results  []protocol.RamdiskStepResult `json:"results,omitempty"`
	Finished bool                         `json:"finished"`
	// Joined: the installed system's agent joined with the boot's token
	// (metal_boots.joined_at); JoinError is why a join with it was
	// refused (another hardware key), "" when none was.
	Joined    bool   `json:"joined,omitempty"`
	JoinError string `json:"joinError,omitempty"`
}

// Ingest is what IngestInspection did: the hardware key recorded, or the
// node that already has it (nothing ingested).
type Ingest struct {
	HardwareKey    string `json:"hardwareKey"`
	ConflictNodeID string `json:"conflictNodeId,omitempty"`
}

// Rejoin compares the hardware key a re-joined ramdisk reported (Got) with
// the node's (Want).
type Rejoin struct {
	Match bool   `json:"match"`
	Want  string `json:"want"`
	Got   string `json:"got"`
}

package metal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	coremetal "github.com/better-compute/better-compute/core/metal"
	"github.com/better-compute/better-compute/core/nodes"
)

// Names of the control-plane activities of the lifecycle, the bulk run and
// the reconciler, and the reconciler's workflow and schedule. Persisted in
// histories and schedules: they never change.
const (
	ActivityLoad             = "MetalLoad"
	ActivityMarkStarted      = "MetalMarkStarted"
	ActivitySetStep          = "MetalSetStep"
	ActivityFinish           = "MetalFinish"
	ActivityFail             = "MetalFail"
	ActivitySetPower         = "MetalSetPower"
	ActivityNewBoot          = "MetalNewBoot"
	ActivityBootProgress     = "MetalBootProgress"
	ActivityCloseBoot        = "MetalCloseBoot"
	ActivityIngestInspection = "MetalIngestInspection"
	ActivityCheckRejoin      = "MetalCheckRejoin"
	ActivityRevokeIdentities = "MetalRevokeIdentities"
	ActivityStartNode        = "MetalStartNode"
	ActivityAwaitOutcome     = "MetalAwaitOutcome"
	ActivityReconcile        = "MetalReconcile"

	// The reconciler: a Temporal schedule runs ReconcileMetalWorkflow
	// every minute, whose one activity starts owed lifecycle workflows,
	// starts again those of operations in flight whose workflow is not
	// running, and fails those past their deadline whose workflow is gone.
	ReconcileMetalWorkflowName = "ReconcileMetalWorkflow"
	ReconcileMetalScheduleID   = "metal-reconciler"
)

// Application error types the control-plane activities fail with, so the
// workflow tells a fenced write from a failure.
const (
	// ErrTypeStale: the operation is no longer in flight (Store.ErrStale);
	// the workflow ends without writing anything more.
	ErrTypeStale = "MetalStale"
)

// Metal is the control-plane side of the lifecycle: each activity is one
// Store transaction, idempotent, so a retry after a worker crash is
// harmless. Temporal and TaskQueue start lifecycle workflows (Reconcile,
// StartNode).
type Metal struct {
	Store Store
	// Provision is the store of the provisioning steps; nil uses Store
	// when it implements ProvisionStore (DBStore does).
	Provision ProvisionStore
	Temporal  client.Client
	TaskQueue string
	// OwedGrace is how long a start may be owed before the reconciler
	// makes it (default 10 s): the API starts it right after its commit.
	OwedGrace time.Duration
}

// storeErr maps the Store's sentinel errors onto non-retryable application
// errors the workflow reads by type; anything else is retried.
func storeErr(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrStale):
		return temporal.NewNonRetryableApplicationError(what+": "+err.Error(), ErrTypeStale, nil)
	case errors.Is(err, ErrNotFound):
		return temporal.NewNonRetryableApplicationError(what+": "+err.Error(), string(core.CodeNotFound), nil)
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
}

// LoadLifecycle reads the node's lifecycle.
func (m *Metal) LoadLifecycle(ctx context.Context, tenantID, nodeID string) (Lifecycle, error) {
	lc, err := m.Store.Load(ctx, tenantID, nodeID)
	return lc, storeErr("load the lifecycle of "+nodeID, err)
}

// MarkLifecycleStarted records that the operation's workflow runs.
func (m *Metal) MarkLifecycleStarted(ctx context.Context, p MetalParams) error {
	return storeErr("mark the workflow started", m.Store.MarkStarted(ctx, p.TenantID, p.NodeID, p.OpSeq))
}

// SetStep records the step in flight.
func (m *Metal) SetStep(ctx context.Context, p MetalParams, step string) error {
	return storeErr("set step "+step, m.Store.SetStep(ctx, p.TenantID, p.NodeID, p.OpSeq, step))
}

// FinishOperation ends the operation successfully.
func (m *Metal) FinishOperation(ctx context.Context, f Finish) error {
	return storeErr("finish the operation", m.Store.Finish(ctx, f))
}

// FailOperation ends the operation as failed.
func (m *Metal) FailOperation(ctx context.Context, f Failure) error {
	return storeErr("fail the operation", m.Store.Fail(ctx, f))
}

// RecordPower records a power read-back.
func (m *Metal) RecordPower(ctx context.Context, tenantID, nodeID string, power nodes.Power) error {
	return storeErr("record the power state", m.Store.SetPower(ctx, tenantID, nodeID, NormalPower(string(power))))
}

// NormalPower maps a driver's power state onto the node's power axis.
func NormalPower(p string) nodes.Power {
	switch nodes.Power(p) {
	case nodes.PowerOn, nodes.PowerOff:
		return nodes.Power(p)
	default:
		return nodes.PowerUnknown
	}
}

// Ramdisk boot purposes (metal_boots.purpose).
const (
	PurposeInspect = "inspect"
	PurposeClean   = "clean"
	PurposeDeploy  = "deploy"
	PurposeRescue  = "rescue"
)

// RamdiskSteps are the steps a boot's ramdisk is answered on its report,
// by purpose: a clean wipes the disks; a rescue stays up; an inspection
// and a deploy run nothing more (the workflow powers an inspected machine
// off through its BMC; a deployed one stays up).
func RamdiskSteps(purpose string) []protocol.RamdiskStep {
	switch purpose {
	case PurposeClean:
		return []protocol.RamdiskStep{{Name: protocol.StepWipeDisks}}
	case PurposeRescue:
		return []protocol.RamdiskStep{{Name: protocol.StepWait}}
	default:
		return []protocol.RamdiskStep{}
	}
}

// NewBoot creates the operation's boot of purpose (once: a retry finds
// it) and sets the steps its ramdisk gets, and answers its id.
func (m *Metal) NewBoot(ctx context.Context, p MetalParams, purpose string) (string, error) {
	id, err := m.Store.NewBoot(ctx, p.TenantID, p.NodeID, p.OpSeq, purpose)
	if err != nil {
		return "", storeErr("create the "+purpose+" boot", err)
	}
	if err := m.Store.SetBootSteps(ctx, p.TenantID, id, RamdiskSteps(purpose)); err != nil {
		return "", storeErr("set the steps of boot "+id, err)
	}
	return id, nil
}

// BootProgress is how far a boot got, as the workflow waits on it.
type BootProgress struct {
	// Reported: the ramdisk posted its inventory.
	Reported bool `json:"reported"`
	// Done: every step the boot was given has a result.
	Done bool `json:"done"`
	// Failed is the message of a step that failed ("" when none did).
	Failed string `json:"failed,omitempty"`
	// Joined and JoinError are BootStatus's: the installed system's agent
	// re-joined with the boot's token, or why its join was refused.
	Joined    bool   `json:"joined,omitempty"`
	JoinError string `json:"joinError,omitempty"`
	// Results are the results posted so far, in order.
	Results []protocol.RamdiskStepResult `json:"results,omitempty"`
}

// BootProgress reads what the boot's ramdisk reported so far.
func (m *Metal) BootProgress(ctx context.Context, tenantID, bootID, purpose string) (BootProgress, error) {
	st, err := m.Store.BootStatus(ctx, tenantID, bootID)
	if err != nil {
		return BootProgress{}, storeErr("read boot "+bootID, err)
	}
	out := BootProgress{Reported: st.Reported, Done: st.Reported, Joined: st.Joined, JoinError: st.JoinError, Results: st.Results}
	results := map[string]protocol.RamdiskStepResult{}
	for _, r := range st.Results {
		results[r.Name] = r
		if !r.OK && out.Failed == "" {
			out.Failed = fmt.Sprintf("ramdisk step %s failed: %s", r.Name, r.Message)
		}
	}
	for _, s := range RamdiskSteps(purpose) {
		if s.Name == protocol.StepWait || s.Name == protocol.StepPowerOff {
			continue // no result comes back from a step that does not end
		}
		if _, ok := results[s.Name]; !ok {
			out.Done = false
		}
	}
	return out, nil
}

// CloseBoot finishes a boot (its token is refused from then on).
func (m *Metal) CloseBoot(ctx context.Context, tenantID, bootID string) error {
	return storeErr("close boot "+bootID, m.Store.CloseBoot(ctx, tenantID, bootID))
}

// IngestInspection ingests the boot's inventory into the node.
func (m *Metal) IngestInspection(ctx context.Context, p MetalParams, bootID string) (Ingest, error) {
	in, err := m.Store.IngestInspection(ctx, p.TenantID, p.NodeID, p.OpSeq, bootID)
	return in, storeErr("ingest the inventory of boot "+bootID, err)
}

// CheckRejoin compares a deploy boot's hardware key with the node's.
func (m *Metal) CheckRejoin(ctx context.Context, tenantID, nodeID, bootID string) (Rejoin, error) {
	r, err := m.Store.CheckRejoin(ctx, tenantID, nodeID, bootID)
	return r, storeErr("check the re-join of boot "+bootID, err)
}

// RevokeIdentities revokes the node's identities.
func (m *Metal) RevokeIdentities(ctx context.Context, p MetalParams) error {
	return storeErr("revoke the identities of "+p.NodeID, m.Store.RevokeIdentities(ctx, p.TenantID, p.NodeID, p.OpSeq))
}

// StartBulkNode starts a node's lifecycle workflow for a bulk run and records
// the start.
func (m *Metal) StartBulkNode(ctx context.Context, p MetalParams) error {
	if err := StartLifecycle(ctx, m.Temporal, m.TaskQueue, p); err != nil {
		return fmt.Errorf("start the lifecycle of %s: %w", p.NodeID, err)
	}
	return storeErr("mark the workflow started", m.Store.MarkStarted(ctx, p.TenantID, p.NodeID, p.OpSeq))
}

// outcomePoll is how often AwaitOutcome reads the row.
const outcomePoll = 2 * time.Second

// AwaitOutcome waits until the node's operation p is no longer in flight
// and answers where it ended; it heartbeats while it waits, so a worker
// that dies has it retried elsewhere.
func (m *Metal) AwaitOutcome(ctx context.Context, p MetalParams) (BulkResult, error) {
	tick := time.NewTicker(outcomePoll)
	defer tick.Stop()
	for {
		lc, err := m.Store.Load(ctx, p.TenantID, p.NodeID)
		if err != nil {
			return BulkResult{}, storeErr("load the lifecycle of "+p.NodeID, err)
		}
		if lc.Operation == "" || lc.OpSeq != p.OpSeq {
			out := BulkResult{NodeID: p.NodeID, State: string(lc.State)}
			if lc.State == nodes.Failed && lc.LastError != nil {
				out.Error = lc.LastError.Reason + ": " + lc.LastError.Message
			}
			return out, nil
		}
		activity.RecordHeartbeat(ctx, lc.Step)
		select {
		case <-ctx.Done():
			return BulkResult{}, ctx.Err()
		case <-tick.C:
		}
	}
}

// PowerAction reads a power operation's action from its op_args.
func PowerAction(args json.RawMessage) (string, error) {
	var a PowerArgs
	if len(args) > 0 {
		if err := json.Unmarshal(args, &a); err != nil {
			return "", fmt.Errorf("power arguments: %w", err)
		}
	}
	if a.Action == "" {
		return "", errors.New("power arguments: no action")
	}
	return a.Action, nil
}

// RecoveryTarget is where recover takes a node that failed as last says.
func RecoveryTarget(last *LastError) nodes.ProvisionState {
	if last == nil {
		return nodes.Enrolling
	}
	e, ok := coremetal.EdgeOf(last.Operation)
	if !ok {
		return nodes.Enrolling
	}
	if to := e.RecoveryFrom(last.Origin); to != "" && to != nodes.Failed {
		return to
	}
	return nodes.Enrolling
}

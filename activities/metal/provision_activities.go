package metal

import (
	"context"
	"errors"

	"github.com/better-compute/better-compute/agent/protocol"
)

// Names of the provisioning activities of the lifecycle (the control-plane
// side of a deploy's persisted steps). Persisted in histories: they never
// change.
const (
	ActivityLoadWorkflow       = "MetalLoadWorkflow"
	ActivityBeginStep          = "MetalBeginStep"
	ActivityEndStep            = "MetalEndStep"
	ActivityCheckImage         = "MetalCheckImage"
	ActivityAccept             = "MetalAccept"
	ActivityEnqueueNodeCommand = "MetalEnqueueNodeCommand"
	ActivityNodeCommand        = "MetalNodeCommand"
	ActivityHandRamdiskStep    = "MetalHandRamdiskStep"
)

// errNoProvisionStore: the worker was built without a ProvisionStore.
var errNoProvisionStore = errors.New("metal: this worker has no provisioning store")

// provision is the store of the provisioning steps: Provision when set,
// else Store when it implements ProvisionStore (DBStore does).
func (m *Metal) provision() (ProvisionStore, error) {
	if m.Provision != nil {
		return m.Provision, nil
	}
	if ps, ok := m.Store.(ProvisionStore); ok {
		return ps, nil
	}
	return nil, errNoProvisionStore
}

// StepRef names one step of one provisioning workflow under the operation
// that runs it.
type StepRef struct {
	TenantID   string `json:"tenantId"`
	WorkflowID string `json:"workflowId"`
	OpSeq      int64  `json:"opSeq"`
	Index      int    `json:"index"`
}

// NodeCommandRequest is ActivityEnqueueNodeCommand's input.
type NodeCommandRequest struct {
	TenantID string         `json:"tenantId"`
	NodeID   string         `json:"nodeId"`
	Key      string         `json:"key"`
	Kind     string         `json:"kind"`
	Args     map[string]any `json:"args,omitempty"`
}

// LoadWorkflow reads the provisioning workflow the operation p runs.
func (m *Metal) LoadWorkflow(ctx context.Context, p MetalParams) (WorkflowRun, error) {
	ps, err := m.provision()
	if err != nil {
		return WorkflowRun{}, err
	}
	wf, err := ps.LoadWorkflow(ctx, p.TenantID, p.NodeID, p.OpSeq)
	return wf, storeErr("load the provisioning workflow of "+p.NodeID, err)
}

// BeginStep starts an attempt of a step (or answers that a pause holds it).
func (m *Metal) BeginStep(ctx context.Context, r StepRef) (StepStart, error) {
	ps, err := m.provision()
	if err != nil {
		return StepStart{}, err
	}
	st, err := ps.BeginStep(ctx, r.TenantID, r.WorkflowID, r.OpSeq, r.Index)
	return st, storeErr("begin a step of "+r.WorkflowID, err)
}

// EndStep records an attempt's outcome.
func (m *Metal) EndStep(ctx context.Context, r StepRef, o StepOutcome) error {
	ps, err := m.provision()
	if err != nil {
		return err
	}
	return storeErr("end a step of "+r.WorkflowID, ps.EndStep(ctx, r.TenantID, r.WorkflowID, r.OpSeq, r.Index, o))
}

// CheckImage answers why the workflow's image may not be deployed ("" when
// it may).
func (m *Metal) CheckImage(ctx context.Context, tenantID, workflowID string) (string, error) {
	ps, err := m.provision()
	if err != nil {
		return "", err
	}
	why, err := ps.CheckImage(ctx, tenantID, workflowID)
	return why, storeErr("check the image of "+workflowID, err)
}

// Accept answers the acceptance checks of the workflow that fail.
func (m *Metal) Accept(ctx context.Context, tenantID, workflowID string) ([]string, error) {
	ps, err := m.provision()
	if err != nil {
		return nil, err
	}
	failures, err := ps.Accept(ctx, tenantID, workflowID)
	return failures, storeErr("run the acceptance checks of "+workflowID, err)
}

// EnqueueNodeCommand queues a command to the node's agent, once per key.
func (m *Metal) EnqueueNodeCommand(ctx context.Context, r NodeCommandRequest) (string, error) {
	ps, err := m.provision()
	if err != nil {
		return "", err
	}
	id, err := ps.EnqueueNodeCommand(ctx, r.TenantID, r.NodeID, r.Key, r.Kind, r.Args)
	return id, storeErr("queue a command to "+r.NodeID, err)
}

// NodeCommand reads a node command's outcome.
func (m *Metal) NodeCommand(ctx context.Context, tenantID, commandID string) (CommandOutcome, error) {
	ps, err := m.provision()
	if err != nil {
		return CommandOutcome{}, err
	}
	out, err := ps.NodeCommand(ctx, tenantID, commandID)
	return out, storeErr("read command "+commandID, err)
}

// HandRamdiskStep gives the boot's ramdisk one step to run next (the
// results of the steps before it are cleared, so the step's result is the
// only one the workflow then reads).
func (m *Metal) HandRamdiskStep(ctx context.Context, tenantID, bootID string, step protocol.RamdiskStep) error {
	return storeErr("hand step "+step.Name+" to boot "+bootID,
		m.Store.SetBootSteps(ctx, tenantID, bootID, []protocol.RamdiskStep{step}))
}

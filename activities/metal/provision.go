package metal

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/core/provisioning"
)

// SignalWorkflowChanged tells the lifecycle workflow that its provisioning
// workflow's row changed (a pause requested or lifted): like boot-reported
// it only shortens a wait, since the run also reads the row.
const SignalWorkflowChanged = "workflow-changed"

// ProvisionStore is what the lifecycle's provisioning steps need from the
// database (store/workflows implements it, through DBStore). Each method is
// one transaction; every write is fenced by opSeq as Store's are (ErrStale
// once the operation is no longer in flight).
type ProvisionStore interface {
	// LoadWorkflow reads the provisioning workflow the node's operation
	// opSeq runs (a deploy's, or the one a retry resumes): its context and
	// its steps with their states. ErrNotFound when the operation has none.
	LoadWorkflow(ctx context.Context, tenantID, nodeID string, opSeq int64) (WorkflowRun, error)
	// BeginStep starts an attempt of step index. When a pause is requested
	// it changes nothing but the workflow's state (paused, paused_at) and
	// answers Paused; otherwise the step is running (attempts + 1,
	// started_at on the first), the workflow running at that step, and
	// node_metal.step the step's name. It answers the operation's deadline
	// as it stands (a resume pushes it by the time spent paused).
	BeginStep(ctx context.Context, tenantID, workflowID string, opSeq int64, index int) (StepStart, error)
	// EndStep records an attempt's outcome: OK ends the step succeeded;
	// a failure with Final ends the step failed (its output and error
	// kept); a failure that is not final keeps the step running and
	// records the attempt's error for the next attempt to replace.
	EndStep(ctx context.Context, tenantID, workflowID string, opSeq int64, index int, o StepOutcome) error
	// CheckImage re-reads the workflow's image: "" when it is deployable
	// as the workflow pinned it (same digest, available, verified when
	// required), else why not.
	CheckImage(ctx context.Context, tenantID, workflowID string) (string, error)
	// Accept runs the workflow's acceptance checks on the node's latest
	// inventory: the failures, none when all hold.
	Accept(ctx context.Context, tenantID, workflowID string) ([]string, error)
	// EnqueueNodeCommand queues a command of kind with args to the node's
	// agent once per key (a retried activity finds its command) and
	// answers its id.
	EnqueueNodeCommand(ctx context.Context, tenantID, nodeID, key, kind string, args map[string]any) (string, error)
	// NodeCommand reads a command's outcome.
	NodeCommand(ctx context.Context, tenantID, commandID string) (CommandOutcome, error)
}

// WorkflowRun is a provisioning workflow as the lifecycle runs it.
type WorkflowRun struct {
	ID       string               `json:"id"`
	TenantID string               `json:"tenantId"`
	NodeID   string               `json:"nodeId"`
	State    string               `json:"state"`
	Context  provisioning.Context `json:"context"`
	Steps    []StepRun            `json:"steps"`
	// PauseRequested: workflows.pause was called and not resumed.
	PauseRequested bool `json:"pauseRequested"`
}

// StepRun is one persisted step and how far it got.
type StepRun struct {
	provisioning.Step
	State    string `json:"state"`
	Attempts int    `json:"attempts"`
	// Output is the last attempt's output (a site's or ramdisk's message,
	// a command's stdout), at most provisioning.MaxOutputBytes.
	Output string `json:"output,omitempty"`
	Error  string `json:"error,omitempty"`
}

// StepStart answers BeginStep.
type StepStart struct {
	// Paused: a pause was requested; the step did not start.
	Paused  bool `json:"paused"`
	Attempt int  `json:"attempt"`
	// Deadline is the operation's deadline as the row holds it.
	Deadline time.Time `json:"deadline"`
}

// StepOutcome is one attempt's outcome.
type StepOutcome struct {
	OK     bool   `json:"ok"`
	Final  bool   `json:"final"`
	Output string `json:"output,omitempty"`
	Error  string `json:"error,omitempty"`
	// Reason is the failure's reason (core/metal Reason*, or
	// ReasonStepTimeout).
	Reason string `json:"reason,omitempty"`
}

// CommandOutcome is a node command's state as a node step awaits it.
type CommandOutcome struct {
	Done   bool   `json:"done"`
	OK     bool   `json:"ok"`
	Output string `json:"output,omitempty"`
	Error  string `json:"error,omitempty"`
}

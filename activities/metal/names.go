// Package metal holds the metal lifecycle's control-plane activities (the
// database facts of each step) and the domain's Temporal contract, which
// the API, the agent gateway and the workflow share: the workflow's name,
// id, input, its update and signal names. They are persisted in histories,
// so they never change.
package metal

// Names of the lifecycle workflow, its update and its signal.
const (
	// MetalWorkflowName runs one operation (node_metal.op_seq) on one
	// node; a node runs at most one at a time, under MetalWorkflowID.
	MetalWorkflowName = "MetalLifecycleWorkflow"
	// UpdateAbort stops the operation in flight: the workflow cancels its
	// step, powers the machine off where it can, and fails the node with
	// reason aborted. It answers once the node is failed.
	UpdateAbort = "abort"
	// SignalBootReported tells the workflow that a ramdisk boot
	// (metal_boots row) reported or posted results, so a wait ends
	// without waiting for its next poll. The signal is an optimisation:
	// the workflow also polls the row, so a lost signal delays, never
	// strands.
	SignalBootReported = "boot-reported"
	// QueryState answers the operation's progress (the workflow's view).
	QueryState = "state"
)

// MetalWorkflowID is the lifecycle workflow's id for a node.
func MetalWorkflowID(nodeID string) string { return nodeID + "/metal" }

// MetalParams starts a MetalLifecycleWorkflow: the node and the operation
// it serves (its op_seq). Everything else (the operation, its arguments,
// the deadline, the BMC) the workflow reads from the database, so a start
// that is retried or replayed cannot run a different operation.
type MetalParams struct {
	TenantID string `json:"tenantId"`
	NodeID   string `json:"nodeId"`
	OpSeq    int64  `json:"opSeq"`
}

// BootReported is SignalBootReported's payload.
type BootReported struct {
	BootID string `json:"bootId"`
}

package metal

// MetalBulkWorkflowName runs one lifecycle operation over many nodes with
// at most Concurrency in flight: the API begins each node's operation in
// the database (its op_seq) and starts this workflow with them; it starts
// each node's lifecycle workflow (StartLifecycle), waits for it to end, and
// answers per-node results. Its id is BulkWorkflowID. Persisted in
// histories: it never changes.
const MetalBulkWorkflowName = "MetalBulkWorkflow"

// BulkWorkflowID is a bulk run's workflow id: the pool and the API's
// request id, so a retried call finds the same run.
func BulkWorkflowID(poolID, requestID string) string { return poolID + "/metal-bulk/" + requestID }

// BulkArgs are what the API adds to the op_args of each node a bulk run
// serves: the run's workflow id. The run starts those nodes' workflows as
// its concurrency allows, so the reconciler leaves a node whose bulk run is
// still running alone (it would break the bound) and starts it only once
// that run is gone.
type BulkArgs struct {
	BulkID string `json:"bulkId,omitempty"`
}

// BulkNode is one node of a bulk run: the operation the API began on it.
type BulkNode struct {
	NodeID string `json:"nodeId"`
	OpSeq  int64  `json:"opSeq"`
}

// BulkParams starts a MetalBulkWorkflow.
type BulkParams struct {
	TenantID    string     `json:"tenantId"`
	PoolID      string     `json:"poolId"`
	Operation   string     `json:"operation"`
	Nodes       []BulkNode `json:"nodes"`
	Concurrency int        `json:"concurrency"`
}

// BulkResult is one node's outcome: the provision state its operation
// ended in, and the failure's message when it failed.
type BulkResult struct {
	NodeID string `json:"nodeId"`
	State  string `json:"state"`
	Error  string `json:"error,omitempty"`
}

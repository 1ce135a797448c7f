package metal

// Outcomes of a lifecycle run.
const (
	// OutcomeFinished: the operation reached its target state.
	OutcomeFinished = "finished"
	// OutcomeFailed: the node is failed (Reason says why).
	OutcomeFailed = "failed"
	// OutcomeStale: the run served an operation no longer in flight (a
	// duplicate or late start) and changed nothing.
	OutcomeStale = "stale"
)

// LifecycleResult is how a MetalLifecycleWorkflow run ended, and what the
// abort update answers: the provision state it left the node in, the power
// read back (a power operation's answer), and for a failure its reason
// (core/metal Reason*), step and message.
type LifecycleResult struct {
	Outcome string `json:"outcome"`
	State   string `json:"state,omitempty"`
	Power   string `json:"power,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Step    string `json:"step,omitempty"`
	Message string `json:"message,omitempty"`
}

// LifecycleState answers QueryState: the operation the run serves, the
// step in flight, the ramdisk boot it waits on, and whether it is being
// aborted.
type LifecycleState struct {
	Operation string `json:"operation"`
	OpSeq     int64  `json:"opSeq"`
	Step      string `json:"step"`
	BootID    string `json:"bootId,omitempty"`
	Aborting  bool   `json:"aborting,omitempty"`
	Done      bool   `json:"done,omitempty"`
}

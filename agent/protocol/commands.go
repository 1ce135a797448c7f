package protocol

// CommandKind is what a node command does.
type CommandKind string

// Command kinds.
const (
	CommandExec             CommandKind = "exec"
	CommandCDIExpose        CommandKind = "cdi.expose"
	CommandCDIWithdraw      CommandKind = "cdi.withdraw"
	CommandInventoryRefresh CommandKind = "inventory.refresh"
	CommandReboot           CommandKind = "reboot"
)

// CommandKinds are every kind.
var CommandKinds = []CommandKind{CommandExec, CommandCDIExpose, CommandCDIWithdraw, CommandInventoryRefresh,
	CommandReboot}

// CommandState is where a node command is in its life; a result frame
// carries one of the last three of the agent's (succeeded, failed,
// skipped).
type CommandState string

// Command states.
const (
	CommandQueued    CommandState = "queued"
	CommandDelivered CommandState = "delivered"
	CommandRunning   CommandState = "running"
	CommandSucceeded CommandState = "succeeded"
	CommandFailed    CommandState = "failed"
	CommandSkipped   CommandState = "skipped"
	CommandCancelled CommandState = "cancelled"
	CommandExpired   CommandState = "expired"
)

// CommandStates are every state.
var CommandStates = []CommandState{CommandQueued, CommandDelivered, CommandRunning, CommandSucceeded,
	CommandFailed, CommandSkipped, CommandCancelled, CommandExpired}

// Enum lists every kind, so an input field of this type takes only these.
func (CommandKind) Enum() []string { return names(CommandKinds) }

// Enum lists every state, so an input field of this type takes only these.
func (CommandState) Enum() []string { return names(CommandStates) }

func names[T ~string](values []T) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = string(v)
	}
	return out
}

package protocol

import "strconv"

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

// DefaultCDIKind is the CDI kind of a cdi.expose command whose args name
// none.
const DefaultCDIKind = "nvidia.com/gpu"

// CDIDevice is the fully qualified name ("<kind>=<name>") a container
// runtime is given for the i-th device of a reservation's cdi.expose spec:
// the agent names its devices "<reservationId>-<i>", in the order of the
// command's devices, and the API tells the reservation's user the same
// names.
func CDIDevice(kind, reservationID string, i int) string {
	if kind == "" {
		kind = DefaultCDIKind
	}
	return kind + "=" + CDIDeviceName(reservationID, i)
}

// CDIDeviceName is the i-th device's name within the spec.
func CDIDeviceName(reservationID string, i int) string {
	return reservationID + "-" + strconv.Itoa(i)
}

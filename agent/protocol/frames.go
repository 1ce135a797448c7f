package protocol

import (
	"encoding/json"
	"fmt"

	"github.com/better-compute/better-compute/agent/nodespec"
)

// FrameType names a session frame: every frame is a JSON object on its own
// line whose "type" is one of these.
type FrameType string

// Agent → server frames.
const (
	FrameHello     FrameType = "hello"
	FrameHeartbeat FrameType = "heartbeat"
	FrameInventory FrameType = "inventory"
	FrameResult    FrameType = "result"
	FrameObserved  FrameType = "observed"
)

// Server → agent frames.
const (
	FrameWelcome FrameType = "welcome"
	FrameCommand FrameType = "command"
	FrameSpec    FrameType = "spec"
	FrameCancel  FrameType = "cancel"
)

// MaxFrame bounds one frame's line; an inventory document is the largest.
const MaxFrame = 16 << 20

// Header is what every frame has: a receiver reads it first to know which
// frame type to decode the line into.
type Header struct {
	Type FrameType `json:"type"`
}

// Hello opens a session.
type Hello struct {
	Type               FrameType `json:"type"`
	AgentVersion       string    `json:"agentVersion"`
	LastExecutedSeq    int64     `json:"lastExecutedSeq"`
	ObservedGeneration int64     `json:"observedGeneration"`
	InventoryDigest    string    `json:"inventoryDigest"`
	// Clock is the agent's clock, epoch ms.
	Clock int64 `json:"clock"`
}

// Heartbeat renews the session's liveness lease.
type Heartbeat struct {
	Type  FrameType `json:"type"`
	Clock int64     `json:"clock"`
}

// Inventory carries a NodeInventory v1 document.
type Inventory struct {
	Type     FrameType       `json:"type"`
	Document json.RawMessage `json:"document"`
}

// Result is a command's outcome.
type Result struct {
	Type      FrameType    `json:"type"`
	Seq       int64        `json:"seq"`
	State     CommandState `json:"state"`
	ExitCode  *int         `json:"exitCode,omitempty"`
	Stdout    string       `json:"stdout"`
	Stderr    string       `json:"stderr"`
	Error     string       `json:"error"`
	Truncated bool         `json:"truncated"`
}

// Observed is the NodeSpec generation the agent converged on.
type Observed struct {
	Type       FrameType `json:"type"`
	Generation int64     `json:"generation"`
}

// Welcome answers hello.
type Welcome struct {
	Type             FrameType `json:"type"`
	NodeID           string    `json:"nodeId"`
	Epoch            int64     `json:"epoch"`
	HeartbeatSeconds int       `json:"heartbeatSeconds"`
	LeaseSeconds     int       `json:"leaseSeconds"`
	InventoryDigest  string    `json:"inventoryDigest"`
}

// Command is one node command to run.
type Command struct {
	Type FrameType       `json:"type"`
	Seq  int64           `json:"seq"`
	ID   string          `json:"id"`
	Kind CommandKind     `json:"kind"`
	Args json.RawMessage `json:"args"`
	// NotBefore and NotAfter are epoch ms; 0 is none.
	NotBefore     int64 `json:"notBefore,omitempty"`
	NotAfter      int64 `json:"notAfter,omitempty"`
	MinGeneration int64 `json:"minGeneration,omitempty"`
}

// Cancel stops a delivered command.
type Cancel struct {
	Type FrameType `json:"type"`
	Seq  int64     `json:"seq"`
}

// Spec is the node's desired state at a generation.
type Spec struct {
	Type       FrameType     `json:"type"`
	Generation int64         `json:"generation"`
	Spec       nodespec.Spec `json:"spec"`
}

// DecodeAgentFrame reads one line the agent sent: a Hello, Heartbeat,
// Inventory, Result, Observed or Instances, or, for a type this side does not know, the
// Header alone (receivers log and skip it, so that either end may be newer).
func DecodeAgentFrame(line []byte) (any, error) {
	var h Header
	if err := json.Unmarshal(line, &h); err != nil {
		return nil, fmt.Errorf("frame: %w", err)
	}
	switch h.Type {
	case FrameHello:
		return decodeAs[Hello](line)
	case FrameHeartbeat:
		return decodeAs[Heartbeat](line)
	case FrameInventory:
		return decodeAs[Inventory](line)
	case FrameResult:
		return decodeAs[Result](line)
	case FrameObserved:
		return decodeAs[Observed](line)
	case FrameInstances:
		return decodeAs[Instances](line)
	}
	return h, nil
}

// DecodeServerFrame reads one line the server sent: a Welcome, Command,
// Cancel, Spec or Tunnel, or the Header alone for a type this side does not know.
func DecodeServerFrame(line []byte) (any, error) {
	var h Header
	if err := json.Unmarshal(line, &h); err != nil {
		return nil, fmt.Errorf("frame: %w", err)
	}
	switch h.Type {
	case FrameWelcome:
		return decodeAs[Welcome](line)
	case FrameCommand:
		return decodeAs[Command](line)
	case FrameCancel:
		return decodeAs[Cancel](line)
	case FrameSpec:
		return decodeAs[Spec](line)
	case FrameTunnel:
		return decodeAs[Tunnel](line)
	}
	return h, nil
}

func decodeAs[F any](line []byte) (any, error) {
	var f F
	if err := json.Unmarshal(line, &f); err != nil {
		return nil, fmt.Errorf("%T frame: %w", f, err)
	}
	return f, nil
}

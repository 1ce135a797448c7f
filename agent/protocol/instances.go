package protocol

// Paths of the agent listener that serve a node's instances, under the
// node's mutual-TLS identity: the gateway answers only for an instance
// placed on the calling node.
const (
	// InstanceImagePath + "<instanceId>" serves the instance's image bytes
	// (GET, with range requests), as the site's image endpoint does.
	InstanceImagePath = "/agent/v1/instances/image/"
	// InstanceUserDataPath + "<instanceId>" answers the instance's user
	// data (GET), a secret:// reference resolved at that moment; 404 when
	// the instance has none.
	InstanceUserDataPath = "/agent/v1/instances/user-data/"
	// InstanceEnvPath + "<instanceId>" answers the instance's environment
	// (GET): a JSON object of names to values, secret:// references
	// resolved at that moment.
	InstanceEnvPath = "/agent/v1/instances/env/"
)

// FrameInstances (agent → server) reports the observed state of the
// node's instances: after every hello the whole list (Full), then each
// change as it happens.
const FrameInstances FrameType = "instances"

// Instance states as the agent observes them.
const (
	InstanceCreating = "creating" // fetching the image, unpacking, booting
	InstanceRunning  = "running"
	InstanceStopped  = "stopped"
	InstanceFailed   = "failed" // Error says why; the agent retries on the next spec
)

// InstanceStatus is what the runtime observed of one instance.
type InstanceStatus struct {
	ID string `json:"id"`
	// Generation is the nodespec.Instance generation this state answers.
	Generation int64  `json:"generation"`
	State      string `json:"state"`
	// Address is the instance's IPv4 address on the node's instance
	// network (the agent's bridge), reachable from the node itself: the
	// control plane records it, tunnels dial it.
	Address string `json:"address,omitempty"`
	// VCPU and MemoryMiB are the limits the runtime really applied.
	VCPU      int    `json:"vcpu,omitempty"`
	MemoryMiB int64  `json:"memoryMiB,omitempty"`
	Error     string `json:"error,omitempty"`
	// StartedAt is when it last started, epoch ms (0: not running).
	StartedAt int64 `json:"startedAt,omitempty"`
}

// Instances is the FrameInstances frame.
type Instances struct {
	Type FrameType `json:"type"`
	// Full says Statuses are every instance the runtime holds: an
	// instance of the node missing from a full report has no container
	// or VM.
	Full     bool             `json:"full"`
	Statuses []InstanceStatus `json:"statuses"`
}

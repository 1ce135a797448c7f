package protocol

// ExecSpec is a command to run inside an instance (sandboxes.exec).
type ExecSpec struct {
	InstanceID string            `json:"instanceId"`
	Command    []string          `json:"command"`
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`
	TimeoutMs  int64             `json:"timeoutMs,omitempty"`
}

// SandboxSnapshotPath + "<snapshotId>" is a sandbox snapshot's tar on the
// agent listener, under the node's mutual-TLS identity: GET fetches it
// (an instance restored from it), PUT uploads it (body the tar, header
// X-Content-SHA256 its hex SHA-256). SandboxSnapshotFailurePath +
// "<snapshotId>" (POST, body the reason as text) says the node could not
// take it.
const (
	SandboxSnapshotPath        = "/agent/v1/sandbox-snapshots/"
	SandboxSnapshotFailurePath = "/agent/v1/sandbox-snapshot-failures/"
)

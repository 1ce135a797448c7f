package protocol

// ExecSpec is a command to run inside an instance (sandboxes.exec).
type ExecSpec struct {
	InstanceID string            `json:"instanceId"`
	Command    []string          `json:"command"`
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`
	TimeoutMs  int64             `json:"timeoutMs,omitempty"`
}

package protocol

// CommandAgentUpdate replaces the running bcd with a release's build
// (docs/agent-self-update.md): the agent downloads the bytes from
// ReleaseArtifactPath, checks their size, SHA-256 and signature, swaps the
// binary in place, keeps the previous one, and restarts into the new build,
// which must hold a session within AgentUpdateArgs.ConfirmWithinSeconds or
// the previous build is put back. The command succeeds only once the new
// build's session is up, so a rollout sees its result and the session's
// agentVersion agree.
const CommandAgentUpdate CommandKind = "agent.update"

// ReleaseArtifactPath + "<releaseId>/<artifact name>" serves a release
// artifact's bytes to a joined node (mutual TLS), with range requests.
const ReleaseArtifactPath = "/agent/v1/releases/"

// AgentUpdateArgs are an agent.update command's args.
type AgentUpdateArgs struct {
	// ReleaseID and Artifact name the bytes: GET ReleaseArtifactPath +
	// ReleaseID + "/" + Artifact.
	ReleaseID string `json:"releaseId"`
	Artifact  string `json:"artifact"`
	// Version is the agentVersion the new build says in its hello (for
	// example "bcd/0.2.0"); a build that reports another is refused before
	// it replaces anything.
	Version   string `json:"version"`
	SHA256    string `json:"sha256"`
	SizeBytes int64  `json:"sizeBytes"`
	// Signature is the armored SSH signature of the bytes (namespace
	// better-compute-image), checked against Signers (authorized_keys
	// lines: the fleet's signer allowlist). Empty Signers means the
	// control plane verified nothing and the agent refuses.
	Signature string   `json:"signature"`
	Signers   []string `json:"signers"`
	// ConfirmWithinSeconds bounds how long the new build may take to hold
	// a session before the previous build is restored (default 120).
	ConfirmWithinSeconds int `json:"confirmWithinSeconds,omitempty"`
}

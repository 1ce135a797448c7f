package protocol

// Tunnels (tunnels.open): the server sends a FrameTunnel on the node's
// session; the agent dials the target locally, then opens
// POST TunnelPath + "<tunnelId>" on the agent listener with the same
// mutual-TLS identity (a new stream of the session's HTTP/2 connection, so
// the node needs no inbound port) and splices the target with the
// stream's request and response bodies (full duplex) until either side
// closes. A tunnel the agent cannot open is reported with status 502 on
// that path and the reason in the X-Tunnel-Error header, no body.
const TunnelPath = "/agent/v1/tunnels/"

// FrameTunnel (server → agent) asks for one tunnel.
const FrameTunnel FrameType = "tunnel"

// Tunnel targets.
const (
	// TunnelTCP dials Address ("host:port") from the node: an instance's
	// address on the node's instance network, or 127.0.0.1:<port> on the
	// node itself.
	TunnelTCP = "tcp"
	// TunnelExec runs Tunnel.Exec in an instance instead of dialing; the
	// stream carries exec frames (execwire.go).
	TunnelExec = "exec"
)

// Tunnel is the FrameTunnel frame.
type Tunnel struct {
	Type    FrameType `json:"type"`
	ID      string    `json:"id"`
	Target  string    `json:"target"`
	Address string    `json:"address"`
	// Exec is the command of an exec tunnel (Target TunnelExec).
	Exec *ExecSpec `json:"exec,omitempty"`
	// ExecOutputLimit bounds the stdout and stderr bytes an exec tunnel
	// forwards, together (0: DefaultExecOutputLimit).
	ExecOutputLimit int64 `json:"execOutputLimit,omitempty"`
	// ExpiresAt is when an unopened tunnel stops being accepted, epoch ms.
	ExpiresAt int64 `json:"expiresAt"`
}

// Package protocol is the agent protocol (docs/agent-protocol.md) as both
// ends speak it: the endpoints' paths, the bodies of the join and site
// endpoints, and the frames of the node session. `bcd` and the control
// plane's agent gateway both use these types, so the wire has one
// definition; the package imports only the standard library and pure
// project packages, so that `bcd` links no database or Temporal server.
package protocol

import "encoding/json"

// Paths of the API listener (join, site agent) and of the agent listener
// (the session).
const (
	JoinPath         = "/agent/v1/join"
	JoinStatusPath   = "/agent/v1/join/status"
	SiteRegisterPath = "/agent/v1/site/register"
	SiteRenewPath    = "/agent/v1/site/renew"
	SessionPath      = "/agent/v1/session"
)

// JoinRequest is the body of POST JoinPath.
type JoinRequest struct {
	Token     string          `json:"token"`
	Name      string          `json:"name"`
	Inventory json.RawMessage `json:"inventory"`
	CSR       string          `json:"csr"`
}

// JoinStatusRequest is the body of POST JoinStatusPath.
type JoinStatusRequest struct {
	JoinRequestID string `json:"joinRequestId"`
	RequestSecret string `json:"requestSecret"`
}

// JoinPending is the 202 answer of a join that waits for approval.
// RequestSecret appears only in the join's answer, never in a poll's.
type JoinPending struct {
	JoinRequestID string `json:"joinRequestId"`
	State         string `json:"state"`
	RequestSecret string `json:"requestSecret,omitempty"`
}

// JoinResult is the 200 answer of a join (or of a poll once approved):
// the node, its certificate and the CA that signed it (PEM), and where the
// agent opens its session.
type JoinResult struct {
	NodeID        string `json:"nodeId"`
	Certificate   string `json:"certificate"`
	CACertificate string `json:"caCertificate"`
	AgentEndpoint string `json:"agentEndpoint"`
}

// SiteRegisterRequest is the body of POST SiteRegisterPath.
type SiteRegisterRequest struct {
	Token  string `json:"token"`
	Holder string `json:"holder"`
}

// SiteRenewRequest is the body of POST SiteRenewPath: the epoch is the one
// register answered.
type SiteRenewRequest struct {
	Token  string `json:"token"`
	Holder string `json:"holder"`
	Epoch  int64  `json:"epoch"`
}

// SiteTemporal is where the site agent reaches Temporal.
type SiteTemporal struct {
	Address   string `json:"address"`
	Namespace string `json:"namespace"`
}

// SiteLease is the held boot lease: ExpiresAt in epoch milliseconds (the
// database's clock), TTLMs its length, from which the agent times its
// renewals and, on its own clock, when it must stop serving.
type SiteLease struct {
	Name      string `json:"name"`
	Epoch     int64  `json:"epoch"`
	ExpiresAt int64  `json:"expiresAt"`
	TTLMs     int64  `json:"ttlMs"`
}

// SiteResult answers both site endpoints.
type SiteResult struct {
	SiteID    string       `json:"siteId"`
	TaskQueue string       `json:"taskQueue"`
	Temporal  SiteTemporal `json:"temporal"`
	Lease     SiteLease    `json:"lease"`
}

// SiteTaskQueue is the task queue a site's agent serves.
func SiteTaskQueue(siteID string) string { return "site-" + siteID }

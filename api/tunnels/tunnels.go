// Package tunnels describes tunnels.open and serves the caller's end of a
// tunnel (docs/tunnels.md): a WebSocket at ConnectPath<tunnelId> on the API
// listener, authorized by the tunnel's one-time token, spliced through the
// node's agent session (the Relay, the agent gateway) to a TCP address the
// node dials: its own port or an instance's.
package tunnels

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
	nodesdomain "github.com/better-compute/better-compute/store/nodes"
	domain "github.com/better-compute/better-compute/store/tunnels"
)

// OpenInput is tunnels.open's input: exactly one of instanceId and nodeId.
type OpenInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	InstanceID string `json:"instanceId,omitempty" id:"inst" jsonschema_description:"The instance to reach (decided on compute:instances:exec); exactly one of instanceId and nodeId."`
	NodeID     string `json:"nodeId,omitempty" id:"node" jsonschema_description:"The node to reach (decided on compute:nodes:console); exactly one of instanceId and nodeId."`
	Port       int    `json:"port,omitempty" jsonschema:"minimum=1,maximum=65535" jsonschema_description:"The TCP port: required for an instance; a node's defaults to 22, its sshd."`
	TTLSeconds int    `json:"ttlSeconds,omitempty" jsonschema:"minimum=1,maximum=600" jsonschema_description:"How long the unopened tunnel is accepted (default 60)."`
}

// Opened is tunnels.open's answer. Token is shown once: it is stored
// hashed and serves one connection.
type Opened struct {
	TunnelID string `json:"tunnelId"`
	// URL is where the WebSocket connects: absolute (ws:// or wss://) when
	// the API knows its public URL, else the path on the API.
	URL       string `json:"url"`
	Token     string `json:"token"`
	ExpiresAt int64  `json:"expiresAt"`
}

// Open is tunnels.open.
const Open rpc.Ref[OpenInput, Opened] = "tunnels.open"

// ConnectPath is where a tunnel's WebSocket connects: GET
// ConnectPath<tunnelId>.
const ConnectPath = "/api/compute/tunnels/connect/"

// DefaultNodePort is a node tunnel's port when none is given (sshd).
const DefaultNodePort = 22

// Reasons of tunnels.open's INVALID_STATE answers (details.reason).
const (
	ReasonDisconnected = "disconnected"
	ReasonNotRunning   = "notRunning"
	ReasonSiteNode     = "siteNode"
)

// InstanceTargets answers where port of an instance of the tenant is
// reached: its node and the host:port the node dials, read in tx. An
// instance of another tenant or none is NOT_FOUND; one that is not
// running INVALID_STATE with details.reason "notRunning".
type InstanceTargets func(ctx context.Context, tx store.Tx, tenantID, instanceID string, port int) (nodeID, address string, err error)

// Domain describes tunnels.open over the instances domain's targets (nil:
// instance tunnels answer UNAVAILABLE until the instances domain is wired).
func Domain(targets InstanceTargets) rpc.Domain {
	return func(d rpc.Deps) []rpc.Descriptor { return methods(d, targets) }
}

func methods(d rpc.Deps, targets InstanceTargets) []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[OpenInput, Opened]{Name: Open, Action: "compute:instances:exec",
			DecidedOn: "compute-instance or compute:nodes:console on compute-node", Phase: "v0.3", Kind: core.KindMutation,
			// The choice is refused, before any decision, when the input
			// names both or neither.
			DecideOn: func(_ context.Context, _ *rpc.Call, _ store.Tx, in OpenInput) (string, error) {
				return targetType(in)
			},
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in OpenInput) (Opened, error) {
				return open(ctx, d, targets, c, tx, in)
			}},
	}
}

// targetType is the catalog type the input names: "instance" or "node".
func targetType(in OpenInput) (string, error) {
	switch {
	case in.InstanceID != "" && in.NodeID != "":
		return "", core.Errorf(core.CodeInvalidInput, "give exactly one of instanceId and nodeId, not both").
			WithDetails(map[string]any{"field": "nodeId", "reason": "exclusive"})
	case in.InstanceID != "" && in.Port == 0:
		return "", core.Errorf(core.CodeInvalidInput, "an instance's tunnel names its port").
			WithDetails(map[string]any{"field": "port", "reason": "required"})
	case in.InstanceID != "":
		return "instance", nil
	case in.NodeID != "":
		return "node", nil
	}
	return "", core.Errorf(core.CodeInvalidInput, "give exactly one of instanceId and nodeId").
		WithDetails(map[string]any{"field": "nodeId", "reason": "required"})
}

func open(ctx context.Context, d rpc.Deps, targets InstanceTargets, c *rpc.Call, tx store.Tx, in OpenInput) (Opened, error) {
	typ, err := targetType(in)
	if err != nil {
		return Opened{}, err
	}
	ttl := time.Duration(in.TTLSeconds) * time.Second
	if in.TTLSeconds == 0 {
		ttl = domain.DefaultTTLSeconds * time.Second
	}
	var nodeID, address string
	if typ == "instance" {
		if targets == nil {
			return Opened{}, core.Errorf(core.CodeUnavailable, "instance tunnels are not served by this deployment")
		}
		if nodeID, address, err = targets(ctx, tx, c.TenantID, in.InstanceID, in.Port); err != nil {
			return Opened{}, err
		}
		if err := checkConnected(ctx, tx, "instance "+in.InstanceID+"'s node", nodeID); err != nil {
			return Opened{}, err
		}
	} else {
		n, err := nodesdomain.Get(ctx, tx, c.TenantID, in.NodeID, false)
		if err != nil {
			return Opened{}, err
		}
		if n.Role == string(nodestate.RoleSite) {
			return Opened{}, core.Errorf(core.CodeInvalidState, "node %s is a site agent, which holds no node session", n.ID).
				WithDetails(map[string]any{"reason": ReasonSiteNode})
		}
		if n.Connectivity != string(nodestate.Connected) {
			return Opened{}, disconnected("node "+n.ID, n.Connectivity)
		}
		if in.Port == 0 {
			in.Port = DefaultNodePort
		}
		nodeID, address = n.ID, net.JoinHostPort("127.0.0.1", strconv.Itoa(in.Port))
	}
	return issue(ctx, d, tx, domain.NewTunnel{TenantID: c.TenantID, NodeID: nodeID, InstanceID: in.InstanceID,
		Target: protocol.TunnelTCP, Address: address, TTL: ttl, OpenedBy: c.Caller.IdentityID})
}

// OpenExec opens an exec tunnel in tx, for another domain's method
// (sandboxes.exec) that has decided on and checked the instance
// spec.InstanceID, which runs on nodeID: the answer is tunnels.open's,
// and the caller connects as to any tunnel (Exec is the client); the
// stream then carries exec frames (docs/tunnels.md, "Exec"). The node
// must be connected (INVALID_STATE reason disconnected). outputLimit
// bounds stdout and stderr together (0: the agent's default,
// protocol.DefaultExecOutputLimit); ttl is the unopened tunnel's (0: the
// default; at most MaxTTLSeconds).
func OpenExec(ctx context.Context, d rpc.Deps, c *rpc.Call, tx store.Tx, nodeID string, spec protocol.ExecSpec,
	outputLimit int64, ttl time.Duration) (Opened, error) {
	switch {
	case spec.InstanceID == "":
		return Opened{}, core.Errorf(core.CodeInvalidInput, "an exec names its instance").
			WithDetails(map[string]any{"field": "instanceId", "reason": "required"})
	case len(spec.Command) == 0:
		return Opened{}, core.Errorf(core.CodeInvalidInput, "an exec names its command").
			WithDetails(map[string]any{"field": "command", "reason": "required"})
	case outputLimit < 0:
		return Opened{}, core.Errorf(core.CodeInvalidInput, "the output limit is not negative").
			WithDetails(map[string]any{"field": "outputLimitBytes", "reason": "minimum"})
	case ttl > domain.MaxTTLSeconds*time.Second:
		return Opened{}, core.Errorf(core.CodeInvalidInput, "an unopened tunnel lasts at most %d s", domain.MaxTTLSeconds).
			WithDetails(map[string]any{"field": "ttlSeconds", "reason": "maximum"})
	}
	if ttl <= 0 {
		ttl = domain.DefaultTTLSeconds * time.Second
	}
	if err := checkConnected(ctx, tx, "instance "+spec.InstanceID+"'s node", nodeID); err != nil {
		return Opened{}, err
	}
	return issue(ctx, d, tx, domain.NewTunnel{TenantID: c.TenantID, NodeID: nodeID, InstanceID: spec.InstanceID,
		Target: protocol.TunnelExec, Exec: &spec, ExecOutputLimit: outputLimit, TTL: ttl, OpenedBy: c.Caller.IdentityID})
}

// checkConnected refuses a tunnel through a node whose agent's session is
// not up (the node may be another tenant's: an instance's pool owner's).
func checkConnected(ctx context.Context, tx store.Tx, what, nodeID string) error {
	connectivity, err := domain.NodeConnectivity(ctx, tx, nodeID)
	if err != nil {
		return err
	}
	if connectivity != string(nodestate.Connected) {
		return disconnected(what, connectivity)
	}
	return nil
}

// issue records the tunnel nt with a new token and answers it.
func issue(ctx context.Context, d rpc.Deps, tx store.Tx, nt domain.NewTunnel) (Opened, error) {
	token, hash, err := domain.NewToken()
	if err != nil {
		return Opened{}, err
	}
	nt.Hash = hash
	t, err := domain.Create(ctx, tx, nt)
	if err != nil {
		return Opened{}, err
	}
	return Opened{TunnelID: t.ID, URL: connectURL(d.PublicURL, t.ID), Token: token, ExpiresAt: t.ExpiresAt.UnixMilli()}, nil
}

func disconnected(what, connectivity string) error {
	return core.Errorf(core.CodeInvalidState, "%s is %s: a tunnel needs its agent's session", what, connectivity).
		WithDetails(map[string]any{"reason": ReasonDisconnected, "connectivity": connectivity})
}

// connectURL is the tunnel's WebSocket URL under the API's public URL, or
// its path when there is none.
func connectURL(public, id string) string {
	path := ConnectPath + id
	u, err := url.Parse(strings.TrimRight(public, "/"))
	if public == "" || err != nil || u.Host == "" {
		return path
	}
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	default:
		u.Scheme = "ws"
	}
	return u.String() + path
}

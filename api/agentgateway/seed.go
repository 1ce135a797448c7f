package agentgateway

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
	"go.yaml.in/yaml/v3"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	metaldomain "github.com/better-compute/better-compute/store/metal"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/secrets"
	"github.com/better-compute/better-compute/store/workflows"
)

// EventUserDataResolved records on the node's history that a deploy
// boot's ramdisk received the user data held as a secret (the reference,
// never the value).
const EventUserDataResolved = "UserDataResolved"

// seed serves RamdiskSeedPath. The answer holds the user data, so it is
// never logged.
func (g *Gateway) seed(c *gin.Context) {
	body, err := httpx.ReadBody(c)
	if err != nil {
		httpx.WriteError(c, err)
		return
	}
	var in protocol.RamdiskSeedRequest
	if err := decodeStrict(body, &in); err != nil {
		httpx.WriteError(c, err)
		return
	}
	out, err := g.RamdiskSeed(c.Request.Context(), in)
	if err != nil {
		writeBootErr(c, err)
		return
	}
	c.JSON(http.StatusOK, out)
}

// seedMeta is the NoCloud meta-data file: cloud-init's two keys first,
// then the profile's own.
type seedMeta struct {
	InstanceID    string            `yaml:"instance-id"`
	LocalHostname string            `yaml:"local-hostname"`
	Rest          map[string]string `yaml:",inline"`
}

// RamdiskSeed answers the NoCloud seed of the live workflow of an open
// deploy boot's node: meta-data (instance-id the workflow id, its host
// name, the profile's meta data) and the user data, inline or resolved
// from its secret just now, the resolution recorded. A secret that is
// gone is NOT_FOUND (reason secretNotFound), and nothing more is said.
func (g *Gateway) RamdiskSeed(ctx context.Context, in protocol.RamdiskSeedRequest) (protocol.RamdiskSeed, error) {
	if g.deps.Store == nil {
		return protocol.RamdiskSeed{}, core.Errorf(core.CodeUnavailable, "no database configured")
	}
	var out protocol.RamdiskSeed
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		b, err := metaldomain.BootOfToken(ctx, tx, in.Token)
		if err != nil {
			return err
		}
		if b.Purpose != metaldomain.PurposeDeploy {
			return core.Errorf(core.CodeNotFound, "boot %s deploys nothing: it has no seed", b.ID)
		}
		n, err := nodes.Get(ctx, tx, b.TenantID, b.NodeID, false)
		if err != nil {
			return err
		}
		w, err := workflows.LiveForNode(ctx, tx, b.TenantID, b.NodeID)
		if err != nil {
			return err
		}
		wc := w.Context()
		meta := seedMeta{InstanceID: w.ID, LocalHostname: wc.Hostname, Rest: map[string]string{}}
		if meta.LocalHostname == "" {
			meta.LocalHostname = n.Name
		}
		for k, v := range wc.MetaData {
			if k != "instance-id" && k != "local-hostname" {
				meta.Rest[k] = v
			}
		}
		raw, err := yaml.Marshal(meta)
		if err != nil {
			return err
		}
		out = protocol.RamdiskSeed{NodeID: n.ID, WorkflowID: w.ID, MetaData: string(raw), UserData: wc.UserData}
		if wc.UserDataSecret == "" {
			return nil
		}
		if g.deps.Secrets == nil {
			return core.Errorf(core.CodeUnavailable, "no secret store configured")
		}
		use := secrets.Use{TenantID: n.TenantID, Purpose: "user-data", IdentityKind: "boot", IdentityID: b.ID,
			ResourceType: g.types.Node, ResourceID: n.ID}
		value, err := g.deps.Secrets.Resolve(ctx, tx, wc.UserDataSecret, use)
		if err != nil {
			return seedSecretErr(err)
		}
		out.UserData = value
		return nodes.AddEvent(ctx, tx, n.ID, EventUserDataResolved, "user data resolved for deploy boot "+b.ID,
			map[string]any{"bootId": b.ID, "workflowId": w.ID, "secret": wc.UserDataSecret})
	})
	if err != nil {
		return protocol.RamdiskSeed{}, err
	}
	return out, nil
}

// seedSecretErr says that the user data's secret is gone without saying
// which or why.
func seedSecretErr(err error) error {
	var e *core.Error
	if errors.As(err, &e) && (e.Code == core.CodeNotFound || strings.Contains(e.Message, "not found")) {
		return core.Errorf(core.CodeNotFound, "the user data's secret was not found").
			WithDetails(map[string]any{"reason": "secretNotFound"})
	}
	return err
}

package agentgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	coresecrets "github.com/better-compute/better-compute/core/secrets"

	"github.com/gin-gonic/gin"

	metalact "github.com/better-compute/better-compute/activities/metal"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	metaldomain "github.com/better-compute/better-compute/store/metal"
	"github.com/better-compute/better-compute/store/secrets"
)

// The bare-metal endpoints (agent/protocol/metal.go). The site endpoints
// serve the site agent that holds the site's boot lease: its site token
// and the lease's fencing epoch authenticate it, so an agent that lost the
// lease (another serves the site now) is refused. They answer only about
// nodes and boots of the agent's own site; anything else is NOT_FOUND, as
// a node that does not exist. The ramdisk endpoints authenticate with a
// boot's one-time token or the site's discovery token, looked up by hash.

// SecretResolver opens a secret reference's value just before use, and
// records the resolution (store/secrets.Vault).
type SecretResolver interface {
	Resolve(ctx context.Context, tx store.Tx, ref string, use secrets.Use) (string, error)
}

// MountMetal puts the bare-metal endpoints on r (the API listener).
func (g *Gateway) MountMetal(r gin.IRoutes) {
	r.POST(protocol.SiteBMCCredentialsPath, noStore, agentJSON(g.SiteBMCCredentials))
	r.POST(protocol.SiteBootTokenPath, noStore, agentJSON(g.SiteBootToken))
	r.POST(protocol.SiteDiscoveryTokenPath, noStore, agentJSON(g.SiteDiscoveryToken))
	r.POST(protocol.RamdiskReportPath, noStore, g.ramdisk(g.RamdiskReport))
	r.POST(protocol.RamdiskResultPath, noStore, g.ramdisk(g.RamdiskResult))
	r.POST(protocol.RamdiskDiscoverPath, noStore, agentJSON(g.RamdiskDiscover))
	r.POST(protocol.RamdiskSeedPath, noStore, g.seed)
}

// deployPollMs is how often a deploy boot's waiting ramdisk asks again:
// its workflow hands it one step at a time, so it should not wait long.
const deployPollMs = 1000

// instructions answers a boot's ramdisk its pending steps (and, for a
// deploy boot, how soon to ask again).
func instructions(b metaldomain.Boot) protocol.RamdiskInstructions {
	out := protocol.RamdiskInstructions{NodeID: b.NodeID, Steps: b.Pending()}
	if b.Purpose == metaldomain.PurposeDeploy {
		out.PollMs = deployPollMs
	}
	return out
}

// noStore keeps credentials and tokens out of every cache on the way.
func noStore(c *gin.Context) { c.Header("Cache-Control", "no-store") }

// ramdisk serves a boot-token endpoint: a boot that ended (finished or
// expired) is 410 Gone, so the ramdisk stops asking.
func (g *Gateway) ramdisk(fn func(context.Context, []byte) (protocol.RamdiskInstructions, string, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		body, err := httpx.ReadBody(c)
		if err != nil {
			httpx.WriteError(c, err)
			return
		}
		out, bootID, err := fn(c.Request.Context(), body)
		if err != nil {
			writeBootErr(c, err)
			return
		}
		g.signalBoot(c.Request.Context(), out.NodeID, bootID)
		c.JSON(http.StatusOK, out)
	}
}

// writeBootErr writes a boot-token endpoint's error: a boot that ended is
// 410 Gone, so the ramdisk stops asking.
func writeBootErr(c *gin.Context, err error) {
	if errors.Is(err, metaldomain.ErrBootEnded) {
		e := core.Errorf(core.CodeInvalidState, "the boot has ended").WithDetails(map[string]any{"reason": "bootEnded"})
		c.AbortWithStatusJSON(http.StatusGone, httpx.ErrorBody{Error: e, RequestID: c.GetString(httpx.RequestIDKey)})
		return
	}
	httpx.WriteError(c, err)
}

// siteHolder authenticates a site endpoint's caller: a live site token,
// and the epoch of the site's boot lease, still held. A lease that expired
// or was taken at a later epoch is CONFLICT "lease lost".
func (g *Gateway) siteHolder(ctx context.Context, tx store.Tx, a protocol.SiteAuth) (siteAgent, error) {
	if g.deps.Store == nil {
		return siteAgent{}, core.Errorf(core.CodeUnavailable, "no database configured")
	}
	if a.Token == "" {
		return siteAgent{}, core.Errorf(core.CodeUnauthn, "a site token is required")
	}
	if a.Epoch < 1 {
		return siteAgent{}, badField("epoch", "invalid", "epoch must be the boot lease's, as register answered it")
	}
	agent, err := authenticateSiteToken(ctx, tx, a.Token)
	if err != nil {
		return siteAgent{}, err
	}
	var held bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM leases WHERE name = $1 AND epoch = $2 AND expires_at > now())`,
		store.SiteBootLease(agent.siteID), a.Epoch).Scan(&held); err != nil {
		return siteAgent{}, err
	}
	if !held {
		return siteAgent{}, core.Errorf(core.CodeConflict, "lease lost: %s", store.SiteBootLease(agent.siteID)).
			WithDetails(map[string]any{"reason": "leaseLost"})
	}
	return agent, nil
}

// SiteBMCCredentials answers a node's BMC credentials to the agent of the
// node's site, each password resolved from its secret reference in the
// same transaction that records the resolution (store/secrets) and a node
// event naming the references, never the values.
func (g *Gateway) SiteBMCCredentials(ctx context.Context, in protocol.SiteBMCCredentialsRequest) (protocol.SiteBMCCredentialsResult, error) {
	if g.deps.Secrets == nil {
		return protocol.SiteBMCCredentialsResult{}, core.Errorf(core.CodeUnavailable, "no secret store configured")
	}
	var out protocol.SiteBMCCredentialsResult
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		a, err := g.siteHolder(ctx, tx, in.SiteAuth)
		if err != nil {
			return err
		}
		n, err := metaldomain.NodeOfSite(ctx, tx, a.siteID, in.NodeID)
		if err != nil {
			return err
		}
		use := secrets.Use{TenantID: n.TenantID, Purpose: "bmc-credentials", IdentityKind: "site", IdentityID: a.siteID,
			ResourceType: g.types.Node, ResourceID: n.NodeID}
		out = protocol.SiteBMCCredentialsResult{NodeID: n.NodeID}
		for _, ref := range n.BMC.SecretRefs() {
			if !g.siteMayResolve(a, n.TenantID, ref) {
				return credentialsErr(core.Errorf(core.CodeNotFound, "secret not found"))
			}
		}
		if r := n.BMC.Redfish; r != nil {
			pw, err := g.deps.Secrets.Resolve(ctx, tx, r.PasswordSecret, use)
			if err != nil {
				return credentialsErr(err)
			}
			out.Redfish = &protocol.BMCCredentials{Address: r.Address, Username: r.Username, Password: pw,
				CAPEM: r.CAPEM, InsecureSkipVerify: r.InsecureSkipVerify}
		}
		if i := n.BMC.IPMI; i != nil {
			pw, err := g.deps.Secrets.Resolve(ctx, tx, i.PasswordSecret, use)
			if err != nil {
				return credentialsErr(err)
			}
			out.IPMI = &protocol.BMCCredentials{Address: i.Address, Username: i.Username, Password: pw}
		}
		return metaldomain.RecordCredentialsUse(ctx, tx, n, a.siteID)
	})
	if err != nil {
		return protocol.SiteBMCCredentialsResult{}, err
	}
	return out, nil
}

// siteMayResolve says whether the agent of a's site may have the secret
// ref resolved for a node of tenant nodeTenant: the node's own secrets
// always; the fleet's (the root tenant's) only at the platform's own sites,
// since a tenant's custom site runs the tenant's own agent, which must
// never read a platform secret a node there names.
func (g *Gateway) siteMayResolve(a siteAgent, nodeTenant, ref string) bool {
	refTenant, _, err := coresecrets.ParseRef(ref)
	if err != nil {
		return false
	}
	return refTenant == nodeTenant || a.tenantID == g.deps.RootTenant
}

// credentialsErr says that a referenced secret is gone (deleted since
// enrolment) without saying more: the node's operation fails with it.
func credentialsErr(err error) error {
	var e *core.Error
	if errors.As(err, &e) && e.Code == core.CodeNotFound {
		return core.Errorf(core.CodeInvalidState, "a BMC password secret of the node no longer resolves").
			WithDetails(map[string]any{"reason": "secretGone"})
	}
	return err
}

// SiteBootToken mints, once, the token of a boot of a node of the agent's
// site.
func (g *Gateway) SiteBootToken(ctx context.Context, in protocol.SiteBootTokenRequest) (protocol.SiteBootTokenResult, error) {
	var out protocol.SiteBootTokenResult
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		a, err := g.siteHolder(ctx, tx, in.SiteAuth)
		if err != nil {
			return err
		}
		out, err = metaldomain.MintBootToken(ctx, tx, a.siteID, in.BootID)
		return err
	})
	return out, err
}

// SiteDiscoveryToken answers a new discovery token of the agent's site
// (the previous one stays valid for metal.DiscoveryTokenGrace).
func (g *Gateway) SiteDiscoveryToken(ctx context.Context, in protocol.SiteAuth) (protocol.SiteDiscoveryTokenResult, error) {
	var out protocol.SiteDiscoveryTokenResult
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		a, err := g.siteHolder(ctx, tx, in)
		if err != nil {
			return err
		}
		token, err := metaldomain.RotateDiscoveryToken(ctx, tx, a.siteID)
		out = protocol.SiteDiscoveryTokenResult{SiteID: a.siteID, Token: token}
		return err
	})
	return out, err
}

// decodeStrict reads body into v, refusing unknown fields.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return core.Errorf(core.CodeInvalidInput, "the body is not the endpoint's JSON object")
	}
	return nil
}

// RamdiskReport stores a booted ramdisk's inventory on its boot and
// answers the steps its workflow set (none yet: it asks again).
func (g *Gateway) RamdiskReport(ctx context.Context, body []byte) (protocol.RamdiskInstructions, string, error) {
	var in protocol.RamdiskReport
	if err := decodeStrict(body, &in); err != nil {
		return protocol.RamdiskInstructions{}, "", err
	}
	if g.deps.Store == nil {
		return protocol.RamdiskInstructions{}, "", core.Errorf(core.CodeUnavailable, "no database configured")
	}
	var b metaldomain.Boot
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		b, err = metaldomain.Report(ctx, tx, in.Token, in.Inventory)
		return err
	})
	if err != nil {
		return protocol.RamdiskInstructions{}, "", err
	}
	return instructions(b), b.ID, nil
}

// RamdiskResult stores the results of the steps a ramdisk ran.
func (g *Gateway) RamdiskResult(ctx context.Context, body []byte) (protocol.RamdiskInstructions, string, error) {
	var in protocol.RamdiskResult
	if err := decodeStrict(body, &in); err != nil {
		return protocol.RamdiskInstructions{}, "", err
	}
	if g.deps.Store == nil {
		return protocol.RamdiskInstructions{}, "", core.Errorf(core.CodeUnavailable, "no database configured")
	}
	if strings.HasPrefix(in.Token, protocol.DiscoveryTokenPrefix) {
		err := g.deps.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) error {
			return metaldomain.DiscoveryResult(ctx, tx, in.Token)
		})
		return protocol.RamdiskInstructions{Steps: []protocol.RamdiskStep{}}, "", err
	}
	var b metaldomain.Boot
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		b, err = metaldomain.Results(ctx, tx, in.Token, in.Results)
		return err
	})
	if err != nil {
		return protocol.RamdiskInstructions{}, "", err
	}
	return instructions(b), b.ID, nil
}

// RamdiskDiscover records a machine that booted the site's discovery
// ramdisk; it is told to power off until an operator enrolls it and
// confirms its MAC (metal.confirmMac), and to wait once it is linked.
func (g *Gateway) RamdiskDiscover(ctx context.Context, in protocol.RamdiskDiscover) (protocol.RamdiskInstructions, error) {
	if g.deps.Store == nil {
		return protocol.RamdiskInstructions{}, core.Errorf(core.CodeUnavailable, "no database configured")
	}
	var d metaldomain.Discovered
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		d, err = metaldomain.Discover(ctx, tx, in.Token, in.BootMAC, in.Inventory)
		return err
	})
	if err != nil {
		return protocol.RamdiskInstructions{}, err
	}
	if d.NodeID != "" {
		return protocol.RamdiskInstructions{NodeID: d.NodeID, Steps: []protocol.RamdiskStep{{Name: protocol.StepWait}}}, nil
	}
	return protocol.RamdiskInstructions{Steps: []protocol.RamdiskStep{{Name: protocol.StepPowerOff}}}, nil
}

// signalBoot tells the node's workflow that its boot reported, best
// effort: the workflow also polls the boot row.
func (g *Gateway) signalBoot(ctx context.Context, nodeID, bootID string) {
	if g.deps.Temporal == nil || nodeID == "" {
		return
	}
	err := g.deps.Temporal.SignalWorkflow(ctx, metalact.MetalWorkflowID(nodeID), "", metalact.SignalBootReported,
		metalact.BootReported{BootID: bootID})
	if err != nil {
		g.deps.Logger.Debug("metal: boot-reported signal not delivered (the workflow polls)", "node", nodeID, "error", err)
	}
}

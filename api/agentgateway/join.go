package agentgateway

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	metaldomain "github.com/better-compute/better-compute/store/metal"
	domain "github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/pools"
)

// The join half of the agent protocol: `bcd node join` posts its join
// token, name, inventory and a certificate request to POST /agent/v1/join
// and, when the pool asks for approval, polls POST /agent/v1/join/status
// until an operator decides. The join token (or the request secret) is
// their only credential. Neither the token, the secret nor any private key
// is ever logged or stored.

func noNodeCA() error { return core.Errorf(core.CodeUnavailable, "no node CA configured") }

// handleJoin is POST /agent/v1/join.
func (g *Gateway) handleJoin(c *gin.Context) {
	if g.deps.NodeCA == nil {
		httpx.WriteError(c, noNodeCA())
		return
	}
	var in protocol.JoinRequest
	if err := readJSON(c, &in); err != nil {
		httpx.WriteError(c, err)
		return
	}
	status, out, err := g.Join(c.Request.Context(), in)
	if err != nil {
		httpx.WriteError(c, err)
		return
	}
	c.JSON(status, out)
}

// handleJoinStatus is POST /agent/v1/join/status.
func (g *Gateway) handleJoinStatus(c *gin.Context) {
	if g.deps.NodeCA == nil {
		httpx.WriteError(c, noNodeCA())
		return
	}
	var in protocol.JoinStatusRequest
	if err := readJSON(c, &in); err != nil {
		httpx.WriteError(c, err)
		return
	}
	status, out, err := g.JoinStatus(c.Request.Context(), in)
	if err != nil {
		httpx.WriteError(c, err)
		return
	}
	c.JSON(status, out)
}

// Join serves a join: it spends the token and, in the same transaction,
// either records a join request (the pool asks for approval: 202) or
// admits the node and issues its certificate (200).
func (g *Gateway) Join(ctx context.Context, in protocol.JoinRequest) (int, any, error) {
	if g.deps.NodeCA == nil {
		return 0, nil, noNodeCA()
	}
	cand, err := domain.CheckJoin(in.Token, in.Name, in.Inventory, in.CSR)
	if err != nil {
		return 0, nil, err
	}
	if strings.HasPrefix(in.Token, protocol.BootTokenPrefix) {
		return g.joinWithBoot(ctx, cand, in.Token)
	}
	var status int
	var out any
	err = g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		tok, err := domain.ConsumeJoinToken(ctx, tx, in.Token)
		if err != nil {
			return err
		}
		pool, err := pools.LoadByID(ctx, tx, tok.PoolID) // locked: joins to one pool are serialized
		if err != nil {
			return err
		}
		if slices.Contains(pool.Policy.Acceptance, domain.AcceptanceApproval) {
			secret, hash, err := domain.NewRequestSecret()
			if err != nil {
				return err
			}
			r, err := domain.CreateJoinRequest(ctx, tx, domain.NewJoinRequest{TenantID: pool.TenantID, PoolID: pool.ID,
				JoinTokenID: tok.ID, Name: cand.Name, HardwareKey: cand.HardwareKey.Key, Inventory: cand.Inventory,
				CSR: string(cand.CSR), SecretHash: hash})
			if err != nil {
				return err
			}
			status, out = http.StatusAccepted, protocol.JoinPending{JoinRequestID: r.ID, State: r.State, RequestSecret: secret}
			return nil
		}
		res, err := domain.Admit(ctx, tx, g.types, pool, cand, "joinToken:"+tok.ID, g.deps.RootTenant, g.deps.NodeCA.SignNode)
		if err != nil {
			return err
		}
		status, out = http.StatusOK, g.joinResult(res.NodeID, string(res.Certificate))
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return status, out, nil
}

// joinWithBoot serves the join of a deployed system's agent with its
// deploy boot's token: it joins only the boot's node, only with the node's
// hardware key, while the boot is open, without approval. A refusal for
// another hardware key is recorded on the boot before it is answered, so
// the workflow awaiting the re-join fails at once; either way the
// workflow is told.
func (g *Gateway) joinWithBoot(ctx context.Context, cand domain.Candidate, token string) (int, any, error) {
	var out protocol.JoinResult
	var boot metaldomain.Boot
	var refused error
	err := g.deps.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		b, err := metaldomain.JoinWithBoot(ctx, tx, token, cand.HardwareKey.Key)
		if errors.Is(err, metaldomain.ErrJoinRefused) {
			boot, refused = b, err
			return nil
		}
		if err != nil {
			return err
		}
		boot = b
		res, err := domain.Rejoin(ctx, tx, g.types, b.NodeID, cand, "boot:"+b.ID, g.deps.NodeCA.SignNode)
		if err != nil {
			return err
		}
		if err := metaldomain.MarkJoined(ctx, tx, b.ID); err != nil {
			return err
		}
		out = g.joinResult(res.NodeID, string(res.Certificate))
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	g.signalBoot(ctx, boot.NodeID, boot.ID)
	if refused != nil {
		return 0, nil, refused
	}
	return http.StatusOK, out, nil
}

func (g *Gateway) joinResult(nodeID, certificate string) protocol.JoinResult {
	return protocol.JoinResult{NodeID: nodeID, Certificate: certificate, CACertificate: string(g.deps.NodeCA.CertPEM()),
		AgentEndpoint: g.deps.AgentEndpoint}
}

// JoinStatus answers an agent's poll of its join request: 202 while
// pending, 200 with the identity once approved, ACCESS_DENIED (reason
// rejected) once rejected, INVALID_STATE (reason expired) once expired.
func (g *Gateway) JoinStatus(ctx context.Context, in protocol.JoinStatusRequest) (int, any, error) {
	if g.deps.NodeCA == nil {
		return 0, nil, noNodeCA()
	}
	if !core.ValidID("jreq", in.JoinRequestID) || !strings.HasPrefix(in.RequestSecret, domain.JoinRequestSecretPrefix) ||
		len(in.RequestSecret) > 256 {
		return 0, nil, core.Errorf(core.CodeUnauthn, "the join request or its secret is not valid")
	}
	r, err := domain.GetJoinRequestBySecret(ctx, g.deps.Store.Pool, in.JoinRequestID, in.RequestSecret)
	if err != nil {
		return 0, nil, err
	}
	switch r.State {
	case domain.JoinRequestPending:
		return http.StatusAccepted, protocol.JoinPending{JoinRequestID: r.ID, State: r.State}, nil
	case domain.JoinRequestApproved:
		return http.StatusOK, g.joinResult(r.NodeID, r.Certificate), nil
	case domain.JoinRequestRejected:
		return 0, nil, core.Errorf(core.CodeAccessDenied, "the join request was rejected").
			WithDetails(map[string]any{"reason": "rejected"})
	default:
		return 0, nil, core.Errorf(core.CodeInvalidState, "the join request is %s", r.State).
			WithDetails(map[string]any{"reason": r.State})
	}
}

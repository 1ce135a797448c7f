package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
	pooldomain "github.com/better-compute/better-compute/store/pools"
)

// The join half of the agent protocol (docs/agent-protocol.md): `bcd node
// join` posts its join token, name, inventory and a certificate request to
// POST /agent/v1/join and, when the pool asks for approval, polls POST
// /agent/v1/join/status until an operator decides. Both live on the API
// listener, outside the method table; the join token (or the request
// secret) is their only credential. Neither the token, the secret nor any
// private key is ever logged or stored.

// NodeCertificateTTL is how long a node certificate issued at join is valid.
const NodeCertificateTTL = 90 * 24 * time.Hour

// JoinRequestSecretPrefix starts every join request secret.
const JoinRequestSecretPrefix = "bcjr_"

// AcceptanceApproval in a pool's policy.acceptance makes joins wait for
// joinRequests.approve.
const AcceptanceApproval = "approval"

// Node event types of joining.
const (
	EventJoined           = "Joined"
	EventIdentityIssued   = "IdentityIssued"
	EventIdentityRevoked  = "IdentityRevoked"
	nodeNameMaxLength     = 63
	nodeNameSuffixLength  = 5
	nodeNameClashAttempts = 8
)

// nodeNamePattern is a DNS label (RFC 1123), lower case.
var nodeNamePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func noNodeCA() error { return core.Errorf(core.CodeUnavailable, "no node CA configured") }

// readAgentJSON reads a bounded JSON body into v, refusing unknown fields.
func readAgentJSON(c *gin.Context, v any) error {
	body, err := readBody(c)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return core.Errorf(core.CodeInvalidInput, "the body is not the endpoint's JSON object")
	}
	return nil
}

// handleAgentJoin is POST /agent/v1/join.
func (s *Server) handleAgentJoin(c *gin.Context) {
	if s.deps.NodeCA == nil {
		writeError(c, noNodeCA())
		return
	}
	var in protocol.JoinRequest
	if err := readAgentJSON(c, &in); err != nil {
		writeError(c, err)
		return
	}
	status, out, err := s.Join(c.Request.Context(), in)
	if err != nil {
		writeError(c, err)
		return
	}
	c.JSON(status, out)
}

// handleAgentJoinStatus is POST /agent/v1/join/status.
func (s *Server) handleAgentJoinStatus(c *gin.Context) {
	if s.deps.NodeCA == nil {
		writeError(c, noNodeCA())
		return
	}
	var in protocol.JoinStatusRequest
	if err := readAgentJSON(c, &in); err != nil {
		writeError(c, err)
		return
	}
	status, out, err := s.JoinStatus(c.Request.Context(), in)
	if err != nil {
		writeError(c, err)
		return
	}
	c.JSON(status, out)
}

// joinCandidate is a checked join: what the node is made from.
type joinCandidate struct {
	name        string
	inventory   []byte
	hardwareKey inventory.HardwareKey
	csr         []byte
}

// checkJoin validates a join's input before anything is spent.
func checkJoin(in protocol.JoinRequest) (joinCandidate, error) {
	if in.Token == "" {
		return joinCandidate{}, badField("token", "required", "a join token is required")
	}
	name := strings.ToLower(in.Name)
	if !nodeNamePattern.MatchString(name) {
		return joinCandidate{}, badField("name", "pattern", "name must be a DNS label: 1 to 63 letters, digits and hyphens, not starting or ending with a hyphen")
	}
	if len(bytes.TrimSpace(in.Inventory)) == 0 {
		return joinCandidate{}, badField("inventory", "required", "a NodeInventory v1 document is required")
	}
	inv, err := inventory.Parse(in.Inventory)
	if err != nil {
		return joinCandidate{}, err
	}
	if err := checkCSR([]byte(in.CSR)); err != nil {
		return joinCandidate{}, err
	}
	return joinCandidate{name: name, inventory: in.Inventory, hardwareKey: inventory.ComputeHardwareKey(inv), csr: []byte(in.CSR)}, nil
}

// checkCSR accepts a PEM certificate request whose signature checks out.
func checkCSR(csrPEM []byte) error {
	bad := func() error {
		return badField("csr", "invalid", "csr must be a PEM certificate request signed by its key")
	}
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return bad()
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil || csr.CheckSignature() != nil {
		return bad()
	}
	return nil
}

// Join serves a join: it spends the token and, in the same transaction,
// either records a join request (the pool asks for approval: 202) or
// admits the node and issues its certificate (200).
func (s *Server) Join(ctx context.Context, in protocol.JoinRequest) (int, any, error) {
	if s.deps.NodeCA == nil {
		return 0, nil, noNodeCA()
	}
	cand, err := checkJoin(in)
	if err != nil {
		return 0, nil, err
	}
	var status int
	var out any
	err = s.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		tok, err := store.ConsumeJoinToken(ctx, tx, in.Token)
		if err != nil {
			return err
		}
		pool, err := pooldomain.LoadByID(ctx, tx, tok.PoolID) // locked: joins to one pool are serialized
		if err != nil {
			return err
		}
		if slices.Contains(pool.Policy.Acceptance, AcceptanceApproval) {
			secret, hash, err := newRequestSecret()
			if err != nil {
				return err
			}
			r, err := store.CreateJoinRequest(ctx, tx, store.NewJoinRequest{TenantID: pool.TenantID, PoolID: pool.ID,
				JoinTokenID: tok.ID, Name: cand.name, HardwareKey: cand.hardwareKey.Key, Inventory: cand.inventory,
				CSR: string(cand.csr), SecretHash: hash})
			if err != nil {
				return err
			}
			status, out = http.StatusAccepted, protocol.JoinPending{JoinRequestID: r.ID, State: r.State, RequestSecret: secret}
			return nil
		}
		res, err := s.admitNode(ctx, tx, pool, cand, "joinToken:"+tok.ID)
		if err != nil {
			return err
		}
		status, out = http.StatusOK, res
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return status, out, nil
}

// JoinStatus answers an agent's poll of its join request: 202 while
// pending, 200 with the identity once approved, ACCESS_DENIED (reason
// rejected) once rejected, INVALID_STATE (reason expired) once expired.
func (s *Server) JoinStatus(ctx context.Context, in protocol.JoinStatusRequest) (int, any, error) {
	if s.deps.NodeCA == nil {
		return 0, nil, noNodeCA()
	}
	if !core.ValidID("jreq", in.JoinRequestID) || !strings.HasPrefix(in.RequestSecret, JoinRequestSecretPrefix) ||
		len(in.RequestSecret) > 256 {
		return 0, nil, core.Errorf(core.CodeUnauthn, "the join request or its secret is not valid")
	}
	r, err := store.GetJoinRequestBySecret(ctx, s.store.Pool, in.JoinRequestID, in.RequestSecret)
	if err != nil {
		return 0, nil, err
	}
	switch r.State {
	case store.JoinRequestPending:
		return http.StatusAccepted, protocol.JoinPending{JoinRequestID: r.ID, State: r.State}, nil
	case store.JoinRequestApproved:
		return http.StatusOK, protocol.JoinResult{NodeID: r.NodeID, Certificate: r.Certificate,
			CACertificate: string(s.deps.NodeCA.CertPEM()), AgentEndpoint: s.deps.AgentEndpoint}, nil
	case store.JoinRequestRejected:
		return 0, nil, core.Errorf(core.CodeAccessDenied, "the join request was rejected").
			WithDetails(map[string]any{"reason": "rejected"})
	default:
		return 0, nil, core.Errorf(core.CodeInvalidState, "the join request is %s", r.State).
			WithDetails(map[string]any{"reason": r.State})
	}
}

// newRequestSecret returns a join request secret ("bcjr_" and 32 random
// bytes in lower-case base32) and its SHA-256, the only form stored.
func newRequestSecret() (string, []byte, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, err
	}
	secret := JoinRequestSecretPrefix + tokenEncoding.EncodeToString(b[:])
	return secret, store.HashRequestSecret(secret), nil
}

// admitNode makes (or finds) the joining machine's node in pool, ingests
// its inventory, and issues its certificate for the CSR, all in tx. A
// machine whose trusted hardware key matches a live node of the pool gets
// that node back (a reinstall): its earlier identities are revoked. Any
// other gets a new node: role host, provision state adopted (adopting while
// the pool's acceptance checks await nodes.adopt), disconnected,
// trust from the pool's owner, observed generation 0 (it has applied no
// NodeSpec yet, so it is not schedulable until it does).
func (s *Server) admitNode(ctx context.Context, tx store.Tx, pool pooldomain.Pool, cand joinCandidate, by string) (protocol.JoinResult, error) {
	if pool.ArchivedAt != nil {
		return protocol.JoinResult{}, core.Errorf(core.CodeInvalidState, "the pool is archived").
			WithDetails(map[string]any{"reason": store.JoinTokenPoolArchived})
	}
	nodeID, err := s.matchNode(ctx, tx, pool.ID, cand.hardwareKey)
	if err != nil {
		return protocol.JoinResult{}, err
	}
	if nodeID != "" {
		if _, err := store.RevokeNodeIdentities(ctx, tx, nodeID, by); err != nil {
			return protocol.JoinResult{}, err
		}
		if err := addNodeEvent(ctx, tx, nodeID, EventIdentityRevoked, "identities revoked: the machine joined again",
			map[string]any{"by": by}); err != nil {
			return protocol.JoinResult{}, err
		}
	} else {
		name, err := s.freeNodeName(ctx, tx, pool.TenantID, cand.name)
		if err != nil {
			return protocol.JoinResult{}, err
		}
		nn := NewNode{PoolID: pool.ID, Name: name, ProvisionState: joinedState(pool.Policy), Role: nodes.RoleHost,
			Trust: nodes.TrustPlatform, Connectivity: nodes.Disconnected, ObservedGeneration: 0}
		if pool.TenantID != s.rootTenant {
			nn.Trust, nn.OwnerTenantID = nodes.TrustTenantOwned, pool.TenantID
		}
		n, err := s.CreateNode(ctx, tx, nn)
		if err != nil {
			return protocol.JoinResult{}, err
		}
		nodeID = n.ID
	}
	if err := addNodeEvent(ctx, tx, nodeID, EventJoined, "joined pool "+pool.ID,
		map[string]any{"poolId": pool.ID, "by": by}); err != nil {
		return protocol.JoinResult{}, err
	}
	if _, err := s.IngestInventory(ctx, tx, nodeID, cand.inventory); err != nil {
		return protocol.JoinResult{}, err
	}
	certPEM, err := s.issueIdentity(ctx, tx, nodeID, cand.csr)
	if err != nil {
		return protocol.JoinResult{}, err
	}
	return protocol.JoinResult{NodeID: nodeID, Certificate: string(certPEM), CACertificate: string(s.deps.NodeCA.CertPEM()),
		AgentEndpoint: s.deps.AgentEndpoint}, nil
}

// matchNode finds the live node of the pool with this trusted hardware
// key, locked; "" when the key is not trusted, empty, or new.
func (s *Server) matchNode(ctx context.Context, tx store.Tx, poolID string, hk inventory.HardwareKey) (string, error) {
	if hk.Key == "" || !hk.Trusted {
		return "", nil
	}
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM nodes WHERE pool_id = $1 AND hardware_key = $2 AND hardware_key_trusted
		AND deleted_at IS NULL ORDER BY created_at LIMIT 1 FOR UPDATE`, poolID, hk.Key).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return id, err
}

// freeNodeName is name when no live node of the tenant has it, else name
// with a short random suffix ("gpu-01-k3x9q").
func (s *Server) freeNodeName(ctx context.Context, tx store.Tx, tenantID, name string) (string, error) {
	candidate := name
	for range nodeNameClashAttempts {
		var taken bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nodes WHERE tenant_id = $1 AND name = $2 AND deleted_at IS NULL)`,
			tenantID, candidate).Scan(&taken); err != nil {
			return "", err
		}
		if !taken {
			return candidate, nil
		}
		var b [5]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", err
		}
		base := strings.TrimRight(name[:min(len(name), nodeNameMaxLength-1-nodeNameSuffixLength)], "-")
		candidate = base + "-" + tokenEncoding.EncodeToString(b[:])[:nodeNameSuffixLength]
	}
	return "", core.Errorf(core.CodeConflict, "no free node name near %q", name).WithDetails(map[string]any{"field": "name"})
}

// issueIdentity signs the CSR for the node and records the identity.
func (s *Server) issueIdentity(ctx context.Context, tx store.Tx, nodeID string, csrPEM []byte) ([]byte, error) {
	certPEM, serial, err := s.deps.NodeCA.SignNode(csrPEM, nodeID, NodeCertificateTTL)
	if err != nil {
		return nil, badField("csr", "invalid", "the certificate request cannot be signed")
	}
	b, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, err
	}
	if _, err := store.RecordNodeIdentity(ctx, tx, store.NodeIdentity{NodeID: nodeID, Serial: serial,
		Certificate: string(certPEM), ExpiresAt: cert.NotAfter}); err != nil {
		return nil, err
	}
	if err := addNodeEvent(ctx, tx, nodeID, EventIdentityIssued, "node certificate issued",
		map[string]any{"serial": serial, "expiresAt": cert.NotAfter.UnixMilli()}); err != nil {
		return nil, err
	}
	return certPEM, nil
}

package nodes

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/base32"
	"encoding/pem"
	"errors"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/pools"
)

// Joining: a machine presents a join token, its name, its inventory and a
// certificate request; Admit makes (or finds) its node and records the
// identity the node CA signs. Neither a token, a request secret nor any
// private key is ever stored.

// CertificateTTL is how long a node certificate issued at join is valid.
const CertificateTTL = 90 * 24 * time.Hour

// JoinRequestSecretPrefix starts every join request secret.
const JoinRequestSecretPrefix = "bcjr_"

const (
	nameMaxLength     = 63
	nameSuffixLength  = 5
	nameClashAttempts = 8
)

// namePattern is a DNS label (RFC 1123), lower case.
var namePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// secretEncoding is lower-case base32 (RFC 4648 alphabet), no padding, as
// site tokens.
var secretEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Candidate is a checked join: what the node is made from.
type Candidate struct {
	Name        string
	Inventory   []byte
	HardwareKey inventory.HardwareKey
	CSR         []byte
}

// CheckJoin validates a join's input before anything is spent.
func CheckJoin(token, name string, inv []byte, csr string) (Candidate, error) {
	if token == "" {
		return Candidate{}, badField("token", "required", "a join token is required")
	}
	name = strings.ToLower(name)
	if !namePattern.MatchString(name) {
		return Candidate{}, badField("name", "pattern", "name must be a DNS label: 1 to 63 letters, digits and hyphens, not starting or ending with a hyphen")
	}
	if len(bytes.TrimSpace(inv)) == 0 {
		return Candidate{}, badField("inventory", "required", "a NodeInventory v1 document is required")
	}
	doc, err := inventory.Parse(inv)
	if err != nil {
		return Candidate{}, err
	}
	if err := checkCSR([]byte(csr)); err != nil {
		return Candidate{}, err
	}
	return Candidate{Name: name, Inventory: inv, HardwareKey: inventory.ComputeHardwareKey(doc), CSR: []byte(csr)}, nil
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

// NewRequestSecret returns a join request secret ("bcjr_" and 32 random
// bytes in lower-case base32) and its SHA-256, the only form stored.
func NewRequestSecret() (string, []byte, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, err
	}
	secret := JoinRequestSecretPrefix + secretEncoding.EncodeToString(b[:])
	return secret, HashRequestSecret(secret), nil
}

// NewJoinTokenSecret returns a join token ("bcjt_" and 32 random bytes in
// lower-case base32, as site tokens) and its SHA-256, the only form stored.
func NewJoinTokenSecret() (string, []byte, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, err
	}
	tok := JoinTokenPrefix + secretEncoding.EncodeToString(b[:])
	return tok, HashJoinToken(tok), nil
}

// Signer signs a node's certificate request: the certificate (PEM), its
// serial, or an error when the request cannot be signed.
type Signer func(csrPEM []byte, nodeID string, ttl time.Duration) (certPEM []byte, serial string, err error)

// Admitted is what Admit made: the node and its certificate.
type Admitted struct {
	NodeID      string
	Certificate []byte
}

// Admit makes (or finds) the joining machine's node in pool, ingests its
// inventory, and has sign issue its certificate for the CSR, all in tx. A
// machine whose trusted hardware key matches a live node of the pool gets
// that node back (a reinstall): its earlier identities are revoked. Any
// other gets a new node: role host, provision state adopted (adopting while
// the pool's acceptance checks await nodes.adopt), disconnected, trust from
// the pool's owner (rootTenant's pools are the platform's), observed
// generation 0 (it has applied no NodeSpec yet, so it is not schedulable
// until it does). by is who admitted it.
func Admit(ctx context.Context, tx store.Tx, t Types, pool pools.Pool, cand Candidate, by, rootTenant string, sign Signer) (Admitted, error) {
	if pool.ArchivedAt != nil {
		return Admitted{}, core.Errorf(core.CodeInvalidState, "the pool is archived").
			WithDetails(map[string]any{"reason": JoinTokenPoolArchived})
	}
	nodeID, err := matchNode(ctx, tx, pool.ID, cand.HardwareKey)
	if err != nil {
		return Admitted{}, err
	}
	if nodeID != "" {
		if _, err := RevokeNodeIdentities(ctx, tx, nodeID, by); err != nil {
			return Admitted{}, err
		}
		if err := AddEvent(ctx, tx, nodeID, EventIdentityRevoked, "identities revoked: the machine joined again",
			map[string]any{"by": by}); err != nil {
			return Admitted{}, err
		}
	} else {
		name, err := freeName(ctx, tx, pool.TenantID, cand.Name)
		if err != nil {
			return Admitted{}, err
		}
		nn := NewNode{PoolID: pool.ID, Name: name, ProvisionState: joinedState(pool.Policy), Role: nodestate.RoleHost,
			Trust: nodestate.TrustPlatform, Connectivity: nodestate.Disconnected, ObservedGeneration: 0}
		if pool.TenantID != rootTenant {
			nn.Trust, nn.OwnerTenantID = nodestate.TrustTenantOwned, pool.TenantID
		}
		n, err := Create(ctx, tx, t, nn)
		if err != nil {
			return Admitted{}, err
		}
		nodeID = n.ID
	}
	if err := AddEvent(ctx, tx, nodeID, EventJoined, "joined pool "+pool.ID,
		map[string]any{"poolId": pool.ID, "by": by}); err != nil {
		return Admitted{}, err
	}
	return admitted(ctx, tx, t, nodeID, cand, sign)
}

// Rejoin admits the machine of a node that presented a credential bound to
// that node (a deploy boot's token, whose caller checked the hardware key):
// the node's earlier identities are revoked, its inventory ingested and a
// certificate issued, with no approval, since the operator who deployed it
// already decided. by is the credential.
func Rejoin(ctx context.Context, tx store.Tx, t Types, nodeID string, cand Candidate, by string, sign Signer) (Admitted, error) {
	if _, err := RevokeNodeIdentities(ctx, tx, nodeID, by); err != nil {
		return Admitted{}, err
	}
	if err := AddEvent(ctx, tx, nodeID, EventJoined, "the deployed system joined", map[string]any{"by": by}); err != nil {
		return Admitted{}, err
	}
	return admitted(ctx, tx, t, nodeID, cand, sign)
}

// admitted ingests a joined machine's inventory and issues its identity.
func admitted(ctx context.Context, tx store.Tx, t Types, nodeID string, cand Candidate, sign Signer) (Admitted, error) {
	if _, err := Ingest(ctx, tx, t, nodeID, cand.Inventory); err != nil {
		return Admitted{}, err
	}
	certPEM, err := issueIdentity(ctx, tx, nodeID, cand.CSR, sign)
	if err != nil {
		return Admitted{}, err
	}
	return Admitted{NodeID: nodeID, Certificate: certPEM}, nil
}

// matchNode finds the live node of the pool with this trusted hardware
// key, locked; "" when the key is not trusted, empty, or new.
func matchNode(ctx context.Context, tx store.Tx, poolID string, hk inventory.HardwareKey) (string, error) {
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

// freeName is name when no live node of the tenant has it, else name
// with a short random suffix ("gpu-01-k3x9q").
func freeName(ctx context.Context, tx store.Tx, tenantID, name string) (string, error) {
	candidate := name
	for range nameClashAttempts {
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
		base := strings.TrimRight(name[:min(len(name), nameMaxLength-1-nameSuffixLength)], "-")
		candidate = base + "-" + secretEncoding.EncodeToString(b[:])[:nameSuffixLength]
	}
	return "", core.Errorf(core.CodeConflict, "no free node name near %q", name).WithDetails(map[string]any{"field": "name"})
}

// issueIdentity signs the CSR for the node and records the identity.
func issueIdentity(ctx context.Context, tx store.Tx, nodeID string, csrPEM []byte, sign Signer) ([]byte, error) {
	certPEM, serial, err := sign(csrPEM, nodeID, CertificateTTL)
	if err != nil {
		return nil, badField("csr", "invalid", "the certificate request cannot be signed")
	}
	b, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, err
	}
	if _, err := RecordNodeIdentity(ctx, tx, NodeIdentity{NodeID: nodeID, Serial: serial,
		Certificate: string(certPEM), ExpiresAt: cert.NotAfter}); err != nil {
		return nil, err
	}
	if err := AddEvent(ctx, tx, nodeID, EventIdentityIssued, "node certificate issued",
		map[string]any{"serial": serial, "expiresAt": cert.NotAfter.UnixMilli()}); err != nil {
		return nil, err
	}
	return certPEM, nil
}

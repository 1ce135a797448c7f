// Package sshcerts is the SSH certificates domain: a user certificate
// authority per tenant (the root tenant's is the fleet CA of platform
// nodes), created on first use with its private key sealed by the secret
// store, and the short-lived certificates nodes.issueSshCert signs, each
// bound to one node. It is the only writer of ssh_cas and
// ssh_certificates; store/nodes reads them for the NodeSpec's sshd trust
// (spec_ssh.go).
//
// A certificate for node A never opens node B, although both trust the
// same CA: its principals are <user>@<nodeId>, and the node's sshd accepts
// a user's certificate only when one of its principals is in the user's
// AuthorizedPrincipalsFile, which bcd writes with that node's id alone.
package sshcerts

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/nodes"
	"github.com/better-compute/better-compute/store/secrets"
)

// Id prefixes.
const (
	IDPrefix   = "sshc"
	CAIDPrefix = "sshca"
)

// A certificate's bounds.
const (
	DefaultTTL    = time.Hour
	MinTTL        = time.Minute
	MaxTTL        = 24 * time.Hour
	MaxPrincipals = 16
	MaxComment    = 256
	// Backdate is how far before the issue a certificate is valid from, so
	// a node whose clock is a little behind accepts it at once.
	Backdate = time.Minute
	// MinRSABits is the smallest RSA user key accepted.
	MinRSABits = 2048
)

// DefaultUser is the principal a certificate names when none is asked for.
const DefaultUser = "root"

// Certificate states.
const (
	StateActive  = "active"
	StateExpired = "expired"
	StateRevoked = "revoked"
)

// States are the states a certificate may be in.
var States = []string{StateActive, StateExpired, StateRevoked}

// Node event types.
const (
	EventIssued  = "SshCertificateIssued"
	EventRevoked = "SshCertificateRevoked"
)

// sealPurpose binds a CA's sealed private key to what it is.
const sealPurpose = "ssh-user-ca"

// userPattern is a Unix user name, as Debian's adduser accepts it.
var userPattern = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// UserPattern is the grammar of a certificate's users (the schema's too).
const UserPattern = `^[a-z_][a-z0-9_-]{0,31}$`

// Certificate is an issued certificate as the methods answer it.
type Certificate struct {
	ID       string `json:"id"`
	TenantID string `json:"tenantId"`
	NodeID   string `json:"nodeId"`
	// Serial is unique per CA.
	Serial int64 `json:"serial"`
	// KeyID names the identity that asked for it, the node and the
	// certificate (sshd logs it with every login).
	KeyID string `json:"keyId"`
	// Users are the Unix users it logs in as; Principals what the
	// certificate carries: <user>@<nodeId> for each.
	Users      []string `json:"users"`
	Principals []string `json:"principals"`
	// PublicKey is the user's key the certificate certifies, Fingerprint
	// its SHA-256 fingerprint.
	PublicKey   string `json:"publicKey"`
	Fingerprint string `json:"fingerprint"`
	// Certificate is the certificate in authorized_keys format (the
	// file to pass as ssh's CertificateFile).
	Certificate string `json:"certificate"`
	CAPublicKey string `json:"caPublicKey"`
	Comment     string `json:"comment,omitempty"`
	ValidAfter  int64  `json:"validAfter"`
	ValidBefore int64  `json:"validBefore"`
	State       string `json:"state"`
	IssuedBy    string `json:"issuedBy"`
	CreatedAt   int64  `json:"createdAt"`
	RevokedAt   *int64 `json:"revokedAt,omitempty"`
	RevokedBy   string `json:"revokedBy,omitempty"`
}

// Key is the certificate's place in its node's list.
func (c Certificate) Key() store.Key { return store.Key{At: c.CreatedAt, ID: c.ID} }

// NotFound is the error of a certificate that is missing, another node's
// or another tenant's: the same for all.
func NotFound(id string) error {
	return core.Errorf(core.CodeNotFound, "SSH certificate %s not found", id)
}

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// IssueRequest is one nodes.issueSshCert.
type IssueRequest struct {
	TenantID, NodeID string
	// PublicKey is one authorized_keys line (no options).
	PublicKey string
	// Users are the Unix users (default [DefaultUser]).
	Users []string
	// TTL is how long it is valid from now (default DefaultTTL).
	TTL     time.Duration
	Comment string
	By      string // the caller's identity
}

// Issue signs a certificate for the request with the node's tenant's CA
// (created on first use), stores it and bumps the node's NodeSpec
// generation so its agent writes the user's principals, all in the
// caller's transaction. Another tenant's node is NOT_FOUND.
func Issue(ctx context.Context, tx store.Tx, vault *secrets.Vault, r IssueRequest) (Certificate, error) {
	pub, err := ParsePublicKey(r.PublicKey)
	if err != nil {
		return Certificate{}, err
	}
	users, err := checkUsers(r.Users)
	if err != nil {
		return Certificate{}, err
	}
	ttl := r.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < MinTTL || ttl > MaxTTL {
		return Certificate{}, badField("ttlSeconds", "range", "ttlSeconds must be between %d and %d", int(MinTTL.Seconds()), int(MaxTTL.Seconds()))
	}
	if err := checkComment(r.Comment); err != nil {
		return Certificate{}, err
	}
	node, err := nodes.Get(ctx, tx, r.TenantID, r.NodeID, true)
	if err != nil {
		return Certificate{}, err
	}
	if node.Adapter != "bcd/v1" {
		return Certificate{}, core.Errorf(core.CodeInvalidState, "node %s has no bcd agent to keep its sshd's trust (adapter %s)", node.ID, node.Adapter).
			WithDetails(map[string]any{"reason": "adapter", "adapter": node.Adapter})
	}
	fingerprint := ssh.FingerprintSHA256(pub)
	var isCA bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM ssh_cas WHERE fingerprint = $1)`, fingerprint).Scan(&isCA); err != nil {
		return Certificate{}, fmt.Errorf("sshcerts: %w", err)
	}
	if isCA {
		return Certificate{}, badField("publicKey", "caKey", "publicKey is a certificate authority's key, not a user's")
	}
	ca, signer, err := ensureCA(ctx, tx, vault, r.TenantID)
	if err != nil {
		return Certificate{}, err
	}
	var serial int64
	if err := tx.QueryRow(ctx, `UPDATE ssh_cas SET next_serial = next_serial + 1 WHERE id = $1 RETURNING next_serial - 1`,
		ca.id).Scan(&serial); err != nil {
		return Certificate{}, fmt.Errorf("sshcerts: the next serial: %w", err)
	}
	id := core.NewID(IDPrefix)
	now := time.Now().Truncate(time.Second)
	after, before := now.Add(-Backdate), now.Add(ttl)
	principals := make([]string, len(users))
	for i, u := range users {
		principals[i] = Principal(u, node.ID)
	}
	cert := &ssh.Certificate{
		Key: pub, Serial: uint64(serial), CertType: ssh.UserCert,
		KeyId:           fmt.Sprintf("%s@%s:%s", r.By, node.ID, id),
		ValidPrincipals: principals,
		ValidAfter:      uint64(after.Unix()), ValidBefore: uint64(before.Unix()),
		Permissions: ssh.Permissions{Extensions: map[string]string{
			"permit-pty": "", "permit-port-forwarding": "", "permit-agent-forwarding": "", "permit-user-rc": "",
		}},
	}
	if err := cert.SignCert(rand.Reader, signer); err != nil {
		return Certificate{}, fmt.Errorf("sshcerts: signing: %w", err)
	}
	text := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cert)))
	if r.Comment != "" {
		text += " " + r.Comment
	}
	keyText := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
	if _, err := tx.Exec(ctx, `INSERT INTO ssh_certificates (id, tenant_id, node_id, ca_id, serial, key_id, users, principals,
			public_key, key_fingerprint, certificate, comment, valid_after, valid_before, issued_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`,
		id, r.TenantID, node.ID, ca.id, serial, cert.KeyId, users, principals, keyText, fingerprint, text, r.Comment,
		after, before, r.By); err != nil {
		return Certificate{}, fmt.Errorf("sshcerts: storing the certificate: %w", err)
	}
	if err := nodes.BumpGeneration(ctx, tx, node.ID); err != nil {
		return Certificate{}, err
	}
	if err := nodes.AddEvent(ctx, tx, node.ID, EventIssued, fmt.Sprintf("SSH certificate %s (serial %d) issued for %s by %s",
		id, serial, strings.Join(users, ", "), r.By), map[string]any{"certificateId": id, "serial": serial, "users": users,
		"validBefore": before.UnixMilli(), "by": r.By}); err != nil {
		return Certificate{}, err
	}
	return Get(ctx, tx, r.TenantID, node.ID, id)
}

// Principal is what a certificate names for user on node: sshd on that
// node lists exactly these in user's AuthorizedPrincipalsFile.
func Principal(user, nodeID string) string { return user + "@" + nodeID }

// Revoke revokes the node's certificate id and, when it has not expired
// yet, bumps the node's NodeSpec generation in the same transaction, so
// its agent adds it to sshd's revocation list. Revoking a revoked
// certificate answers it as it is.
func Revoke(ctx context.Context, tx store.Tx, tenantID, nodeID, id, by string) (Certificate, error) {
	if _, err := nodes.Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return Certificate{}, err
	}
	var live bool
	err := tx.QueryRow(ctx, `UPDATE ssh_certificates SET revoked_at = now(), revoked_by = $4
		WHERE id = $1 AND tenant_id = $2 AND node_id = $3 AND revoked_at IS NULL RETURNING valid_before > now()`,
		id, tenantID, nodeID, by).Scan(&live)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Get(ctx, tx, tenantID, nodeID, id) // already revoked, or not found
	case err != nil:
		return Certificate{}, fmt.Errorf("sshcerts: revoking %s: %w", id, err)
	}
	if live {
		if err := nodes.BumpGeneration(ctx, tx, nodeID); err != nil {
			return Certificate{}, err
		}
	}
	if err := nodes.AddEvent(ctx, tx, nodeID, EventRevoked, fmt.Sprintf("SSH certificate %s revoked by %s", id, by),
		map[string]any{"certificateId": id, "by": by}); err != nil {
		return Certificate{}, err
	}
	return Get(ctx, tx, tenantID, nodeID, id)
}

const columns = `c.id, c.tenant_id, c.node_id, c.serial, c.key_id, c.users, c.principals, c.public_key, c.key_fingerprint,
	c.certificate, a.public_key, c.comment, c.valid_after, c.valid_before, ` + stateSQL + `, c.issued_by, c.created_at,
	c.revoked_at, c.revoked_by`

const stateSQL = `CASE WHEN c.revoked_at IS NOT NULL THEN 'revoked' WHEN c.valid_before <= now() THEN 'expired' ELSE 'active' END`

const fromSQL = ` FROM ssh_certificates c JOIN ssh_cas a ON a.id = c.ca_id`

func scan(row pgx.Row) (Certificate, error) {
	var c Certificate
	var after, before, created time.Time
	var revoked *time.Time
	if err := row.Scan(&c.ID, &c.TenantID, &c.NodeID, &c.Serial, &c.KeyID, &c.Users, &c.Principals, &c.PublicKey, &c.Fingerprint,
		&c.Certificate, &c.CAPublicKey, &c.Comment, &after, &before, &c.State, &c.IssuedBy, &created, &revoked, &c.RevokedBy); err != nil {
		return Certificate{}, err
	}
	c.ValidAfter, c.ValidBefore, c.CreatedAt = after.UnixMilli(), before.UnixMilli(), created.UnixMilli()
	if revoked != nil {
		ms := revoked.UnixMilli()
		c.RevokedAt = &ms
	}
	return c, nil
}

// Get reads the node's certificate id; NOT_FOUND when it is missing or
// another node's or tenant's.
func Get(ctx context.Context, tx store.Tx, tenantID, nodeID, id string) (Certificate, error) {
	c, err := scan(tx.QueryRow(ctx, `SELECT `+columns+fromSQL+` WHERE c.id = $1 AND c.tenant_id = $2 AND c.node_id = $3`,
		id, tenantID, nodeID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Certificate{}, NotFound(id)
	}
	return c, err
}

// List reads a page of the node's certificates, oldest first, in state
// when one is given; another tenant's node is NOT_FOUND.
func List(ctx context.Context, tx store.Tx, tenantID, nodeID, state string, page store.PageQuery) ([]Certificate, error) {
	if state != "" && !slices.Contains(States, state) {
		return nil, badField("state", "enum", "state must be one of %s", strings.Join(States, ", "))
	}
	if _, err := nodes.Get(ctx, tx, tenantID, nodeID, false); err != nil {
		return nil, err
	}
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+columns+fromSQL+`
		WHERE c.tenant_id = $1 AND c.node_id = $2 AND ($3 = '' OR `+stateSQL+` = $3)
		  AND (`+store.MsOf("c.created_at")+`, c.id) > ($5, $6)
		ORDER BY `+store.MsOf("c.created_at")+`, c.id LIMIT $4`, tenantID, nodeID, state, page.Fetch(), after.At, after.ID)
	if err != nil {
		return nil, fmt.Errorf("sshcerts: listing: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Certificate, error) { return scan(r) })
}

// ParsePublicKey reads a user's public key: one authorized_keys line
// ("<type> <base64> [comment]") of a key type sshd accepts, without
// options. A certificate, a CA line or anything else is INVALID_INPUT.
func ParsePublicKey(line string) (ssh.PublicKey, error) {
	line = strings.TrimRight(line, "\r\n")
	if strings.ContainsAny(line, "\r\n") {
		return nil, badField("publicKey", "multiple", "publicKey must be one authorized_keys line")
	}
	pub, _, options, rest, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return nil, badField("publicKey", "format", "publicKey must be an authorized_keys line: <type> <base64> [comment]")
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		return nil, badField("publicKey", "multiple", "publicKey must be one authorized_keys line")
	}
	if len(options) > 0 {
		return nil, badField("publicKey", "options", "publicKey must be the key alone, without options such as %q", options[0])
	}
	if _, ok := pub.(*ssh.Certificate); ok {
		return nil, badField("publicKey", "certificate", "publicKey is a certificate: give the user's public key")
	}
	switch pub.Type() {
	case ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521,
		ssh.KeyAlgoSKED25519, ssh.KeyAlgoSKECDSA256:
	case ssh.KeyAlgoRSA:
		var rk *rsa.PublicKey
		if ck, ok := pub.(ssh.CryptoPublicKey); ok {
			rk, _ = ck.CryptoPublicKey().(*rsa.PublicKey)
		}
		if rk == nil || rk.N.BitLen() < MinRSABits {
			return nil, badField("publicKey", "keySize", "an RSA publicKey must have at least %d bits", MinRSABits)
		}
	default:
		return nil, badField("publicKey", "keyType", "publicKey's type %s is not accepted (ed25519, ecdsa or RSA of %d bits or more)",
			pub.Type(), MinRSABits)
	}
	return pub, nil
}

func checkUsers(users []string) ([]string, error) {
	if len(users) == 0 {
		return []string{DefaultUser}, nil
	}
	if len(users) > MaxPrincipals {
		return nil, badField("principals", "maxItems", "principals names at most %d users", MaxPrincipals)
	}
	for i, u := range users {
		if !userPattern.MatchString(u) {
			return nil, badField("principals", "pattern", "principals[%d] must be a Unix user name (%s)", i, UserPattern)
		}
		if slices.Contains(users[:i], u) {
			return nil, badField("principals", "uniqueItems", "principals names %s twice", u)
		}
	}
	return slices.Clone(users), nil
}

func checkComment(c string) error {
	if len(c) > MaxComment {
		return badField("comment", "maxLength", "comment has at most %d bytes", MaxComment)
	}
	for _, r := range c {
		if !unicode.IsPrint(r) {
			return badField("comment", "pattern", "comment must be printable text on one line")
		}
	}
	return nil
}

// ca is a tenant's live certificate authority.
type ca struct {
	id, publicKey string
}

// ensureCA answers the tenant's live CA and its signer, making the CA on
// first use: a fresh Ed25519 key whose seed is sealed by the vault, bound
// to the tenant and the CA's id. Concurrent first uses make one CA.
func ensureCA(ctx context.Context, tx store.Tx, vault *secrets.Vault, tenantID string) (ca, ssh.Signer, error) {
	if !vault.Configured() {
		// Sealing answers the UNAVAILABLE (noKek) the vault gives.
		if _, _, err := vault.Seal(sealPurpose, nil, nil); err != nil {
			return ca{}, nil, err
		}
	}
	for range 2 {
		var c ca
		var kekID string
		var sealed []byte
		err := tx.QueryRow(ctx, `SELECT id, public_key, kek_id, sealed FROM ssh_cas WHERE tenant_id = $1 AND retired_at IS NULL`,
			tenantID).Scan(&c.id, &c.publicKey, &kekID, &sealed)
		if err == nil {
			signer, err := openCA(vault, tenantID, c, kekID, sealed)
			return c, signer, err
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return ca{}, nil, fmt.Errorf("sshcerts: reading the CA: %w", err)
		}
		if err := createCA(ctx, tx, vault, tenantID); err != nil {
			return ca{}, nil, err
		}
	}
	return ca{}, nil, fmt.Errorf("sshcerts: tenant %s's CA vanished while it was made", tenantID)
}

// createCA inserts a new CA for the tenant unless a concurrent call made
// one first (the partial unique index on the live CA).
func createCA(ctx context.Context, tx store.Tx, vault *secrets.Vault, tenantID string) error {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("sshcerts: generating the CA key: %w", err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return fmt.Errorf("sshcerts: %w", err)
	}
	id := core.NewID(CAIDPrefix)
	kekID, sealed, err := vault.Seal(sealPurpose, priv.Seed(), caAD(tenantID, id))
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO ssh_cas (id, tenant_id, public_key, fingerprint, kek_id, sealed)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant_id) WHERE retired_at IS NULL DO NOTHING`,
		id, tenantID, caLine(sshPub, tenantID), ssh.FingerprintSHA256(sshPub), kekID, sealed)
	if err != nil {
		return fmt.Errorf("sshcerts: storing the CA: %w", err)
	}
	return nil
}

// caLine is the CA's public key in authorized_keys format, its comment
// naming the tenant (what TrustedUserCAKeys lists).
func caLine(pub ssh.PublicKey, tenantID string) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))) + " better-compute-user-ca:" + tenantID
}

// openCA opens the CA's sealed seed and checks it is the key the row
// names: a row whose seed opens to another key (tampered) signs nothing.
func openCA(vault *secrets.Vault, tenantID string, c ca, kekID string, sealed []byte) (ssh.Signer, error) {
	seed, err := vault.Open(sealPurpose, kekID, sealed, caAD(tenantID, c.id))
	if err != nil {
		return nil, err
	}
	if len(seed) != ed25519.SeedSize {
		return nil, core.Errorf(core.CodeInternal, "the SSH CA %s's sealed key is malformed", c.id)
	}
	signer, err := ssh.NewSignerFromKey(ed25519.NewKeyFromSeed(seed))
	if err != nil {
		return nil, fmt.Errorf("sshcerts: %w", err)
	}
	if caLine(signer.PublicKey(), tenantID) != c.publicKey {
		return nil, core.Errorf(core.CodeInternal, "the SSH CA %s's sealed key is not its public key", c.id)
	}
	return signer, nil
}

// caAD binds a CA's sealed seed to its tenant and id.
func caAD(tenantID, caID string) []byte { return []byte(tenantID + "\x00" + caID) }

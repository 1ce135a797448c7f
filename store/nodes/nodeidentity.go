package nodes

import (
	"context"
	"crypto/sha256"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// Node identities and join requests. A node identity is one client
// certificate the node CA issued to a node, recorded by its serial: the
// agent listener accepts a session only for a recorded, unrevoked,
// unexpired serial (NodeIdentityValid). A join request is a join to a pool
// whose policy asks for approval; it holds what the join sent (name,
// inventory, CSR) until joinRequests.approve or .reject decides it.

// NodeIdentityRevokedChannel is the channel RevokeNodeIdentities notifies,
// in the revoking transaction, with the node's id as the payload: a process
// holding that node's session closes it.
const NodeIdentityRevokedChannel = "node_identity_revoked"

// NodeIdentity is a node_identities row.
type NodeIdentity struct {
	NodeID      string
	Serial      string // hex, as nodeca.Serial writes it
	Certificate string // PEM
	IssuedAt    time.Time
	ExpiresAt   time.Time
	RevokedAt   *time.Time
	RevokedBy   string
}

// RecordNodeIdentity records a certificate the node CA issued (IssuedAt is
// the database's now()).
func RecordNodeIdentity(ctx context.Context, tx store.Tx, id NodeIdentity) (NodeIdentity, error) {
	if id.NodeID == "" || id.Serial == "" || id.Certificate == "" || id.ExpiresAt.IsZero() {
		return NodeIdentity{}, errors.New("store: a node identity needs a node, a serial, a certificate and an expiry")
	}
	err := tx.QueryRow(ctx, `INSERT INTO node_identities (node_id, serial, certificate, expires_at)
		VALUES ($1, $2, $3, $4) RETURNING issued_at`, id.NodeID, id.Serial, id.Certificate, id.ExpiresAt).Scan(&id.IssuedAt)
	return id, err
}

// NodeIdentityValid reports whether serial is a recorded identity of the
// node that is neither revoked nor expired (by the database's clock). The
// agent listener asks it for every new session.
func NodeIdentityValid(ctx context.Context, db store.DBTX, nodeID, serial string) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM node_identities i JOIN nodes n ON n.id = i.node_id
		WHERE i.serial = $1 AND i.node_id = $2 AND i.revoked_at IS NULL AND i.expires_at > now()
		AND n.deleted_at IS NULL)`, serial, nodeID).Scan(&ok)
	return ok, err
}

// ListNodeIdentities reads the node's identities, newest first.
func ListNodeIdentities(ctx context.Context, db store.DBTX, nodeID string) ([]NodeIdentity, error) {
	rows, err := db.Query(ctx, `SELECT node_id, serial, certificate, issued_at, expires_at, revoked_at, revoked_by
		FROM node_identities WHERE node_id = $1 ORDER BY issued_at DESC, serial`, nodeID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeIdentity, error) {
		var i NodeIdentity
		err := r.Scan(&i.NodeID, &i.Serial, &i.Certificate, &i.IssuedAt, &i.ExpiresAt, &i.RevokedAt, &i.RevokedBy)
		return i, err
	})
}

// RevokeNodeIdentities revokes every unrevoked identity of the node, by
// (an identity id, or what revoked it), and answers how many it revoked.
// It notifies NodeIdentityRevokedChannel with the node id in the
// transaction (delivered on commit), even when nothing was left to revoke,
// so a session that somehow outlived its identity is closed too.
func RevokeNodeIdentities(ctx context.Context, tx store.Tx, nodeID, by string) (int, error) {
	tag, err := tx.Exec(ctx, `UPDATE node_identities SET revoked_at = now(), revoked_by = $2
		WHERE node_id = $1 AND revoked_at IS NULL`, nodeID, by)
	if err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, NodeIdentityRevokedChannel, nodeID); err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// Join request states. A pending request past its expiry reads as
// JoinRequestExpired.
const (
	JoinRequestPending  = "pending"
	JoinRequestApproved = "approved"
	JoinRequestRejected = "rejected"
	JoinRequestExpired  = "expired"
)

// JoinRequestTTL is how long a join request waits for a decision.
const JoinRequestTTL = 24 * time.Hour

// JoinRequest is a join_requests row, without its secret's hash.
type JoinRequest struct {
	ID          string
	TenantID    string
	PoolID      string
	JoinTokenID string
	Name        string
	HardwareKey string
	Inventory   []byte // NodeInventory v1
	CSR         string // PEM
	State       string // derived: pending past expires_at reads expired
	NodeID      string // set on approval
	Certificate string // PEM, set on approval
	DecidedBy   string
	DecidedAt   *time.Time
	CreatedAt   time.Time
	ExpiresAt   time.Time
}

// HashRequestSecret is the stored form of a join request's secret: its
// SHA-256 (the secret carries 256 random bits, as join tokens).
func HashRequestSecret(secret string) []byte {
	sum := sha256.Sum256([]byte(secret))
	return sum[:]
}

const joinRequestColumns = `r.id, r.tenant_id, r.pool_id, r.join_token_id, r.name, r.hardware_key, r.inventory, r.csr,
	CASE WHEN r.state = 'pending' AND r.expires_at <= now() THEN 'expired' ELSE r.state END,
	coalesce(r.node_id, ''), r.certificate, r.decided_by, r.decided_at, r.created_at, r.expires_at`

func scanJoinRequest(row pgx.Row) (JoinRequest, error) {
	var r JoinRequest
	err := row.Scan(&r.ID, &r.TenantID, &r.PoolID, &r.JoinTokenID, &r.Name, &r.HardwareKey, &r.Inventory, &r.CSR,
		&r.State, &r.NodeID, &r.Certificate, &r.DecidedBy, &r.DecidedAt, &r.CreatedAt, &r.ExpiresAt)
	return r, err
}

// NewJoinRequest is what CreateJoinRequest records. SecretHash is
// HashRequestSecret of the secret, never the secret.
type NewJoinRequest struct {
	TenantID    string
	PoolID      string
	JoinTokenID string
	Name        string
	HardwareKey string
	Inventory   []byte
	CSR         string
	SecretHash  []byte
}

// CreateJoinRequest records a pending join request (id jreq_<ULID>),
// expiring JoinRequestTTL from the database's now().
func CreateJoinRequest(ctx context.Context, tx store.Tx, in NewJoinRequest) (JoinRequest, error) {
	if len(in.SecretHash) != sha256.Size {
		return JoinRequest{}, errors.New("store: a join request's secret hash is a SHA-256")
	}
	return scanJoinRequest(tx.QueryRow(ctx, `INSERT INTO join_requests AS r (id, tenant_id, pool_id, join_token_id, name,
		hardware_key, inventory, csr, request_secret_hash, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now() + make_interval(secs => $10)) RETURNING `+joinRequestColumns,
		core.NewID("jreq"), in.TenantID, in.PoolID, in.JoinTokenID, in.Name, in.HardwareKey, string(in.Inventory), in.CSR,
		in.SecretHash, JoinRequestTTL.Seconds()))
}

func joinRequestNotFound(id string) error {
	return core.Errorf(core.CodeNotFound, "join request %s not found", id)
}

// GetJoinRequest reads a join request of the tenant's pool; lock takes it
// for a decision. Any other, or none, is NOT_FOUND.
func GetJoinRequest(ctx context.Context, tx store.Tx, tenantID, poolID, id string, lock bool) (JoinRequest, error) {
	q := `SELECT ` + joinRequestColumns + ` FROM join_requests r WHERE r.id = $1 AND r.pool_id = $2 AND r.tenant_id = $3`
	if lock {
		q += ` FOR UPDATE`
	}
	r, err := scanJoinRequest(tx.QueryRow(ctx, q, id, poolID, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return JoinRequest{}, joinRequestNotFound(id)
	}
	return r, err
}

// GetJoinRequestBySecret reads the join request id whose secret is secret:
// the agent's poll. A wrong secret, or no such request, is
// UNAUTHENTICATED with no details (nothing says which).
func GetJoinRequestBySecret(ctx context.Context, db store.DBTX, id, secret string) (JoinRequest, error) {
	r, err := scanJoinRequest(db.QueryRow(ctx, `SELECT `+joinRequestColumns+` FROM join_requests r
		WHERE r.id = $1 AND r.request_secret_hash = $2`, id, HashRequestSecret(secret)))
	if errors.Is(err, pgx.ErrNoRows) {
		return JoinRequest{}, core.Errorf(core.CodeUnauthn, "the join request or its secret is not valid")
	}
	return r, err
}

// ListJoinRequests reads the join requests of the tenant's pool, oldest
// first (creation millisecond, then id), the page's rows after its key plus
// one; state, when given, filters on the derived state.
func ListJoinRequests(ctx context.Context, tx store.Tx, tenantID, poolID, state string, page store.PageQuery) ([]JoinRequest, error) {
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT * FROM (SELECT `+joinRequestColumns+` FROM join_requests r
		WHERE r.tenant_id = $1 AND r.pool_id = $2) AS q (id, tenant_id, pool_id, join_token_id, name, hardware_key,
		inventory, csr, state, node_id, certificate, decided_by, decided_at, created_at, expires_at)
		WHERE ($3 = '' OR q.state = $3) AND (`+store.MsOf("q.created_at")+`, q.id) > ($5, $6)
		ORDER BY `+store.MsOf("q.created_at")+`, q.id LIMIT $4`, tenantID, poolID, state, page.Fetch(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (JoinRequest, error) { return scanJoinRequest(r) })
}

// JoinRequestDecision is what DecideJoinRequest records: approved (with
// the node and its certificate) or rejected.
type JoinRequestDecision struct {
	State       string // JoinRequestApproved or JoinRequestRejected
	NodeID      string
	Certificate string
	DecidedBy   string
}

// DecideJoinRequest decides a pending, unexpired join request of the
// tenant's pool. One already decided is INVALID_STATE with details.reason
// its state ("approved", "rejected" or "expired").
func DecideJoinRequest(ctx context.Context, tx store.Tx, tenantID, poolID, id string, d JoinRequestDecision) (JoinRequest, error) {
	if d.State != JoinRequestApproved && d.State != JoinRequestRejected {
		return JoinRequest{}, errors.New("store: a join request is approved or rejected")
	}
	if (d.State == JoinRequestApproved) != (d.NodeID != "" && d.Certificate != "") {
		return JoinRequest{}, errors.New("store: an approval, and only it, names a node and its certificate")
	}
	cur, err := GetJoinRequest(ctx, tx, tenantID, poolID, id, true)
	if err != nil {
		return JoinRequest{}, err
	}
	if err := JoinRequestPendingCheck(cur); err != nil {
		return JoinRequest{}, err
	}
	return scanJoinRequest(tx.QueryRow(ctx, `UPDATE join_requests r SET state = $2, node_id = nullif($3, ''),
		certificate = $4, decided_by = $5, decided_at = now() WHERE r.id = $1 RETURNING `+joinRequestColumns,
		id, d.State, d.NodeID, d.Certificate, d.DecidedBy))
}

// JoinRequestPendingCheck is INVALID_STATE, with details.reason the
// request's state, unless the request is pending.
func JoinRequestPendingCheck(r JoinRequest) error {
	if r.State == JoinRequestPending {
		return nil
	}
	return core.Errorf(core.CodeInvalidState, "join request %s is %s", r.ID, r.State).
		WithDetails(map[string]any{"reason": r.State})
}

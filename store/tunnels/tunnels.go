// Package tunnels is the tunnels domain (docs/tunnels.md): a tunnel is one
// caller's single-use way through a node's agent session to a TCP address
// the node dials (its own sshd, an instance's port), or to a command its
// agent runs in an instance (an exec tunnel, OpenExec's). tunnels.open
// records it with its token's SHA-256; the first connect spends the token; the
// gateway records its end. Nothing else writes the tunnels table.
package tunnels

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// IDPrefix is a tunnel id's prefix (tun_<ULID>); TokenPrefix starts every
// tunnel token, a secret shown once.
const (
	IDPrefix    = "tun"
	TokenPrefix = "bctun_"
)

// Limits of an unopened tunnel's ttl, in seconds.
const (
	DefaultTTLSeconds = 60
	MaxTTLSeconds     = 600
)

// Reasons a spend is refused (INVALID_STATE details.reason).
const (
	ReasonSpent   = "spent"
	ReasonExpired = "expired"
)

// Tunnel is a tunnels row, without its token's hash.
type Tunnel struct {
	ID          string
	TenantID    string
	NodeID      string
	InstanceID  string // "" for a node's tunnel
	Target      string
	Address     string
	OpenedBy    string
	CreatedAt   time.Time
	ExpiresAt   time.Time
	ConnectedAt *time.Time
	ClosedAt    *time.Time
	CloseReason string
	// Exec is an exec tunnel's command (Target protocol.TunnelExec), nil
	// for a TCP tunnel; ExecOutputLimit bounds its output (0: the
	// agent's default).
	Exec            *protocol.ExecSpec
	ExecOutputLimit int64
}

// tokenEncoding is lower-case base32 without padding, as the other
// tokens of the API.
var tokenEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewToken returns a tunnel token (TokenPrefix and 32 random bytes) and
// its SHA-256, the only form stored.
func NewToken() (string, []byte, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, err
	}
	tok := TokenPrefix + tokenEncoding.EncodeToString(b[:])
	return tok, HashToken(tok), nil
}

// HashToken is the stored form of a tunnel token: its SHA-256 (256 random
// bits need no salt or slow hash).
func HashToken(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

// NewTunnel is what Create records.
type NewTunnel struct {
	TenantID   string
	NodeID     string
	InstanceID string
	Target     string
	Address    string
	// Hash is HashToken of the token, never the token.
	Hash     []byte
	TTL      time.Duration // from the database's now()
	OpenedBy string
	// Exec is set iff Target is protocol.TunnelExec (Address is then "").
	Exec            *protocol.ExecSpec
	ExecOutputLimit int64
}

const columns = `t.id, t.tenant_id, t.node_id, coalesce(t.instance_id, ''), t.target, t.address, t.opened_by,
	t.created_at, t.expires_at, t.connected_at, t.closed_at, t.close_reason, t.exec, t.exec_output_limit`

func scan(row pgx.Row, more ...any) (Tunnel, error) {
	var t Tunnel
	var spec []byte
	err := row.Scan(append([]any{&t.ID, &t.TenantID, &t.NodeID, &t.InstanceID, &t.Target, &t.Address, &t.OpenedBy,
		&t.CreatedAt, &t.ExpiresAt, &t.ConnectedAt, &t.ClosedAt, &t.CloseReason, &spec, &t.ExecOutputLimit}, more...)...)
	if err == nil && spec != nil {
		t.Exec = &protocol.ExecSpec{}
		if err := json.Unmarshal(spec, t.Exec); err != nil {
			return Tunnel{}, fmt.Errorf("store: tunnel %s's exec: %w", t.ID, err)
		}
	}
	return t, err
}

// Create records an unopened tunnel (the caller has checked its node or
// instance). Its id is tun_<ULID>.
func Create(ctx context.Context, tx store.Tx, in NewTunnel) (Tunnel, error) {
	if len(in.Hash) != sha256.Size {
		return Tunnel{}, errors.New("store: a tunnel token's hash is a SHA-256")
	}
	if (in.Target == protocol.TunnelExec) != (in.Exec != nil) {
		return Tunnel{}, errors.New("store: a tunnel has an exec spec iff its target is exec")
	}
	var instance, spec *string
	if in.InstanceID != "" {
		instance = &in.InstanceID
	}
	if in.Exec != nil {
		b, err := json.Marshal(in.Exec)
		if err != nil {
			return Tunnel{}, err
		}
		s := string(b)
		spec = &s
	}
	return scan(tx.QueryRow(ctx, `INSERT INTO tunnels AS t
		(id, tenant_id, node_id, instance_id, target, address, token_hash, opened_by, expires_at, exec, exec_output_limit)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9), $10::jsonb, $11) RETURNING `+columns,
		core.NewID(IDPrefix), in.TenantID, in.NodeID, instance, in.Target, in.Address, in.Hash, in.OpenedBy, in.TTL.Seconds(),
		spec, in.ExecOutputLimit))
}

// Spend spends the token of tunnel id, in tx: the first connect with the
// right token before the tunnel's expiry marks it connected and answers
// it. An unknown id or a wrong token is UNAUTHENTICATED (the two look
// alike, so nothing tells which tunnel ids exist); the right token of a
// spent or expired tunnel is INVALID_STATE with the reason.
func Spend(ctx context.Context, tx store.Tx, id, token string) (Tunnel, error) {
	var hash []byte
	var expired bool
	t, err := scan(tx.QueryRow(ctx, `SELECT `+columns+`, t.token_hash, t.expires_at <= now()
		FROM tunnels t WHERE t.id = $1 FOR UPDATE`, id), &hash, &expired)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && subtle.ConstantTimeCompare(hash, HashToken(token)) != 1) {
		return Tunnel{}, core.Errorf(core.CodeUnauthn, "the tunnel token is not valid")
	}
	if err != nil {
		return Tunnel{}, err
	}
	switch {
	case t.ConnectedAt != nil:
		return Tunnel{}, core.Errorf(core.CodeInvalidState, "tunnel %s was connected before: a tunnel token serves one connection", id).
			WithDetails(map[string]any{"reason": ReasonSpent})
	case expired:
		return Tunnel{}, core.Errorf(core.CodeInvalidState, "tunnel %s expired unopened", id).
			WithDetails(map[string]any{"reason": ReasonExpired})
	}
	return scan(tx.QueryRow(ctx, `UPDATE tunnels t SET connected_at = now() WHERE t.id = $1 RETURNING `+columns, id))
}

// Close records a connected tunnel's end and why (the first close wins).
func Close(ctx context.Context, db store.DBTX, id, reason string) error {
	_, err := db.Exec(ctx, `UPDATE tunnels SET closed_at = now(), close_reason = $2
		WHERE id = $1 AND connected_at IS NOT NULL AND closed_at IS NULL`, id, reason)
	return err
}

// Get reads the tenant's tunnel; another tenant's or none is NOT_FOUND.
func Get(ctx context.Context, tx store.Tx, tenantID, id string) (Tunnel, error) {
	t, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM tunnels t WHERE t.tenant_id = $1 AND t.id = $2`, tenantID, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Tunnel{}, core.Errorf(core.CodeNotFound, "tunnel %s not found", id)
	}
	return t, err
}

// NodeConnectivity reads a live node's connectivity whatever its tenant:
// an instance's node may be its pool owner's (the caller has checked the
// instance). A node that is gone reads as "lost".
func NodeConnectivity(ctx context.Context, tx store.Tx, nodeID string) (string, error) {
	var c string
	err := tx.QueryRow(ctx, `SELECT connectivity FROM nodes WHERE id = $1 AND deleted_at IS NULL`, nodeID).Scan(&c)
	if errors.Is(err, pgx.ErrNoRows) {
		return "lost", nil
	}
	return c, err
}

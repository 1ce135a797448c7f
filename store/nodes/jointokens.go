package nodes

import (
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// Join tokens: what `bcd node join` presents to join a pool. A token is
// JoinTokenPrefix and 32 random bytes (the API makes it); only its SHA-256
// (HashJoinToken) is stored, so the table never holds one in plain text.
// A token is pool-scoped, expires, and serves at most maxUses joins; its
// state is derived, never stored, from the row and the database's clock.

// JoinTokenPrefix starts every join token.
const JoinTokenPrefix = "bcjt_"

// JoinTokenIDPrefix is the prefix of a join token's id (jt_<ULID>), the
// domain model's; the token itself is a secret and starts JoinTokenPrefix.
const JoinTokenIDPrefix = "jt"

// Join token states, as joinTokens.list reports them. A token that is
// several at once reports the first: revoked, exhausted, expired.
const (
	JoinTokenActive    = "active"
	JoinTokenExpired   = "expired"
	JoinTokenExhausted = "exhausted"
	JoinTokenRevoked   = "revoked"
)

// JoinTokenPoolArchived is ConsumeJoinToken's details.reason for a token
// of an archived pool, which takes no more nodes.
const JoinTokenPoolArchived = "poolArchived"

// JoinToken is a join_tokens row, without its hash.
type JoinToken struct {
	ID        string
	TenantID  string
	PoolID    string
	Name      string
	ExpiresAt time.Time
	MaxUses   int
	Uses      int
	State     string // derived: JoinTokenActive, …Expired, …Exhausted or …Revoked
	CreatedBy string
	CreatedAt time.Time
	RevokedAt *time.Time
}

// HashJoinToken is the stored form of a join token: its SHA-256. A token
// carries 256 random bits, so no salt or slow hash is needed (as site
// tokens).
func HashJoinToken(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

// joinTokenColumns reads a join_tokens row aliased t, its state derived
// with the transaction's now().
const joinTokenColumns = `t.id, t.tenant_id, t.pool_id, t.name, t.expires_at, t.max_uses, t.uses,
	CASE WHEN t.revoked_at IS NOT NULL THEN 'revoked' WHEN t.uses >= t.max_uses THEN 'exhausted'
	     WHEN t.expires_at <= now() THEN 'expired' ELSE 'active' END,
	t.created_by, t.created_at, t.revoked_at`

// scanJoinToken scans joinTokenColumns, then into more (further columns).
func scanJoinToken(row pgx.Row, more ...any) (JoinToken, error) {
	var t JoinToken
	dest := append([]any{&t.ID, &t.TenantID, &t.PoolID, &t.Name, &t.ExpiresAt, &t.MaxUses, &t.Uses, &t.State,
		&t.CreatedBy, &t.CreatedAt, &t.RevokedAt}, more...)
	err := row.Scan(dest...)
	return t, err
}

// NewJoinToken is what CreateJoinToken records. Hash is HashJoinToken of
// the token, never the token.
type NewJoinToken struct {
	TenantID  string
	PoolID    string
	Name      string
	Hash      []byte
	TTL       time.Duration // from the database's now()
	MaxUses   int
	CreatedBy string
}

// CreateJoinToken records a join token of the tenant's pool (the caller
// has checked the pool). Its id is jt_<ULID>.
func CreateJoinToken(ctx context.Context, tx store.Tx, in NewJoinToken) (JoinToken, error) {
	if len(in.Hash) != sha256.Size {
		return JoinToken{}, errors.New("store: a join token's hash is a SHA-256")
	}
	return scanJoinToken(tx.QueryRow(ctx, `INSERT INTO join_tokens AS t
		(id, tenant_id, pool_id, name, token_hash, expires_at, max_uses, created_by)
		VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6), $7, $8) RETURNING `+joinTokenColumns,
		core.NewID(JoinTokenIDPrefix), in.TenantID, in.PoolID, in.Name, in.Hash, in.TTL.Seconds(), in.MaxUses, in.CreatedBy))
}

// ListJoinTokens reads the tenant's join tokens of a pool, every state,
// oldest first (creation millisecond, then id): the page's rows after its
// key, plus one.
func ListJoinTokens(ctx context.Context, tx store.Tx, tenantID, poolID string, page store.PageQuery) ([]JoinToken, error) {
	after := page.AfterKey()
	rows, err := tx.Query(ctx, `SELECT `+joinTokenColumns+` FROM join_tokens t
		WHERE t.tenant_id = $1 AND t.pool_id = $2 AND (`+store.MsOf("t.created_at")+`, t.id) > ($4, $5)
		ORDER BY `+store.MsOf("t.created_at")+`, t.id LIMIT $3`, tenantID, poolID, page.Fetch(), after.At, after.ID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (JoinToken, error) { return scanJoinToken(r) })
}

// RevokeJoinToken revokes a join token of the tenant's pool. Revoking a
// revoked token changes nothing (it keeps its first revokedAt); a token of
// another pool or tenant, or none, is NOT_FOUND.
func RevokeJoinToken(ctx context.Context, tx store.Tx, tenantID, poolID, id string) (JoinToken, error) {
	t, err := scanJoinToken(tx.QueryRow(ctx, `UPDATE join_tokens t SET revoked_at = coalesce(t.revoked_at, now())
		WHERE t.id = $1 AND t.pool_id = $2 AND t.tenant_id = $3 RETURNING `+joinTokenColumns, id, poolID, tenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return JoinToken{}, core.Errorf(core.CodeNotFound, "join token %s not found", id)
	}
	return t, err
}

// ConsumeJoinToken spends one use of a presented join token, in the join's
// transaction (so a failed join gives the use back), and answers the token
// as it is after the use: its tenant and pool are where the node joins.
//
// It fails closed. A token that is malformed or unknown is UNAUTHENTICATED,
// with no details (nothing says whether, or to which pool, it belongs). A
// known token that can no longer join is INVALID_STATE with details.reason
// "revoked", "exhausted", "expired" (checked in that order) or
// "poolArchived"; the details name neither the token nor its pool. The row
// is locked, so concurrent joins never spend more than maxUses.
func ConsumeJoinToken(ctx context.Context, tx store.Tx, token string) (JoinToken, error) {
	if !strings.HasPrefix(token, JoinTokenPrefix) || len(token) > 256 {
		return JoinToken{}, joinTokenUnknown()
	}
	var poolArchived bool
	t, err := scanJoinToken(tx.QueryRow(ctx, `SELECT `+joinTokenColumns+`, p.archived_at IS NOT NULL
		FROM join_tokens t JOIN pools p ON p.id = t.pool_id
		WHERE t.token_hash = $1 FOR UPDATE OF t`, HashJoinToken(token)), &poolArchived)
	if errors.Is(err, pgx.ErrNoRows) {
		return JoinToken{}, joinTokenUnknown()
	}
	if err != nil {
		return JoinToken{}, err
	}
	if t.State != JoinTokenActive {
		return JoinToken{}, joinTokenUnusable(t.State)
	}
	if poolArchived {
		return JoinToken{}, joinTokenUnusable(JoinTokenPoolArchived)
	}
	return scanJoinToken(tx.QueryRow(ctx, `UPDATE join_tokens t SET uses = t.uses + 1
		WHERE t.id = $1 RETURNING `+joinTokenColumns, t.ID))
}

func joinTokenUnknown() error {
	return core.Errorf(core.CodeUnauthn, "the join token is not valid")
}

func joinTokenUnusable(reason string) error {
	return core.Errorf(core.CodeInvalidState, "the join token can no longer join: %s", reason).
		WithDetails(map[string]any{"reason": reason})
}

package iam

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// Limits and grammars of the admin service's inputs.
const (
	MaxPolicyBytes       = 64 << 10
	MaxIdentityGroups    = 32
	DefaultTokenTTL      = 30 * 24 * time.Hour
	MinTokenTTL          = time.Minute
	MaxTokenTTL          = 400 * 24 * time.Hour
	DefaultAdminPageSize = 100
	MaxAdminPageSize     = 1000
)

var (
	tenantIDPattern   = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	groupPattern      = regexp.MustCompile(`^[a-z][a-z0-9-]{0,63}$`)
	policyNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)
	resourceIDPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)
)

// AdminConfig configures NewAdmin.
type AdminConfig struct {
	Store   *store.Store
	Catalog *core.Catalog
	// RootTenantID is the root tenant; "" means DefaultRootTenantID. Only
	// identities of the root tenant may hold root authority.
	RootTenantID string
	Logger       *slog.Logger
	Now          func() time.Time // nil means time.Now
}

// Admin manages the embedded IAM's tenants, identities, tokens, policies
// and relations, and reads the audit chains. Every input is validated
// (INVALID_INPUT with details.field); a missing tenant, identity, session,
// policy or relation is NOT_FOUND and a duplicate CONFLICT. Every change is
// appended, in its own transaction, to the affected tenant's audit chain
// (kind "admin", action "iam:admin:<method>"), with the actor WithAdminActor
// put in the context.
type Admin struct {
	db   *store.Store
	cat  *core.Catalog
	root string
	log  *slog.Logger
	now  func() time.Time
}

// NewAdmin builds the admin service (INVALID_CONFIG without a store or a catalog).
func NewAdmin(cfg AdminConfig) (*Admin, error) {
	if cfg.Store == nil || cfg.Catalog == nil {
		return nil, core.Errorf(core.CodeInvalidConfig, "iam: the admin service needs a store and a catalog")
	}
	a := &Admin{db: cfg.Store, cat: cfg.Catalog, root: cfg.RootTenantID, log: cfg.Logger, now: cfg.Now}
	if a.root == "" {
		a.root = DefaultRootTenantID
	}
	if !tenantIDPattern.MatchString(a.root) {
		return nil, core.Errorf(core.CodeInvalidConfig, "iam: root tenant id %q must match %s", a.root, tenantIDPattern)
	}
	if a.log == nil {
		a.log = slog.Default()
	}
	if a.now == nil {
		a.now = time.Now
	}
	return a, nil
}

// RootTenantID is the configured root tenant.
func (a *Admin) RootTenantID() string { return a.root }

// AdminActor is who makes an admin change, for the audit chain.
type AdminActor struct {
	Caller    *Caller
	RequestID string
}

type adminActorKey struct{}

// WithAdminActor records the actor of the admin calls made with ctx. Without
// one, changes are audited with an empty identity and details.actor
// "system" (Bootstrap, the CLI).
func WithAdminActor(ctx context.Context, actor AdminActor) context.Context {
	return context.WithValue(ctx, adminActorKey{}, actor)
}

// The admin service's records. Times are epoch milliseconds; 0 is unset.

// Tenant is an IAM tenant.
type Tenant struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	PolicyVersion int64  `json:"policyVersion"`
	CreatedAt     int64  `json:"createdAt"`
}

// Identity is a person, service or agent of one tenant.
type Identity struct {
	ID            string   `json:"id"`
	TenantID      string   `json:"tenantId"`
	Kind          string   `json:"kind"`
	Name          string   `json:"name"`
	RootAuthority bool     `json:"rootAuthority"`
	Groups        []string `json:"groups"`
	CreatedAt     int64    `json:"createdAt"`
	DisabledAt    int64    `json:"disabledAt,omitempty"`
}

// Session is a bearer token's session, never the token.
type Session struct {
	ID          string `json:"id"`
	TenantID    string `json:"tenantId"`
	IdentityID  string `json:"identityId"`
	SessionKind string `json:"sessionKind"`
	MFA         bool   `json:"mfa"`
	DelegatedBy string `json:"delegatedBy,omitempty"`
	CreatedAt   int64  `json:"createdAt"`
	ExpiresAt   int64  `json:"expiresAt"`
	RevokedAt   int64  `json:"revokedAt,omitempty"`
}

// CreatedToken is a new token: the plaintext, shown this once, and its session.
type CreatedToken struct {
	Token   string  `json:"token"`
	Session Session `json:"session"`
}

// Policy is a named Cedar document of one tenant.
type Policy struct {
	ID        string `json:"id"`
	TenantID  string `json:"tenantId"`
	Name      string `json:"name"`
	Cedar     string `json:"cedar"`
	CreatedAt int64  `json:"createdAt"`
	UpdatedAt int64  `json:"updatedAt"`
}

// Relation is an identity's relation on a resource, e.g. user on
// compute-pool/pool_….
type Relation struct {
	TenantID     string `json:"tenantId"`
	SubjectID    string `json:"subjectId"`
	Relation     string `json:"relation"`
	ResourceType string `json:"resourceType"`
	ResourceID   string `json:"resourceId"`
	CreatedAt    int64  `json:"createdAt,omitempty"`
}

// Inputs of the admin service.

// CreateTenantInput is the input of CreateTenant.
type CreateTenantInput struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// CreateIdentityInput is the input of CreateIdentity.
type CreateIdentityInput struct {
	TenantID      string   `json:"tenantId"`
	Kind          string   `json:"kind"`
	Name          string   `json:"name"`
	RootAuthority bool     `json:"rootAuthority"`
	Groups        []string `json:"groups"`
}

// SetIdentityGroupsInput is the input of SetIdentityGroups; the groups replace the identity's.
type SetIdentityGroupsInput struct {
	TenantID   string   `json:"tenantId"`
	IdentityID string   `json:"identityId"`
	Groups     []string `json:"groups"`
}

// IdentityRef names an identity of a tenant (GetIdentity, DisableIdentity).
type IdentityRef struct {
	TenantID   string `json:"tenantId"`
	IdentityID string `json:"identityId"`
}

// CreateTokenInput is the input of CreateToken.
type CreateTokenInput struct {
	TenantID    string `json:"tenantId"`
	IdentityID  string `json:"identityId"`
	SessionKind string `json:"sessionKind"`
	MFA         bool   `json:"mfa"`
	// TTLSeconds is the token's lifetime; 0 means DefaultTokenTTL.
	TTLSeconds int64 `json:"ttlSeconds"`
	// DelegatedBy, only for agent sessions: the identity the agent acts for.
	DelegatedBy string `json:"delegatedBy"`
}

// SessionRef names a session of a tenant (RevokeToken).
type SessionRef struct {
	TenantID  string `json:"tenantId"`
	SessionID string `json:"sessionId"`
}

// PutPolicyInput is the input of PutPolicy.
type PutPolicyInput struct {
	TenantID string `json:"tenantId"`
	Name     string `json:"name"`
	Cedar    string `json:"cedar"`
}

// PolicyRef names a policy of a tenant (DeletePolicy).
type PolicyRef struct {
	TenantID string `json:"tenantId"`
	Name     string `json:"name"`
}

// TenantRef names a tenant (GetTenant, ListPolicies, VerifyAudit).
type TenantRef struct {
	TenantID string `json:"tenantId"`
}

// ListRelationsInput is the input of ListRelations.
type ListRelationsInput struct {
	TenantID     string `json:"tenantId"`
	SubjectID    string `json:"subjectId"`    // optional filter
	ResourceType string `json:"resourceType"` // optional filter
	ResourceID   string `json:"resourceId"`   // optional filter (with resourceType)
	Limit        int    `json:"limit"`        // 0 means DefaultAdminPageSize
}

// AuditQuery is the input of AuditEntries.
type AuditQuery struct {
	TenantID string `json:"tenantId"`
	AfterSeq int64  `json:"afterSeq"`
	Limit    int    `json:"limit"` // 0 means DefaultAdminPageSize
}

// admInvalid is INVALID_INPUT naming the field.
func admInvalid(field, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field})
}

func admNotFound(field, format string, args ...any) error {
	return core.Errorf(core.CodeNotFound, format, args...).WithDetails(map[string]any{"field": field})
}

// admText checks a display name: 1..max bytes of printable text, no
// surrounding white space.
func admText(field, s string, max int) error {
	if s == "" || len(s) > max || strings.TrimSpace(s) != s || strings.ContainsFunc(s, unicode.IsControl) {
		return admInvalid(field, "%s must be 1 to %d printable characters without surrounding spaces", field, max)
	}
	return nil
}

func admTenantID(field, id string) error {
	if !tenantIDPattern.MatchString(id) {
		return admInvalid(field, "%s must match %s", field, tenantIDPattern)
	}
	return nil
}

func admIdentityID(field, id string) error {
	if !core.ValidID("idn", id) {
		return admInvalid(field, "%s must be an identity id (idn_…)", field)
	}
	return nil
}

// admGroups validates and normalises (sorted, unique) group names.
func admGroups(groups []string) ([]string, error) {
	if len(groups) > MaxIdentityGroups {
		return nil, admInvalid("groups", "at most %d groups", MaxIdentityGroups)
	}
	out := make([]string, 0, len(groups))
	for _, g := range groups {
		if !groupPattern.MatchString(g) {
			return nil, admInvalid("groups", "group %q must match %s", g, groupPattern)
		}
		out = append(out, g)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func admPageSize(limit int) (int, error) {
	switch {
	case limit == 0:
		return DefaultAdminPageSize, nil
	case limit < 0 || limit > MaxAdminPageSize:
		return 0, admInvalid("limit", "limit must be 1 to %d", MaxAdminPageSize)
	}
	return limit, nil
}

func admMillis(t *time.Time) int64 {
	if t == nil {
		return 0
	}
	return t.UnixMilli()
}

// admPgCode is the SQLSTATE of a PostgreSQL error, "" for others.
func admPgCode(err error) string {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

// admDB wraps a database failure: codes pass through, the rest is internal.
func admDB(err error) error {
	var ce *core.Error
	if errors.As(err, &ce) {
		return err
	}
	return core.Wrap(core.CodeInternal, err, "internal error")
}

// record builds an admin audit record for the tenant's chain.
func (a *Admin) record(ctx context.Context, tenantID, method, resourceType, resourceID string, details map[string]string) auditRecord {
	rec := auditRecord{
		tenantID: tenantID, kind: AuditKindAdmin, action: "iam:admin:" + method,
		resourceType: resourceType, resourceID: resourceID, allowed: true, reason: ReasonAllow,
		details: map[string]string{},
	}
	for k, v := range details {
		rec.details[k] = v
	}
	actor, _ := ctx.Value(adminActorKey{}).(AdminActor)
	rec.requestID = actor.RequestID
	if actor.Caller == nil {
		rec.details["actor"] = "system"
		return rec
	}
	rec.identityID, rec.sessionID = actor.Caller.IdentityID, actor.Caller.SessionID
	if actor.Caller.TenantID != tenantID {
		rec.details["actorTenantId"] = actor.Caller.TenantID
	}
	return rec
}

// change runs fn and appends its audit records in one transaction.
func (a *Admin) change(ctx context.Context, fn func(tx store.Tx) ([]auditRecord, error)) error {
	err := a.db.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		recs, err := fn(tx)
		if err != nil {
			return err
		}
		return auditAppend(ctx, tx, a.now(), recs)
	})
	if err != nil {
		return admDB(err)
	}
	return nil
}

// requireTenant is NOT_FOUND when the tenant does not exist.
func requireTenant(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, field, tenantID string) error {
	var one int
	err := q.QueryRow(ctx, `SELECT 1 FROM iam_tenants WHERE id = $1`, tenantID).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return admNotFound(field, "tenant %q not found", tenantID)
	}
	return err
}

// CreateTenant creates a tenant (CONFLICT when the id is taken).
func (a *Admin) CreateTenant(ctx context.Context, in CreateTenantInput) (Tenant, error) {
	if err := admTenantID("id", in.ID); err != nil {
		return Tenant{}, err
	}
	if err := admText("name", in.Name, 200); err != nil {
		return Tenant{}, err
	}
	now := a.now()
	t := Tenant{ID: in.ID, Name: in.Name, CreatedAt: now.UnixMilli()}
	err := a.change(ctx, func(tx store.Tx) ([]auditRecord, error) {
		_, err := tx.Exec(ctx, `INSERT INTO iam_tenants (id, name, created_at) VALUES ($1, $2, $3)`, in.ID, in.Name, now)
		if admPgCode(err) == "23505" {
			return nil, core.Errorf(core.CodeConflict, "tenant %q exists", in.ID).WithDetails(map[string]any{"field": "id"})
		}
		if err != nil {
			return nil, err
		}
		return []auditRecord{a.record(ctx, in.ID, "createTenant", "iam-tenant", in.ID, map[string]string{"name": in.Name})}, nil
	})
	return t, err
}

// GetTenant reads one tenant.
func (a *Admin) GetTenant(ctx context.Context, in TenantRef) (Tenant, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return Tenant{}, err
	}
	var t Tenant
	var created time.Time
	err := a.db.Pool.QueryRow(ctx, `SELECT id, name, policy_version, created_at FROM iam_tenants WHERE id = $1`,
		in.TenantID).Scan(&t.ID, &t.Name, &t.PolicyVersion, &created)
	if errors.Is(err, pgx.ErrNoRows) {
		return Tenant{}, admNotFound("tenantId", "tenant %q not found", in.TenantID)
	}
	if err != nil {
		return Tenant{}, admDB(err)
	}
	t.CreatedAt = created.UnixMilli()
	return t, nil
}

const identityColumns = `id, tenant_id, kind, name, root_authority, groups, created_at, disabled_at`

func scanIdentity(row pgx.Row) (Identity, error) {
	var i Identity
	var created time.Time
	var disabled *time.Time
	err := row.Scan(&i.ID, &i.TenantID, &i.Kind, &i.Name, &i.RootAuthority, &i.Groups, &created, &disabled)
	i.CreatedAt, i.DisabledAt = created.UnixMilli(), admMillis(disabled)
	if i.Groups == nil {
		i.Groups = []string{}
	}
	return i, err
}

// CreateIdentity creates a person, service or agent. Root authority is only
// for identities of the root tenant; names are unique in a tenant (CONFLICT).
func (a *Admin) CreateIdentity(ctx context.Context, in CreateIdentityInput) (Identity, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return Identity{}, err
	}
	switch in.Kind {
	case KindPerson, KindService, KindAgent:
	default:
		return Identity{}, admInvalid("kind", "kind must be person, service or agent")
	}
	if err := admText("name", in.Name, 128); err != nil {
		return Identity{}, err
	}
	if in.RootAuthority && in.TenantID != a.root {
		return Identity{}, admInvalid("rootAuthority", "only identities of the root tenant may hold root authority")
	}
	groups, err := admGroups(in.Groups)
	if err != nil {
		return Identity{}, err
	}
	now := a.now()
	idn := Identity{ID: core.NewID("idn"), TenantID: in.TenantID, Kind: in.Kind, Name: in.Name,
		RootAuthority: in.RootAuthority, Groups: groups, CreatedAt: now.UnixMilli()}
	err = a.change(ctx, func(tx store.Tx) ([]auditRecord, error) {
		if err := requireTenant(ctx, tx, "tenantId", in.TenantID); err != nil {
			return nil, err
		}
		_, err := tx.Exec(ctx, `INSERT INTO iam_identities (id, tenant_id, kind, name, root_authority, groups, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, idn.ID, idn.TenantID, idn.Kind, idn.Name, idn.RootAuthority, groups, now)
		if admPgCode(err) == "23505" {
			return nil, core.Errorf(core.CodeConflict, "an identity named %q exists in tenant %q", in.Name, in.TenantID).
				WithDetails(map[string]any{"field": "name"})
		}
		if err != nil {
			return nil, err
		}
		return []auditRecord{a.record(ctx, in.TenantID, "createIdentity", "iam-identity", idn.ID, map[string]string{
			"kind": idn.Kind, "name": idn.Name, "rootAuthority": fmt.Sprint(idn.RootAuthority),
			"groups": strings.Join(groups, ","),
		})}, nil
	})
	return idn, err
}

// identityByName reads an identity by its unique name in a tenant.
func (a *Admin) identityByName(ctx context.Context, tenantID, name string) (Identity, error) {
	i, err := scanIdentity(a.db.Pool.QueryRow(ctx, `SELECT `+identityColumns+` FROM iam_identities
		WHERE tenant_id = $1 AND name = $2`, tenantID, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return Identity{}, admNotFound("name", "no identity named %q in tenant %q", name, tenantID)
	}
	if err != nil {
		return Identity{}, admDB(err)
	}
	return i, nil
}

// GetIdentity reads one identity.
func (a *Admin) GetIdentity(ctx context.Context, in IdentityRef) (Identity, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return Identity{}, err
	}
	if err := admIdentityID("identityId", in.IdentityID); err != nil {
		return Identity{}, err
	}
	i, err := scanIdentity(a.db.Pool.QueryRow(ctx, `SELECT `+identityColumns+` FROM iam_identities
		WHERE tenant_id = $1 AND id = $2`, in.TenantID, in.IdentityID))
	if errors.Is(err, pgx.ErrNoRows) {
		return Identity{}, admNotFound("identityId", "identity %q not found in tenant %q", in.IdentityID, in.TenantID)
	}
	if err != nil {
		return Identity{}, admDB(err)
	}
	return i, nil
}

// updateIdentity runs one UPDATE … RETURNING on an identity of a tenant.
func (a *Admin) updateIdentity(ctx context.Context, ref IdentityRef, method, set string, details map[string]string, args ...any) (Identity, error) {
	if err := admTenantID("tenantId", ref.TenantID); err != nil {
		return Identity{}, err
	}
	if err := admIdentityID("identityId", ref.IdentityID); err != nil {
		return Identity{}, err
	}
	var out Identity
	err := a.change(ctx, func(tx store.Tx) ([]auditRecord, error) {
		var err error
		out, err = scanIdentity(tx.QueryRow(ctx, `UPDATE iam_identities SET `+set+`
			WHERE tenant_id = $1 AND id = $2 RETURNING `+identityColumns, append([]any{ref.TenantID, ref.IdentityID}, args...)...))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, admNotFound("identityId", "identity %q not found in tenant %q", ref.IdentityID, ref.TenantID)
		}
		if err != nil {
			return nil, err
		}
		return []auditRecord{a.record(ctx, ref.TenantID, method, "iam-identity", ref.IdentityID, details)}, nil
	})
	return out, err
}

// SetIdentityGroups replaces the groups an identity is in (its Cedar parents
// Group::"<name>"); decisions see the change at once.
func (a *Admin) SetIdentityGroups(ctx context.Context, in SetIdentityGroupsInput) (Identity, error) {
	groups, err := admGroups(in.Groups)
	if err != nil {
		return Identity{}, err
	}
	return a.updateIdentity(ctx, IdentityRef{TenantID: in.TenantID, IdentityID: in.IdentityID}, "setIdentityGroups",
		`groups = $3`, map[string]string{"groups": strings.Join(groups, ",")}, groups)
}

// DisableIdentity disables an identity: its tokens stop authenticating and
// its decisions deny from now on (idempotent; the first time is kept).
func (a *Admin) DisableIdentity(ctx context.Context, in IdentityRef) (Identity, error) {
	return a.updateIdentity(ctx, in, "disableIdentity", `disabled_at = COALESCE(disabled_at, $3)`, nil, a.now())
}

// newToken is a fresh bearer token: bc_ and 32 random bytes in lower-case
// Crockford base32.
func newToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	enc := base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)
	return "bc_" + enc.EncodeToString(b[:]), nil
}

// CreateToken creates a session and returns its bearer token, in plaintext
// this once (only its SHA-256 is stored). User sessions are for persons
// only, MFA only in user sessions, delegatedBy only in agent sessions.
func (a *Admin) CreateToken(ctx context.Context, in CreateTokenInput) (CreatedToken, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return CreatedToken{}, err
	}
	if err := admIdentityID("identityId", in.IdentityID); err != nil {
		return CreatedToken{}, err
	}
	switch in.SessionKind {
	case SessionUser, SessionService, SessionAgent:
	default:
		return CreatedToken{}, admInvalid("sessionKind", "sessionKind must be user, service or agent")
	}
	if in.MFA && in.SessionKind != SessionUser {
		return CreatedToken{}, admInvalid("mfa", "only user sessions carry MFA")
	}
	ttl := DefaultTokenTTL
	if in.TTLSeconds != 0 {
		if in.TTLSeconds < int64(MinTokenTTL/time.Second) || in.TTLSeconds > int64(MaxTokenTTL/time.Second) {
			return CreatedToken{}, admInvalid("ttlSeconds", "ttlSeconds must be %d to %d",
				int64(MinTokenTTL/time.Second), int64(MaxTokenTTL/time.Second))
		}
		ttl = time.Duration(in.TTLSeconds) * time.Second
	}
	if in.DelegatedBy != "" {
		if in.SessionKind != SessionAgent {
			return CreatedToken{}, admInvalid("delegatedBy", "only agent sessions are delegated")
		}
		if err := admIdentityID("delegatedBy", in.DelegatedBy); err != nil {
			return CreatedToken{}, err
		}
	}
	tok, err := newToken()
	if err != nil {
		return CreatedToken{}, core.Wrap(core.CodeInternal, err, "internal error")
	}
	sum := sha256.Sum256([]byte(tok))
	now := a.now()
	s := Session{ID: core.NewID("ses"), TenantID: in.TenantID, IdentityID: in.IdentityID, SessionKind: in.SessionKind,
		MFA: in.MFA, DelegatedBy: in.DelegatedBy, CreatedAt: now.UnixMilli(), ExpiresAt: now.Add(ttl).UnixMilli()}
	err = a.change(ctx, func(tx store.Tx) ([]auditRecord, error) {
		if err := requireTenant(ctx, tx, "tenantId", in.TenantID); err != nil {
			return nil, err
		}
		idn, err := scanIdentity(tx.QueryRow(ctx, `SELECT `+identityColumns+` FROM iam_identities
			WHERE tenant_id = $1 AND id = $2`, in.TenantID, in.IdentityID))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, admNotFound("identityId", "identity %q not found in tenant %q", in.IdentityID, in.TenantID)
		}
		if err != nil {
			return nil, err
		}
		if idn.DisabledAt != 0 {
			return nil, core.Errorf(core.CodeInvalidState, "identity %q is disabled", in.IdentityID).
				WithDetails(map[string]any{"field": "identityId"})
		}
		if in.SessionKind == SessionUser && idn.Kind != KindPerson {
			return nil, admInvalid("sessionKind", "user sessions are for persons; %q is a %s", in.IdentityID, idn.Kind)
		}
		if in.DelegatedBy != "" {
			var one int
			err := tx.QueryRow(ctx, `SELECT 1 FROM iam_identities WHERE tenant_id = $1 AND id = $2 AND disabled_at IS NULL`,
				in.TenantID, in.DelegatedBy).Scan(&one)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil, admNotFound("delegatedBy", "identity %q not found in tenant %q", in.DelegatedBy, in.TenantID)
			}
			if err != nil {
				return nil, err
			}
		}
		var delegatedBy *string
		if in.DelegatedBy != "" {
			delegatedBy = &in.DelegatedBy
		}
		if _, err := tx.Exec(ctx, `INSERT INTO iam_sessions (id, tenant_id, identity_id, token_sha256, session_kind,
				mfa, delegated_by, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			s.ID, s.TenantID, s.IdentityID, sum[:], s.SessionKind, s.MFA, delegatedBy, now, now.Add(ttl)); err != nil {
			return nil, err
		}
		return []auditRecord{a.record(ctx, in.TenantID, "createToken", "iam-session", s.ID, map[string]string{
			"identityId": s.IdentityID, "sessionKind": s.SessionKind, "mfa": fmt.Sprint(s.MFA),
			"expiresAt": fmt.Sprint(s.ExpiresAt), "delegatedBy": s.DelegatedBy,
		})}, nil
	})
	if err != nil {
		return CreatedToken{}, err
	}
	return CreatedToken{Token: tok, Session: s}, nil
}

const sessionColumns = `id, tenant_id, identity_id, session_kind, mfa, delegated_by, created_at, expires_at, revoked_at`

func scanSession(row pgx.Row) (Session, error) {
	var s Session
	var delegatedBy *string
	var created, expires time.Time
	var revoked *time.Time
	err := row.Scan(&s.ID, &s.TenantID, &s.IdentityID, &s.SessionKind, &s.MFA, &delegatedBy, &created, &expires, &revoked)
	if delegatedBy != nil {
		s.DelegatedBy = *delegatedBy
	}
	s.CreatedAt, s.ExpiresAt, s.RevokedAt = created.UnixMilli(), expires.UnixMilli(), admMillis(revoked)
	return s, err
}

// RevokeToken revokes a session: its token stops authenticating and its
// decisions deny from now on (idempotent; the first revocation is kept).
func (a *Admin) RevokeToken(ctx context.Context, in SessionRef) (Session, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return Session{}, err
	}
	if !core.ValidID("ses", in.SessionID) {
		return Session{}, admInvalid("sessionId", "sessionId must be a session id (ses_…)")
	}
	var s Session
	err := a.change(ctx, func(tx store.Tx) ([]auditRecord, error) {
		var err error
		s, err = scanSession(tx.QueryRow(ctx, `UPDATE iam_sessions SET revoked_at = COALESCE(revoked_at, $3)
			WHERE tenant_id = $1 AND id = $2 RETURNING `+sessionColumns, in.TenantID, in.SessionID, a.now()))
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, admNotFound("sessionId", "session %q not found in tenant %q", in.SessionID, in.TenantID)
		}
		if err != nil {
			return nil, err
		}
		return []auditRecord{a.record(ctx, in.TenantID, "revokeToken", "iam-session", in.SessionID,
			map[string]string{"identityId": s.IdentityID})}, nil
	})
	return s, err
}

// sessionOfToken reads the active session of a plaintext token (Bootstrap
// uses it to reuse the tokens it handed out before).
func (a *Admin) sessionOfToken(ctx context.Context, token string) (Session, bool, error) {
	if !tokenPattern.MatchString(token) {
		return Session{}, false, nil
	}
	sum := sha256.Sum256([]byte(token))
	s, err := scanSession(a.db.Pool.QueryRow(ctx, `SELECT `+sessionColumns+` FROM iam_sessions s
		WHERE token_sha256 = $1 AND revoked_at IS NULL AND expires_at > $2
		AND EXISTS (SELECT 1 FROM iam_identities i WHERE i.id = s.identity_id AND i.disabled_at IS NULL)`, sum[:], a.now()))
	if errors.Is(err, pgx.ErrNoRows) {
		return Session{}, false, nil
	}
	if err != nil {
		return Session{}, false, admDB(err)
	}
	return s, true, nil
}

// PutPolicy creates or replaces (by name) a Cedar policy document of a
// tenant. The text must parse (INVALID_INPUT, details.field "cedar");
// decisions in every process use it from their next decision on.
func (a *Admin) PutPolicy(ctx context.Context, in PutPolicyInput) (Policy, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return Policy{}, err
	}
	if !policyNamePattern.MatchString(in.Name) {
		return Policy{}, admInvalid("name", "name must match %s", policyNamePattern)
	}
	if len(in.Cedar) > MaxPolicyBytes {
		return Policy{}, admInvalid("cedar", "a policy is at most %d bytes", MaxPolicyBytes)
	}
	if _, err := ParsePolicies(in.Name, in.Cedar); err != nil {
		return Policy{}, err
	}
	now := a.now()
	p := Policy{ID: core.NewID("pol"), TenantID: in.TenantID, Name: in.Name, Cedar: in.Cedar}
	sum := sha256.Sum256([]byte(in.Cedar))
	err := a.change(ctx, func(tx store.Tx) ([]auditRecord, error) {
		if err := requireTenant(ctx, tx, "tenantId", in.TenantID); err != nil {
			return nil, err
		}
		var created, updated time.Time
		if err := tx.QueryRow(ctx, `INSERT INTO iam_policies (id, tenant_id, name, cedar, created_at, updated_at)
				VALUES ($1, $2, $3, $4, $5, $5)
				ON CONFLICT (tenant_id, name) DO UPDATE SET cedar = EXCLUDED.cedar, updated_at = EXCLUDED.updated_at
				RETURNING id, created_at, updated_at`, p.ID, in.TenantID, in.Name, in.Cedar, now).
			Scan(&p.ID, &created, &updated); err != nil {
			return nil, err
		}
		p.CreatedAt, p.UpdatedAt = created.UnixMilli(), updated.UnixMilli()
		if _, err := tx.Exec(ctx, `UPDATE iam_tenants SET policy_version = policy_version + 1 WHERE id = $1`, in.TenantID); err != nil {
			return nil, err
		}
		return []auditRecord{a.record(ctx, in.TenantID, "putPolicy", "iam-policy", in.Name,
			map[string]string{"policyId": p.ID, "sha256": hex.EncodeToString(sum[:])})}, nil
	})
	return p, err
}

// DeletePolicy deletes a tenant's policy by name.
func (a *Admin) DeletePolicy(ctx context.Context, in PolicyRef) error {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return err
	}
	if !policyNamePattern.MatchString(in.Name) {
		return admInvalid("name", "name must match %s", policyNamePattern)
	}
	return a.change(ctx, func(tx store.Tx) ([]auditRecord, error) {
		var id string
		err := tx.QueryRow(ctx, `DELETE FROM iam_policies WHERE tenant_id = $1 AND name = $2 RETURNING id`,
			in.TenantID, in.Name).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, admNotFound("name", "policy %q not found in tenant %q", in.Name, in.TenantID)
		}
		if err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, `UPDATE iam_tenants SET policy_version = policy_version + 1 WHERE id = $1`, in.TenantID); err != nil {
			return nil, err
		}
		return []auditRecord{a.record(ctx, in.TenantID, "deletePolicy", "iam-policy", in.Name,
			map[string]string{"policyId": id})}, nil
	})
}

// ListPolicies lists a tenant's policies by name.
func (a *Admin) ListPolicies(ctx context.Context, in TenantRef) ([]Policy, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return nil, err
	}
	if err := requireTenant(ctx, a.db.Pool, "tenantId", in.TenantID); err != nil {
		return nil, admDB(err)
	}
	rows, err := a.db.Pool.Query(ctx, `SELECT id, tenant_id, name, cedar, created_at, updated_at FROM iam_policies
		WHERE tenant_id = $1 ORDER BY name`, in.TenantID)
	if err != nil {
		return nil, admDB(err)
	}
	defer rows.Close()
	out := []Policy{}
	for rows.Next() {
		var p Policy
		var created, updated time.Time
		if err := rows.Scan(&p.ID, &p.TenantID, &p.Name, &p.Cedar, &created, &updated); err != nil {
			return nil, admDB(err)
		}
		p.CreatedAt, p.UpdatedAt = created.UnixMilli(), updated.UnixMilli()
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, admDB(err)
	}
	return out, nil
}

// checkRelation validates a relation against the catalog: the type must be
// a catalog type (with its prefix) that declares the relation.
func (a *Admin) checkRelation(r Relation) error {
	if err := admTenantID("tenantId", r.TenantID); err != nil {
		return err
	}
	if err := admIdentityID("subjectId", r.SubjectID); err != nil {
		return err
	}
	name, ok := a.cat.ShortName(r.ResourceType)
	if !ok {
		return admInvalid("resourceType", "resourceType %q is not a type of the catalog", r.ResourceType)
	}
	t, _ := a.cat.Type(name)
	if !slices.Contains(t.Relations, r.Relation) {
		if len(t.Relations) == 0 {
			return admInvalid("resourceType", "type %q has no relations", r.ResourceType)
		}
		return core.Errorf(core.CodeInvalidInput, "relation %q is not one of %s on %s", r.Relation,
			strings.Join(t.Relations, ", "), r.ResourceType).
			WithDetails(map[string]any{"field": "relation", "allowed": t.Relations})
	}
	if !resourceIDPattern.MatchString(r.ResourceID) {
		return admInvalid("resourceId", "resourceId must match %s", resourceIDPattern)
	}
	return nil
}

// AddRelation gives an identity a relation on a resource (CONFLICT when it
// has it already). The relation must be one the catalog declares on the
// type (compute-project member/admin, compute-pool
// viewer/user/operator/admin, compute-node operator).
func (a *Admin) AddRelation(ctx context.Context, in Relation) (Relation, error) {
	if err := a.checkRelation(in); err != nil {
		return Relation{}, err
	}
	now := a.now()
	out := in
	out.CreatedAt = now.UnixMilli()
	err := a.change(ctx, func(tx store.Tx) ([]auditRecord, error) {
		if err := requireTenant(ctx, tx, "tenantId", in.TenantID); err != nil {
			return nil, err
		}
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM iam_identities WHERE tenant_id = $1 AND id = $2`, in.TenantID, in.SubjectID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, admNotFound("subjectId", "identity %q not found in tenant %q", in.SubjectID, in.TenantID)
		}
		if err != nil {
			return nil, err
		}
		_, err = tx.Exec(ctx, `INSERT INTO iam_relations (tenant_id, subject_id, resource_type, resource_id, relation, created_at)
			VALUES ($1, $2, $3, $4, $5, $6)`, in.TenantID, in.SubjectID, in.ResourceType, in.ResourceID, in.Relation, now)
		if admPgCode(err) == "23505" {
			return nil, core.Errorf(core.CodeConflict, "the relation exists").WithDetails(map[string]any{"field": "relation"})
		}
		if err != nil {
			return nil, err
		}
		return []auditRecord{a.record(ctx, in.TenantID, "addRelation", in.ResourceType, in.ResourceID,
			map[string]string{"subjectId": in.SubjectID, "relation": in.Relation})}, nil
	})
	return out, err
}

// RemoveRelation takes a relation away (NOT_FOUND when there is none).
func (a *Admin) RemoveRelation(ctx context.Context, in Relation) error {
	if err := a.checkRelation(in); err != nil {
		return err
	}
	return a.change(ctx, func(tx store.Tx) ([]auditRecord, error) {
		tag, err := tx.Exec(ctx, `DELETE FROM iam_relations WHERE tenant_id = $1 AND subject_id = $2
			AND resource_type = $3 AND resource_id = $4 AND relation = $5`,
			in.TenantID, in.SubjectID, in.ResourceType, in.ResourceID, in.Relation)
		if err != nil {
			return nil, err
		}
		if tag.RowsAffected() == 0 {
			return nil, admNotFound("relation", "no such relation")
		}
		return []auditRecord{a.record(ctx, in.TenantID, "removeRelation", in.ResourceType, in.ResourceID,
			map[string]string{"subjectId": in.SubjectID, "relation": in.Relation})}, nil
	})
}

// ListRelations lists a tenant's relations, optionally of one subject
// and/or on one type or resource, ordered by subject, type, id, relation.
func (a *Admin) ListRelations(ctx context.Context, in ListRelationsInput) ([]Relation, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return nil, err
	}
	if in.SubjectID != "" {
		if err := admIdentityID("subjectId", in.SubjectID); err != nil {
			return nil, err
		}
	}
	if in.ResourceID != "" && in.ResourceType == "" {
		return nil, admInvalid("resourceType", "resourceId needs resourceType")
	}
	limit, err := admPageSize(in.Limit)
	if err != nil {
		return nil, err
	}
	if err := requireTenant(ctx, a.db.Pool, "tenantId", in.TenantID); err != nil {
		return nil, admDB(err)
	}
	rows, err := a.db.Pool.Query(ctx, `SELECT tenant_id, subject_id, relation, resource_type, resource_id, created_at
		FROM iam_relations WHERE tenant_id = $1 AND ($2 = '' OR subject_id = $2)
		AND ($3 = '' OR resource_type = $3) AND ($4 = '' OR resource_id = $4)
		ORDER BY subject_id, resource_type, resource_id, relation LIMIT $5`,
		in.TenantID, in.SubjectID, in.ResourceType, in.ResourceID, limit)
	if err != nil {
		return nil, admDB(err)
	}
	defer rows.Close()
	out := []Relation{}
	for rows.Next() {
		var r Relation
		var created time.Time
		if err := rows.Scan(&r.TenantID, &r.SubjectID, &r.Relation, &r.ResourceType, &r.ResourceID, &created); err != nil {
			return nil, admDB(err)
		}
		r.CreatedAt = created.UnixMilli()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, admDB(err)
	}
	return out, nil
}

// AuditEntries reads a tenant's audit chain after seq AfterSeq, oldest first.
func (a *Admin) AuditEntries(ctx context.Context, in AuditQuery) ([]AuditEntry, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return nil, err
	}
	if in.AfterSeq < 0 {
		return nil, admInvalid("afterSeq", "afterSeq must not be negative")
	}
	limit, err := admPageSize(in.Limit)
	if err != nil {
		return nil, err
	}
	out, err := auditEntries(ctx, a.db, in.TenantID, in.AfterSeq, limit)
	if err != nil {
		return nil, admDB(err)
	}
	return out, nil
}

// VerifyAudit recomputes a tenant's audit chain (see VerifyAuditChain).
func (a *Admin) VerifyAudit(ctx context.Context, in TenantRef) (AuditVerification, error) {
	if err := admTenantID("tenantId", in.TenantID); err != nil {
		return AuditVerification{}, err
	}
	v, err := VerifyAuditChain(ctx, a.db, in.TenantID)
	if err != nil {
		return AuditVerification{}, admDB(err)
	}
	return v, nil
}

// auditDenied appends a refused admin call to the caller's tenant chain.
func (a *Admin) auditDenied(ctx context.Context, c *Caller, method, requestID string) error {
	rec := auditRecord{
		tenantID: c.TenantID, kind: AuditKindAdmin, identityID: c.IdentityID, sessionID: c.SessionID,
		action: "iam:admin:" + method, resourceType: "iam-admin", resourceID: a.root,
		allowed: false, reason: ReasonDeny, requestID: requestID,
	}
	return a.db.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return auditAppend(ctx, tx, a.now(), []auditRecord{rec})
	})
}

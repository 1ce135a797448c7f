package iam

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	cedar "github.com/cedar-policy/cedar-go"
	"github.com/cedar-policy/cedar-go/types"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// DefaultRootTenantID is the root tenant unless configured.
const DefaultRootTenantID = "root"

// SessionCookie is the name of the IAM session cookie a browser presents
// instead of a bearer token (the API's bc_session).
const SessionCookie = "bc_session"

// ReasonPrincipalInactive denies a decision whose caller's identity is
// disabled or whose session is revoked or expired by the time of the
// decision (a Caller can outlive both in the authentication cache).
const ReasonPrincipalInactive = "PRINCIPAL_INACTIVE"

// EmbeddedConfig configures NewEmbedded.
type EmbeddedConfig struct {
	Store   *store.Store
	Catalog *core.Catalog
	// Resolver answers resources of the catalog's types (the resolver over
	// the authorization projection).
	Resolver Resolver
	// RootTenantID is the root tenant; "" means DefaultRootTenantID.
	RootTenantID string
	// HostFallback, optional, answers types without the catalog's prefix;
	// without it they deny RESOURCE_RESOLVER_REQUIRED.
	HostFallback Resolver
	// Refresher, optional, serves RefreshResource. Without it the Resolver
	// serves it when it implements Refresher, and RefreshResource is a
	// no-op otherwise.
	Refresher Refresher
	Logger    *slog.Logger
	// Now is the clock (tests move it); nil means time.Now.
	Now func() time.Time
}

// Embedded is the IAM in-process: bearer-token sessions, relations and
// per-tenant Cedar policies in PostgreSQL (the iam_* tables), decided with
// cedar-go against the entity model documented in cedar.go, every denial
// and every ROOT_OVERRIDE appended to the tenant's audit chain (audit.go).
//
// A decision runs, in this order: (a) the tenant check, before any
// resolver: a caller of another tenant is denied TENANT_MISMATCH (audited
// on the caller's tenant, with targetTenantId; the target tenant is never
// touched) unless it is a root-tenant person with root authority in a user
// session with MFA, which is allowed as ROOT_OVERRIDE (audited on both
// tenants) without the target tenant's policies; (b) the action must be in
// the catalog and carried by the resource's type (UNKNOWN_ACTION); (c) the
// resolver answers the resource (its NOT_FOUND is returned as NOT_FOUND,
// not audited; any other failure denies RESOLVE_FAILED; an answer that does
// not echo tenant, type and id denies RESOURCE_MISMATCH); (d) one query
// reads the tenant's policy version, whether the caller's identity and
// session are still active, the identity's groups and the caller's
// relations on the resource and on its parent; (e) the tenant's policies
// decide: a forbid wins, no permit denies.
//
// Types without the catalog's prefix (another host's) skip (b): the
// catalog cannot vouch for them; they go to HostFallback, or deny
// RESOURCE_RESOLVER_REQUIRED. A Caller whose identity is disabled, whose
// session is revoked or expired, or whose identity is not of its claimed
// tenant denies PRINCIPAL_INACTIVE at (d), whatever an authentication cache
// still holds (a Caller without a SessionID is checked by its identity only).
//
// Embedded keeps no state but the parsed policies, checked against the
// tenant's policy_version at every decision, so any number of processes
// may share the database.
type Embedded struct {
	db        *store.Store
	cat       *core.Catalog
	resolver  Resolver
	host      Resolver
	refresher Refresher
	root      string
	log       *slog.Logger
	now       func() time.Time
	actions   map[types.EntityUID]types.Entity
	policies  cedarPolicySets
	tenants   knownTenants
}

var (
	_ Port      = (*Embedded)(nil)
	_ Refresher = (*Embedded)(nil)
)

// NewEmbedded builds the embedded IAM. Store, Catalog and Resolver are
// required (INVALID_CONFIG).
func NewEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.Store == nil || cfg.Catalog == nil || cfg.Resolver == nil {
		return nil, core.Errorf(core.CodeInvalidConfig, "iam: the embedded IAM needs a store, a catalog and a resolver")
	}
	root := cfg.RootTenantID
	if root == "" {
		root = DefaultRootTenantID
	}
	if !tenantIDPattern.MatchString(root) {
		return nil, core.Errorf(core.CodeInvalidConfig, "iam: root tenant id %q must match %s", root, tenantIDPattern)
	}
	e := &Embedded{
		db: cfg.Store, cat: cfg.Catalog, resolver: cfg.Resolver, host: cfg.HostFallback,
		refresher: cfg.Refresher, root: root, log: cfg.Logger, now: cfg.Now,
		actions: cedarActionEntities(cfg.Catalog), tenants: newKnownTenants(),
	}
	if e.refresher == nil {
		if r, ok := cfg.Resolver.(Refresher); ok {
			e.refresher = r
		}
	}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.now == nil {
		e.now = time.Now
	}
	return e, nil
}

// RootTenantID is the configured root tenant.
func (e *Embedded) RootTenantID() string { return e.root }

// RefreshResource re-reads one resource before an admission's decision,
// through the configured Refresher (see EmbeddedConfig.Refresher).
func (e *Embedded) RefreshResource(ctx context.Context, tenantID string, r Resource) error {
	if e.refresher == nil {
		return nil
	}
	return e.refresher.RefreshResource(ctx, tenantID, r)
}

// tokenPattern is a bearer token: bc_ and 32 random bytes in lower-case
// Crockford base32 (52 characters).
var tokenPattern = regexp.MustCompile(`^bc_[0-9a-hjkmnp-tv-z]{52}$`)

// credentialToken picks the token a credential carries: the bearer token
// of the Authorization header, else (no bearer, or another scheme) the
// session cookie. Cookie is either the
// cookie's value or a whole Cookie header, in which case bc_session is read
// from it.
func credentialToken(cred Credential) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(cred.Authorization), " ")
	if ok && strings.EqualFold(scheme, "bearer") {
		return strings.TrimSpace(tok) // a bearer, valid or not, is the credential
	}
	return cookieToken(cred.Cookie)
}

// Authenticate identifies the caller of a bearer token (or the session
// cookie when there is no bearer). An unknown, malformed, expired or
// revoked token, or one of a disabled identity, is UNAUTHENTICATED, the
// same in every case.
func (e *Embedded) Authenticate(ctx context.Context, cred Credential) (*Caller, error) {
	unauthn := core.Errorf(core.CodeUnauthn, "the credential is not valid")
	tok := credentialToken(cred)
	if !tokenPattern.MatchString(tok) {
		return nil, unauthn
	}
	sum := sha256.Sum256([]byte(tok))
	c := &Caller{SourceIP: cred.SourceIP}
	var delegatedBy *string
	err := e.db.Pool.QueryRow(ctx, `SELECT s.id, s.tenant_id, s.identity_id, i.kind, s.session_kind, s.mfa,
			i.root_authority, s.delegated_by
		FROM iam_sessions s JOIN iam_identities i ON i.id = s.identity_id
		WHERE s.token_sha256 = $1 AND s.revoked_at IS NULL AND s.expires_at > $2 AND i.disabled_at IS NULL`,
		sum[:], e.now()).Scan(&c.SessionID, &c.TenantID, &c.IdentityID, &c.IdentityKind, &c.SessionKind, &c.MFA,
		&c.RootAuthority, &delegatedBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, unauthn
	}
	if err != nil {
		return nil, core.Wrap(core.CodeUnavailable, err, "authentication is unavailable")
	}
	if delegatedBy != nil {
		c.DelegatedBy = *delegatedBy
	}
	if c.IdentityKind == KindAgent {
		c.AgentID = c.IdentityID
	}
	return c, nil
}

// Authorize decides one request. A denial is a Decision with Allowed false
// and its reason (the caller of the port must not pass the reason on: the
// API answers every denial as an opaque ACCESS_DENIED). Errors: NOT_FOUND
// for a resource the resolver does not know, UNAUTHENTICATED without a
// caller, INVALID_INPUT for a malformed request.
func (e *Embedded) Authorize(ctx context.Context, req Request) (Decision, error) {
	ds, err := e.decide(ctx, []Request{req})
	if err != nil {
		return Decision{}, err
	}
	return ds[0], nil
}

// Require returns nil when the request is allowed and an opaque
// ACCESS_DENIED otherwise.
func (e *Embedded) Require(ctx context.Context, req Request) error {
	d, err := e.Authorize(ctx, req)
	if err != nil {
		return err
	}
	if !d.Allowed {
		return core.Errorf(core.CodeAccessDenied, "access denied")
	}
	return nil
}

// AuthorizeMany decides up to MaxBatch requests and answers in their
// order. A NOT_FOUND of any item aborts the whole batch with NOT_FOUND
// (nothing of it is audited); more than MaxBatch is INVALID_INPUT.
func (e *Embedded) AuthorizeMany(ctx context.Context, reqs []Request) ([]Decision, error) {
	if len(reqs) > MaxBatch {
		return nil, core.Errorf(core.CodeInvalidInput, "at most %d requests in one batch, got %d", MaxBatch, len(reqs)).
			WithDetails(map[string]any{"field": "requests", "max": MaxBatch})
	}
	if len(reqs) == 0 {
		return []Decision{}, nil
	}
	return e.decide(ctx, reqs)
}

// embItem is one request on its way through decide.
type embItem struct {
	req      *Request
	done     bool
	decision Decision
	override bool
	details  map[string]string
	resource types.Entity
	parent   Resource // zero when the resource has none
}

func (it *embItem) deny(reason string, details map[string]string) {
	it.done, it.decision, it.details = true, Decision{Allowed: false, Reason: reason}, details
}

// overrideAllowed: a root-tenant person with root authority in a user
// session with MFA.
func (e *Embedded) overrideAllowed(c *Caller) bool {
	return c.TenantID == e.root && c.IdentityKind == KindPerson && c.RootAuthority &&
		c.SessionKind == SessionUser && c.MFA
}

func (e *Embedded) decide(ctx context.Context, reqs []Request) ([]Decision, error) {
	items := make([]embItem, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		if r.Caller == nil || r.Caller.IdentityID == "" {
			return nil, core.Errorf(core.CodeUnauthn, "no authenticated caller")
		}
		if r.TenantID == "" || r.Resource.Type == "" || r.Resource.ID == "" {
			field := "tenantId"
			if r.TenantID != "" {
				field = "resource"
			}
			return nil, core.Errorf(core.CodeInvalidInput, "a decision needs a tenant and a resource type and id").
				WithDetails(map[string]any{"field": field})
		}
		items[i].req = r
	}

	// (a) the tenant check, (b) the catalog, (c) resolution.
	for i := range items {
		it := &items[i]
		req := it.req
		if req.Caller.TenantID != req.TenantID {
			if !e.overrideAllowed(req.Caller) {
				it.deny(ReasonTenantMismatch, nil)
				continue
			}
			it.override = true
		}
		prefixed := strings.HasPrefix(req.Resource.Type, e.cat.Prefix())
		if prefixed && !e.cat.Carries(req.Action, strings.TrimPrefix(req.Resource.Type, e.cat.Prefix())) {
			it.deny(ReasonUnknownAction, nil)
			continue
		}
		resolver := e.resolver
		if !prefixed {
			resolver = e.host
		}
		if resolver == nil {
			it.deny(ReasonResolverRequired, nil)
			continue
		}
		res, err := resolver.Resolve(ctx, req.TenantID, req.Resource)
		switch {
		case errors.Is(err, core.ErrNotFound):
			return nil, core.Errorf(core.CodeNotFound, "%s not found", req.Resource)
		case errors.Is(err, ErrResolverRequired): // the projection resolver's own fallback is missing
			it.deny(ReasonResolverRequired, nil)
			continue
		case err != nil:
			e.log.WarnContext(ctx, "iam: resolve failed", "tenant", req.TenantID, "resource", req.Resource.String(), "error", err.Error())
			it.deny(ReasonResolveFailed, map[string]string{"error": embTruncate(err.Error(), 200)})
			continue
		case res == nil:
			it.deny(ReasonResolveFailed, map[string]string{"error": "the resolver answered nothing"})
			continue
		case res.TenantID != req.TenantID || res.Type != req.Resource.Type || res.ID != req.Resource.ID:
			it.deny(ReasonResourceMismatch, map[string]string{
				"resolvedTenantId": res.TenantID, "resolvedType": res.Type, "resolvedId": res.ID})
			continue
		}
		ent, err := e.resourceEntity(res, prefixed)
		if err != nil {
			e.log.WarnContext(ctx, "iam: resolved attributes", "resource", req.Resource.String(), "error", err.Error())
			it.deny(ReasonResolveFailed, map[string]string{"error": embTruncate(err.Error(), 200)})
			continue
		}
		it.resource = ent
		if res.ParentType != "" && res.ParentID != "" {
			it.parent = Resource{Type: res.ParentType, ID: res.ParentID}
		}
	}

	// (d) relations, groups, liveness and the policy version, in one query.
	facts, err := e.loadFacts(ctx, items)
	if err != nil {
		return nil, err
	}

	// (e) the policies.
	for i := range items {
		it := &items[i]
		if it.done {
			continue
		}
		f := facts[i]
		switch {
		case !f.active:
			it.deny(ReasonPrincipalInactive, nil)
		case it.override:
			it.done, it.decision = true, Decision{Allowed: true, Reason: ReasonRootOverride}
		default:
			if err := e.evaluate(ctx, it, f); err != nil {
				return nil, err
			}
		}
	}

	if err := e.auditDecisions(ctx, items); err != nil {
		return nil, err
	}
	out := make([]Decision, len(items))
	for i := range items {
		out[i] = items[i].decision
	}
	return out, nil
}

// resourceEntity builds the Resource entity of a resolved resource (see
// the model in cedar.go).
func (e *Embedded) resourceEntity(res *Resolved, prefixed bool) (types.Entity, error) {
	rm := types.RecordMap{
		"type":     types.String(res.Type),
		"id":       types.String(res.ID),
		"tenantId": types.String(res.TenantID),
	}
	if res.OwnerID != "" {
		rm["ownerId"] = types.String(res.OwnerID)
	}
	ent := types.Entity{UID: cedarResourceUID(res.Type, res.ID)}
	if res.ParentType != "" && res.ParentID != "" {
		rm["parentType"] = types.String(res.ParentType)
		rm["parentId"] = types.String(res.ParentID)
		ent.Parents = types.NewEntityUIDSet(cedarResourceUID(res.ParentType, res.ParentID))
	}
	if prefixed {
		t, _ := e.cat.Type(strings.TrimPrefix(res.Type, e.cat.Prefix()))
		for _, a := range t.Attributes {
			v, ok := res.Attributes[a.Name]
			if !ok || v == nil || cedarReservedResourceAttr(a.Name) {
				continue
			}
			cv, ok := cedarDeclared(a.Type, v)
			if !ok {
				return types.Entity{}, fmt.Errorf("attribute %s of %s: a %T is not a %s", a.Name, res.Type, v, a.Type)
			}
			rm[types.String(a.Name)] = cv
		}
	} else {
		for k, v := range res.Attributes {
			if v == nil || cedarReservedResourceAttr(k) {
				continue
			}
			cv, err := cedarValue(v)
			if err != nil {
				return types.Entity{}, fmt.Errorf("attribute %s of %s: %w", k, res.Type, err)
			}
			rm[types.String(k)] = cv
		}
	}
	// relations and parentRelations are added per decision (evaluate).
	ent.Attributes = types.NewRecord(rm)
	return ent, nil
}

// embFacts is what the decision query reads for one item.
type embFacts struct {
	version    int64
	active     bool
	groups     []string
	relations  []string
	parentRels []string
}

// loadFacts runs step (d) for every item still undecided, in one query.
func (e *Embedded) loadFacts(ctx context.Context, items []embItem) ([]embFacts, error) {
	facts := make([]embFacts, len(items))
	var idx []int
	var tenants, callerTenants, identities, sessions, rtypes, rids, ptypes, pids []string
	for i := range items {
		it := &items[i]
		if it.done {
			continue
		}
		idx = append(idx, i)
		tenants = append(tenants, it.req.TenantID)
		callerTenants = append(callerTenants, it.req.Caller.TenantID)
		identities = append(identities, it.req.Caller.IdentityID)
		sessions = append(sessions, it.req.Caller.SessionID)
		rtypes = append(rtypes, it.req.Resource.Type)
		rids = append(rids, it.req.Resource.ID)
		ptypes = append(ptypes, it.parent.Type)
		pids = append(pids, it.parent.ID)
	}
	if len(idx) == 0 {
		return facts, nil
	}
	if len(idx) == 1 {
		// One request (Authorize, Require): scalar parameters plan and run
		// several times faster than the unnest form below.
		f := &facts[idx[0]]
		err := e.db.Pool.QueryRow(ctx, `SELECT
				COALESCE((SELECT t.policy_version FROM iam_tenants t WHERE t.id = $1), 0),
				COALESCE((SELECT i.disabled_at IS NULL AND i.tenant_id = $2 AND
					($4 = '' OR EXISTS (SELECT 1 FROM iam_sessions s WHERE s.id = $4
						AND s.identity_id = $3 AND s.revoked_at IS NULL AND s.expires_at > $9))
					FROM iam_identities i WHERE i.id = $3), false),
				COALESCE((SELECT i.groups FROM iam_identities i WHERE i.id = $3), '{}'),
				ARRAY(SELECT r.relation FROM iam_relations r WHERE r.tenant_id = $1
					AND r.subject_id = $3 AND r.resource_type = $5 AND r.resource_id = $6
					ORDER BY r.relation),
				ARRAY(SELECT r.relation FROM iam_relations r WHERE $7 <> '' AND r.tenant_id = $1
					AND r.subject_id = $3 AND r.resource_type = $7 AND r.resource_id = $8
					ORDER BY r.relation)`,
			tenants[0], callerTenants[0], identities[0], sessions[0], rtypes[0], rids[0], ptypes[0], pids[0], e.now()).
			Scan(&f.version, &f.active, &f.groups, &f.relations, &f.parentRels)
		if err != nil {
			return nil, core.Wrap(core.CodeUnavailable, err, "authorization is unavailable")
		}
		return facts, nil
	}
	rows, err := e.db.Pool.Query(ctx, `SELECT q.ord,
			COALESCE((SELECT t.policy_version FROM iam_tenants t WHERE t.id = q.tenant_id), 0),
			(i.id IS NOT NULL AND i.disabled_at IS NULL AND i.tenant_id = q.caller_tenant AND
				(q.session_id = '' OR EXISTS (SELECT 1 FROM iam_sessions s WHERE s.id = q.session_id
					AND s.identity_id = q.identity_id AND s.revoked_at IS NULL AND s.expires_at > $9))),
			COALESCE(i.groups, '{}'),
			ARRAY(SELECT r.relation FROM iam_relations r WHERE r.tenant_id = q.tenant_id
				AND r.subject_id = q.identity_id AND r.resource_type = q.rtype AND r.resource_id = q.rid
				ORDER BY r.relation),
			ARRAY(SELECT r.relation FROM iam_relations r WHERE q.ptype <> '' AND r.tenant_id = q.tenant_id
				AND r.subject_id = q.identity_id AND r.resource_type = q.ptype AND r.resource_id = q.pid
				ORDER BY r.relation)
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[])
			WITH ORDINALITY AS q(tenant_id, caller_tenant, identity_id, session_id, rtype, rid, ptype, pid, ord)
		LEFT JOIN iam_identities i ON i.id = q.identity_id`,
		tenants, callerTenants, identities, sessions, rtypes, rids, ptypes, pids, e.now())
	if err != nil {
		return nil, core.Wrap(core.CodeUnavailable, err, "authorization is unavailable")
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var ord int64
		var f embFacts
		if err := rows.Scan(&ord, &f.version, &f.active, &f.groups, &f.relations, &f.parentRels); err != nil {
			return nil, core.Wrap(core.CodeUnavailable, err, "authorization is unavailable")
		}
		if ord < 1 || int(ord) > len(idx) {
			return nil, core.Errorf(core.CodeInternal, "authorization: row %d of %d", ord, len(idx))
		}
		facts[idx[ord-1]] = f
		n++
	}
	if err := rows.Err(); err != nil {
		return nil, core.Wrap(core.CodeUnavailable, err, "authorization is unavailable")
	}
	if n != len(idx) {
		return nil, core.Errorf(core.CodeInternal, "authorization: %d rows for %d requests", n, len(idx))
	}
	return facts, nil
}

// evaluate runs the tenant's policies on one item (step e).
func (e *Embedded) evaluate(ctx context.Context, it *embItem, f embFacts) error {
	req := it.req
	ps, err := e.policySet(ctx, req.TenantID, f.version)
	if err != nil {
		return err
	}
	c := req.Caller
	groups := make([]types.EntityUID, len(f.groups))
	for i, g := range f.groups {
		groups[i] = types.NewEntityUID(CedarGroupType, types.String(g))
	}
	principal := types.Entity{
		UID:     types.NewEntityUID(CedarPrincipalType, types.String(c.IdentityID)),
		Parents: types.NewEntityUIDSet(groups...),
		Attributes: types.NewRecord(types.RecordMap{
			"id":            types.String(c.IdentityID),
			"tenantId":      types.String(c.TenantID),
			"kind":          types.String(c.IdentityKind),
			"rootAuthority": types.Boolean(c.RootAuthority),
		}),
	}
	rels, parentRels := cedarStringSet(f.relations), cedarStringSet(f.parentRels)
	resource := it.resource
	attrs := resource.Attributes.Map()
	attrs["relations"], attrs["parentRelations"] = rels, parentRels
	resource.Attributes = types.NewRecord(attrs)

	cm := make(types.RecordMap, len(req.Context)+5)
	for k, v := range req.Context {
		if v == nil || cedarReservedContextKey(k) {
			continue
		}
		cv, err := cedarValue(v)
		if err != nil {
			return core.Errorf(core.CodeInvalidInput, "request context %q: %v", k, err).
				WithDetails(map[string]any{"field": "context." + k})
		}
		cm[types.String(k)] = cv
	}
	cm["sessionKind"] = types.String(c.SessionKind)
	cm["mfa"] = types.Boolean(c.MFA)
	cm["relations"] = rels
	cm["parentRelations"] = parentRels
	if ip, ok := cedarSourceIP(c.SourceIP); ok {
		cm["sourceIp"] = ip
	}

	ents := &cedarEntities{principal: principal, resource: resource, actions: e.actions}
	decision, diag := cedar.Authorize(ps.set, ents, cedar.Request{
		Principal: principal.UID,
		Action:    types.NewEntityUID(CedarActionType, types.String(req.Action)),
		Resource:  resource.UID,
		Context:   types.NewRecord(cm),
	})
	if decision == cedar.Allow {
		it.done, it.decision = true, Decision{Allowed: true, Reason: ReasonAllow}
		return nil
	}
	details := map[string]string{}
	if len(diag.Reasons) > 0 {
		ids := make([]string, len(diag.Reasons))
		for i, r := range diag.Reasons {
			ids[i] = string(r.PolicyID)
		}
		details["forbiddenBy"] = strings.Join(ids, ",")
	}
	if len(diag.Errors) > 0 {
		ids := make([]string, len(diag.Errors))
		for i, r := range diag.Errors {
			ids[i] = string(r.PolicyID)
		}
		details["policyErrors"] = embTruncate(strings.Join(ids, ","), 500)
	}
	it.deny(ReasonDeny, details)
	return nil
}

// policySet returns the tenant's parsed policies at version or newer,
// reading them from the database when the cache is older.
func (e *Embedded) policySet(ctx context.Context, tenantID string, version int64) (*cedarTenantPolicies, error) {
	if p, ok := e.policies.get(tenantID, version); ok {
		return p, nil
	}
	p := &cedarTenantPolicies{}
	var docs [][2]string
	err := e.db.InTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx store.Tx) error {
		docs = docs[:0]
		err := tx.QueryRow(ctx, `SELECT policy_version FROM iam_tenants WHERE id = $1`, tenantID).Scan(&p.version)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT name, cedar FROM iam_policies WHERE tenant_id = $1`, tenantID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var d [2]string
			if err := rows.Scan(&d[0], &d[1]); err != nil {
				return err
			}
			docs = append(docs, d)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, core.Wrap(core.CodeUnavailable, err, "authorization is unavailable")
	}
	if p.set, err = cedarPolicySetOf(docs); err != nil {
		e.log.ErrorContext(ctx, "iam: a stored policy does not parse; the tenant's decisions fail", "tenant", tenantID, "error", err.Error())
		return nil, core.Wrap(core.CodeInternal, err, "internal error")
	}
	e.policies.put(tenantID, p)
	return p, nil
}

// auditDecisions appends every denial and every ROOT_OVERRIDE of a batch to
// the audit chains: a TENANT_MISMATCH on the caller's tenant only, an
// override (allowed or not) on the target's and the caller's, any other
// denial on the decision's tenant.
func (e *Embedded) auditDecisions(ctx context.Context, items []embItem) error {
	var recs []auditRecord
	for i := range items {
		it := &items[i]
		if it.decision.Allowed && !it.override {
			continue
		}
		req := it.req
		rec := auditRecord{
			tenantID: req.TenantID, kind: AuditKindDecision,
			identityID: req.Caller.IdentityID, sessionID: req.Caller.SessionID,
			action: req.Action, resourceType: req.Resource.Type, resourceID: req.Resource.ID,
			allowed: it.decision.Allowed, reason: it.decision.Reason, requestID: req.RequestID,
			details: it.details,
		}
		switch {
		case it.decision.Reason == ReasonTenantMismatch:
			rec.tenantID, rec.targetTenantID = req.Caller.TenantID, req.TenantID
			recs = append(recs, rec)
		case it.override:
			rec.targetTenantID = req.TenantID
			onTarget := rec
			onTarget.details = embWith(rec.details, "callerTenantId", req.Caller.TenantID)
			onCaller := rec
			onCaller.tenantID = req.Caller.TenantID
			recs = append(recs, onTarget, onCaller)
		default:
			recs = append(recs, rec)
		}
	}
	if len(recs) == 0 {
		return nil
	}
	err := e.db.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
		return auditAppend(ctx, tx, e.now(), recs)
	})
	if err != nil {
		// Fail closed: no answer without its audit entry.
		return core.Wrap(core.CodeUnavailable, err, "authorization is unavailable")
	}
	return nil
}

// embWith returns a copy of m with k set to v.
func embWith(m map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(m)+1)
	for mk, mv := range m {
		out[mk] = mv
	}
	out[k] = v
	return out
}

// embTruncate cuts s to at most n bytes, on a rune boundary.
func embTruncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

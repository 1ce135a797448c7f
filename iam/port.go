// Package iam is how Better Compute asks "may this caller do this action on
// this resource in this tenant?": the IamPort interface, the embedded IAM
// behind it (Cedar policies), the resolver over the authorization
// projection, and the caches.
package iam

import "context"

// Credential is what a caller presented. SourceIP is the verified socket
// peer (or the hop a trusted proxy reported), set by the server, never taken
// from a client's own forwarding headers.
type Credential struct {
	Authorization string // the Authorization header, e.g. "Bearer bc_…"
	Cookie        string // the IAM session cookie, used when there is no bearer
	SourceIP      string
	RequestID     string
	Origin        string
	UserAgent     string
}

// Present reports whether any credential was presented.
func (c Credential) Present() bool { return c.Authorization != "" || c.Cookie != "" }

// Identity kinds and session kinds.
const (
	KindPerson  = "person"
	KindService = "service"
	KindAgent   = "agent"

	SessionUser    = "user"
	SessionService = "service"
	SessionAgent   = "agent"
)

// Caller is an authenticated caller: who, in which tenant, in what session.
type Caller struct {
	TenantID     string `json:"tenantId"`
	IdentityID   string `json:"identityId"`
	IdentityKind string `json:"identityKind"` // person, service, agent
	SessionID    string `json:"sessionId"`
	SessionKind  string `json:"sessionKind"` // user, service, agent
	MFA          bool   `json:"mfa"`
	// RootAuthority: a root-tenant identity that may act in other tenants
	// (ROOT_OVERRIDE), only in a user session with MFA.
	RootAuthority bool `json:"rootAuthority"`
	// AgentID and DelegatedBy record who acts through an agent session.
	AgentID     string `json:"agentId,omitempty"`
	DelegatedBy string `json:"delegatedBy,omitempty"`
	// SourceIP is copied from the verified Credential.SourceIP.
	SourceIP string `json:"-"`
	// credential is what the caller authenticated with, kept by the remote
	// port (remote.go) so that a decision can forward it to the IAM host,
	// which re-authenticates it; nil from every other port. A pointer, never
	// modified once set, so that copies of the Caller share it and %v prints
	// an address rather than the token; never serialized.
	credential *Credential
}

// Resource names a resource: its prefixed type and its id, e.g.
// {"compute-pool", "pool_…"}.
type Resource struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

func (r Resource) String() string { return r.Type + "/" + r.ID }

// Request is one question to IAM.
type Request struct {
	Caller   *Caller
	TenantID string // the tenant the decision is made in
	Action   string // e.g. "compute:pools:read"
	Resource Resource
	// Context is extra request context policies may read (context.*).
	Context map[string]any
	// RequestID is the caller's request id (Credential.RequestID), recorded
	// with the decision in IAM's audit chain. It takes no part in the
	// decision.
	RequestID string
}

// Reasons a decision carries. Callers of the port only ever see
// ACCESS_DENIED for a denial; the reason goes to IAM's audit chain.
const (
	ReasonAllow            = "ALLOW"
	ReasonDeny             = "DENY"              // no permit, or a forbid
	ReasonTenantMismatch   = "TENANT_MISMATCH"   // a caller of another tenant
	ReasonRootOverride     = "ROOT_OVERRIDE"     // root authority into another tenant (allowed, audited)
	ReasonResourceMismatch = "RESOURCE_MISMATCH" // the resolver echoed another resource
	ReasonResolverRequired = "RESOURCE_RESOLVER_REQUIRED"
	ReasonUnknownAction    = "UNKNOWN_ACTION"
	ReasonResolveFailed    = "RESOLVE_FAILED" // a timeout or an unloaded projection
)

// Decision is IAM's answer to one Request.
type Decision struct {
	Allowed bool   `json:"allowed"`
	Reason  string `json:"reason"`
}

// MaxBatch is the most requests one AuthorizeMany takes.
const MaxBatch = 50

// Port is the IamPort: what the envelope asks IAM. Every denial surfaces as
// core ACCESS_DENIED; a resource that does not exist is core NOT_FOUND (and
// aborts a whole AuthorizeMany batch); an unknown credential is
// UNAUTHENTICATED.
type Port interface {
	Authenticate(ctx context.Context, cred Credential) (*Caller, error)
	// Authorize answers a read's decision.
	Authorize(ctx context.Context, req Request) (Decision, error)
	// Require returns nil when allowed and ACCESS_DENIED otherwise.
	Require(ctx context.Context, req Request) error
	// AuthorizeMany decides up to MaxBatch requests, answers in order.
	AuthorizeMany(ctx context.Context, reqs []Request) ([]Decision, error)
	// TenantKnown reports whether IAM knows tenantID, for caller c (which
	// only a caller with root authority needs to ask: no other acts in a
	// tenant not its own). A known tenant is cached.
	TenantKnown(ctx context.Context, c *Caller, tenantID string) (bool, error)
}

// Refresher is the optional part of a Port: re-read one resource before an
// admission's decision so it never decides on a stale copy.
type Refresher interface {
	RefreshResource(ctx context.Context, tenantID string, r Resource) error
}

// Resolved is a resource as the resolver answers it: the echo of what was
// asked, its owner, its parent and its declared attributes.
type Resolved struct {
	TenantID   string         `json:"tenantId"`
	Type       string         `json:"type"`
	ID         string         `json:"id"`
	OwnerID    string         `json:"ownerId,omitempty"`
	ParentType string         `json:"parentType,omitempty"`
	ParentID   string         `json:"parentId,omitempty"`
	Attributes map[string]any `json:"attributes,omitempty"`
}

// Resolver answers what a resource is, in a tenant's view. A hit does no
// I/O. It returns core NOT_FOUND for a resource that does not exist in that
// view and a non-NOT_FOUND error (which denies) for a timeout or an unloaded
// projection.
type Resolver interface {
	Resolve(ctx context.Context, tenantID string, r Resource) (*Resolved, error)
}

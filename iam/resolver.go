package iam

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/core"
)

// ProjectionResolverConfig configures NewProjectionResolver.
type ProjectionResolverConfig struct {
	Projection *Projection   // required
	Catalog    *core.Catalog // required: the prefix and the scope types
	RootTenant string        // required: the only tenant compute-fleet/global resolves in
	// Fallback resolves the types that are not compute's (another prefix,
	// or not in the catalog): the host's own resources. Without it they
	// fail with ErrResolverRequired.
	Fallback Resolver
}

// ProjectionResolver is the Resolver over the authorization projection
// ("How the resolver answers" in the actions-and-resources spec):
//
//   - compute-fleet/global resolves only in the root tenant;
//     compute-tenant/{t} only when t is the decision's tenant. Neither needs
//     the projection, so system.selfCheck stays decidable while it loads.
//   - every other type (compute-project included) resolves from its row, in
//     the row's owner tenant or in a tenant it is shared with; anywhere else
//     it is core NOT_FOUND, like a row that does not exist.
//   - a hit does no I/O; a miss costs one primary-key read bounded to the
//     projection's MissTimeout; a timeout, a failed read or an unloaded
//     projection is an error wrapping ErrResolveFailed (which denies).
//
// It also implements Refresher.
type ProjectionResolver struct {
	p        *Projection
	cat      *core.Catalog
	root     string
	fallback Resolver
	fleet    string // full type names of the two row-less scope types
	tenant   string
}

// NewProjectionResolver checks cfg and makes the resolver.
func NewProjectionResolver(cfg ProjectionResolverConfig) (*ProjectionResolver, error) {
	if cfg.Projection == nil || cfg.Catalog == nil || cfg.RootTenant == "" {
		return nil, core.Errorf(core.CodeInvalidConfig, "iam: the projection resolver needs a projection, a catalog and the root tenant")
	}
	return &ProjectionResolver{
		p: cfg.Projection, cat: cfg.Catalog, root: cfg.RootTenant, fallback: cfg.Fallback,
		fleet: cfg.Catalog.FullName("fleet"), tenant: cfg.Catalog.FullName("tenant"),
	}, nil
}

func notFound(r Resource) error {
	return core.Errorf(core.CodeNotFound, "%s/%s not found", r.Type, r.ID)
}

// Resolve answers what r is in tenantID's view.
func (s *ProjectionResolver) Resolve(ctx context.Context, tenantID string, r Resource) (*Resolved, error) {
	if _, ours := s.cat.ShortName(r.Type); !ours {
		if s.fallback != nil {
			return s.fallback.Resolve(ctx, tenantID, r)
		}
		return nil, fmt.Errorf("%w: %s", ErrResolverRequired, r.Type)
	}
	if r.ID == "" || tenantID == "" {
		return nil, notFound(r)
	}
	switch r.Type {
	case s.fleet:
		if r.ID != core.FleetID || tenantID != s.root {
			return nil, notFound(r)
		}
		return &Resolved{TenantID: tenantID, Type: r.Type, ID: r.ID}, nil
	case s.tenant:
		if r.ID != tenantID {
			return nil, notFound(r)
		}
		return &Resolved{TenantID: tenantID, Type: r.Type, ID: r.ID}, nil
	}
	e, err := s.p.lookup(ctx, r.Type, r.ID, tenantID)
	if err != nil {
		return nil, err
	}
	if !e.visibleIn(tenantID) {
		return nil, notFound(r)
	}
	return &Resolved{
		TenantID: tenantID, Type: r.Type, ID: r.ID,
		OwnerID: e.ownerID, ParentType: e.parentType, ParentID: e.parentID,
		Attributes: cloneAttributes(e.attributes),
	}, nil
}

// RefreshResource re-reads r's row (Projection.Refresh) so that the next
// decision sees the caller's last commit. The row-less scope types need
// nothing; another prefix's types go to the fallback when it is a
// Refresher, and otherwise need nothing either.
func (s *ProjectionResolver) RefreshResource(ctx context.Context, tenantID string, r Resource) error {
	if _, ours := s.cat.ShortName(r.Type); !ours {
		if rf, ok := s.fallback.(Refresher); ok {
			return rf.RefreshResource(ctx, tenantID, r)
		}
		return nil
	}
	if r.Type == s.fleet || r.Type == s.tenant {
		return nil
	}
	return s.p.Refresh(ctx, r.Type, r.ID, tenantID)
}

var (
	_ Resolver  = (*ProjectionResolver)(nil)
	_ Refresher = (*ProjectionResolver)(nil)
)

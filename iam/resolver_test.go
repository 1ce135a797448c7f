package iam

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

type wantKind int

const (
	wantOK wantKind = iota
	wantNotFound
	wantResolverRequired
)

func TestResolverAnswers(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, ProjectionOptions{})
	put(t, f.s,
		store.AuthzResource{Type: "compute-project", ID: "prj_1", TenantID: tenantA, OwnerID: "idn_a"},
		pool("pool_1", tenantA, tenantB),
		pool("pool_root", rootTenant),
		reservation("rsv_1", tenantA, 24),
	)
	mustLoad(t, f.p)

	tests := []struct {
		name   string
		tenant string
		res    Resource
		want   wantKind
		// wantOut is checked when set (TenantID/Type/ID are always checked).
		wantOut *Resolved
	}{
		{name: "fleet in the root tenant", tenant: rootTenant, res: Resource{"compute-fleet", "global"}},
		{name: "fleet in another tenant", tenant: tenantA, res: Resource{"compute-fleet", "global"}, want: wantNotFound},
		{name: "fleet with another id", tenant: rootTenant, res: Resource{"compute-fleet", "other"}, want: wantNotFound},
		{name: "own tenant scope", tenant: tenantA, res: Resource{"compute-tenant", tenantA}},
		{name: "another tenant's scope", tenant: tenantA, res: Resource{"compute-tenant", tenantB}, want: wantNotFound},
		{name: "another tenant's scope from root", tenant: rootTenant, res: Resource{"compute-tenant", tenantA}, want: wantNotFound},
		{name: "empty tenant scope", tenant: "", res: Resource{"compute-tenant", ""}, want: wantNotFound},
		{
			name: "project in its tenant", tenant: tenantA, res: Resource{"compute-project", "prj_1"},
			wantOut: &Resolved{TenantID: tenantA, Type: "compute-project", ID: "prj_1", OwnerID: "idn_a"},
		},
		{name: "project in another tenant", tenant: tenantB, res: Resource{"compute-project", "prj_1"}, want: wantNotFound},
		{name: "project in the root tenant", tenant: rootTenant, res: Resource{"compute-project", "prj_1"}, want: wantNotFound},
		{name: "absent project", tenant: tenantA, res: Resource{"compute-project", "prj_none"}, want: wantNotFound},
		{
			name: "pool in its owner tenant", tenant: tenantA, res: Resource{"compute-pool", "pool_1"},
			wantOut: &Resolved{TenantID: tenantA, Type: "compute-pool", ID: "pool_1",
				Attributes: map[string]any{"gpuModel": "H100", "class": "metal-host"}},
		},
		{
			name: "pool in a tenant it is shared with", tenant: tenantB, res: Resource{"compute-pool", "pool_1"},
			wantOut: &Resolved{TenantID: tenantB, Type: "compute-pool", ID: "pool_1",
				Attributes: map[string]any{"gpuModel": "H100", "class": "metal-host"}},
		},
		{name: "pool in a tenant it is not shared with", tenant: tenantC, res: Resource{"compute-pool", "pool_1"}, want: wantNotFound},
		{name: "root pool in the root tenant", tenant: rootTenant, res: Resource{"compute-pool", "pool_root"}},
		{name: "root pool in another tenant", tenant: tenantA, res: Resource{"compute-pool", "pool_root"}, want: wantNotFound},
		{
			name: "reservation with its parent", tenant: tenantA, res: Resource{"compute-reservation", "rsv_1"},
			wantOut: &Resolved{TenantID: tenantA, Type: "compute-reservation", ID: "rsv_1", OwnerID: "idn_owner",
				ParentType: "compute-pool", ParentID: "pool_1",
				Attributes: map[string]any{"durationHours": 24.0, "gpuCount": 8.0, "gpuModel": "H100"}},
		},
		{name: "same id, another type", tenant: tenantA, res: Resource{"compute-node", "rsv_1"}, want: wantNotFound},
		{name: "empty id", tenant: tenantA, res: Resource{"compute-pool", ""}, want: wantNotFound},
		{name: "a host type", tenant: tenantA, res: Resource{"iam-user", "u1"}, want: wantResolverRequired},
		{name: "our prefix, not in the catalog", tenant: tenantA, res: Resource{"compute-widget", "w1"}, want: wantResolverRequired},
		{name: "the bare prefix", tenant: tenantA, res: Resource{"compute-", "x"}, want: wantResolverRequired},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := f.r.Resolve(ctx, tc.tenant, tc.res)
			switch tc.want {
			case wantOK:
				if err != nil {
					t.Fatalf("Resolve = %v", err)
				}
				if got.TenantID != tc.tenant || got.Type != tc.res.Type || got.ID != tc.res.ID {
					t.Fatalf("the answer does not echo {%s %s %s}: %+v", tc.tenant, tc.res.Type, tc.res.ID, got)
				}
				if tc.wantOut != nil && !reflect.DeepEqual(got, tc.wantOut) {
					t.Fatalf("Resolve = %+v, want %+v", got, tc.wantOut)
				}
			case wantNotFound:
				if !errors.Is(err, core.ErrNotFound) {
					t.Fatalf("Resolve = %+v, %v; want NOT_FOUND", got, err)
				}
			case wantResolverRequired:
				if !errors.Is(err, ErrResolverRequired) || errors.Is(err, core.ErrNotFound) {
					t.Fatalf("Resolve = %+v, %v; want ErrResolverRequired", got, err)
				}
			}
		})
	}
}

func TestResolverSharingChanges(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, ProjectionOptions{})
	put(t, f.s, pool("pool_1", tenantA, tenantB, tenantC, tenantB, tenantA))
	mustLoad(t, f.p)
	res := Resource{Type: "compute-pool", ID: "pool_1"}
	for _, tn := range []string{tenantA, tenantB, tenantC} {
		if _, err := f.r.Resolve(ctx, tn, res); err != nil {
			t.Fatalf("in %s: %v", tn, err)
		}
	}
	// The offer to tenant B ends.
	put(t, f.s, pool("pool_1", tenantA, tenantC))
	mustTail(t, f.p)
	if _, err := f.r.Resolve(ctx, tenantB, res); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("in %s after the offer ended: %v, want NOT_FOUND", tenantB, err)
	}
	if _, err := f.r.Resolve(ctx, tenantC, res); err != nil {
		t.Fatalf("in %s: %v", tenantC, err)
	}
}

type fakeResolver struct {
	calls     int
	refreshes int
}

func (f *fakeResolver) Resolve(_ context.Context, tenantID string, r Resource) (*Resolved, error) {
	f.calls++
	return &Resolved{TenantID: tenantID, Type: r.Type, ID: r.ID, OwnerID: "host"}, nil
}

func (f *fakeResolver) RefreshResource(context.Context, string, Resource) error {
	f.refreshes++
	return nil
}

func TestResolverFallback(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, ProjectionOptions{})
	host := &fakeResolver{}
	r, err := NewProjectionResolver(ProjectionResolverConfig{Projection: f.p, Catalog: f.cat, RootTenant: rootTenant, Fallback: host})
	if err != nil {
		t.Fatal(err)
	}
	// The fallback answers host types even before the projection loads.
	got, err := r.Resolve(ctx, tenantA, Resource{Type: "iam-user", ID: "u1"})
	if err != nil || got.OwnerID != "host" || host.calls != 1 {
		t.Fatalf("Resolve = %+v, %v (calls %d)", got, err, host.calls)
	}
	if _, err := r.Resolve(ctx, tenantA, Resource{Type: "compute-pool", ID: "p"}); !errors.Is(err, ErrNotLoaded) || host.calls != 1 {
		t.Fatalf("a compute type went to the fallback or resolved unloaded: %v", err)
	}
	if err := r.RefreshResource(ctx, tenantA, Resource{Type: "iam-user", ID: "u1"}); err != nil || host.refreshes != 1 {
		t.Fatalf("RefreshResource of a host type: %v (refreshes %d)", err, host.refreshes)
	}
	// Without a fallback, refreshing a host type has nothing to do.
	if err := f.r.RefreshResource(ctx, tenantA, Resource{Type: "iam-user", ID: "u1"}); err != nil {
		t.Fatal(err)
	}
	// Scope types have no row to refresh.
	if err := f.r.RefreshResource(ctx, tenantA, Resource{Type: "compute-tenant", ID: tenantA}); err != nil {
		t.Fatal(err)
	}
	if st := f.p.Stats(); st.Refreshes != 0 {
		t.Fatalf("scope refreshes reached the projection: %+v", st)
	}
}

func TestResolverConfig(t *testing.T) {
	cat, _ := core.DefaultCatalog()
	p := NewProjection(nil, ProjectionOptions{})
	for _, cfg := range []ProjectionResolverConfig{
		{Catalog: cat, RootTenant: rootTenant},
		{Projection: p, RootTenant: rootTenant},
		{Projection: p, Catalog: cat},
	} {
		if _, err := NewProjectionResolver(cfg); !errors.Is(err, core.ErrInvalidConfig) {
			t.Errorf("NewProjectionResolver(%+v) = %v, want INVALID_CONFIG", cfg, err)
		}
	}
}

// TestResolverCustomPrefix: the prefix is configuration; rows are stored
// with the prefix they were written with.
func TestResolverCustomPrefix(t *testing.T) {
	ctx := context.Background()
	cat, err := core.NewCatalog(core.CatalogConfig{TypePrefix: "gpu-"})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, ProjectionOptions{})
	p := NewProjection(f.s, ProjectionOptions{Catalog: cat})
	r, err := NewProjectionResolver(ProjectionResolverConfig{Projection: p, Catalog: cat, RootTenant: rootTenant})
	if err != nil {
		t.Fatal(err)
	}
	put(t, f.s, store.AuthzResource{Type: "gpu-pool", ID: "pool_1", TenantID: tenantA, Attributes: map[string]any{"region": "eu"}})
	mustLoad(t, p)
	got, err := r.Resolve(ctx, tenantA, Resource{Type: "gpu-pool", ID: "pool_1"})
	if err != nil || got.Attributes["region"] != "eu" {
		t.Fatalf("Resolve = %+v, %v", got, err)
	}
	if _, err := r.Resolve(ctx, rootTenant, Resource{Type: "gpu-fleet", ID: "global"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Resolve(ctx, tenantA, Resource{Type: "compute-pool", ID: "pool_1"}); !errors.Is(err, ErrResolverRequired) {
		t.Fatalf("the default prefix under gpu-: %v, want ErrResolverRequired", err)
	}
}

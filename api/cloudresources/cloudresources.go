// Package cloudresources describes the cloudResources.* methods
// (cloud-resources-api.md). The calls record what the tenant wants and
// answer at once; each resource's workflow (activities/cloudresources,
// workflows/cloudresources) converges the provider on it. What a kind
// takes and reports is its manifest's (drivers/cloudresources); the rows
// and their rules are store/cloudresources'.
package cloudresources

import (
	"context"
	"encoding/json"
	"time"

	activities "github.com/better-compute/better-compute/activities/cloudresources"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	rules "github.com/better-compute/better-compute/core/cloudresources"
	drivers "github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/cloudresources"
	"github.com/better-compute/better-compute/store/pools"
	"github.com/better-compute/better-compute/store/provideraccounts"
)

// Resource is a cloud resource as the methods answer it.
type Resource = domain.Resource

// KindsInput is cloudResources.kinds' input.
type KindsInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
}

// Kind is one kind the pool's provider serves: its manifest, whether it
// is available on the pool's account (a preview needs previews on the
// account) and the tenant's quota of it.
type Kind struct {
	*drivers.Manifest
	Available bool `json:"available"`
	Quota     int  `json:"quota"`
}

// KindsAnswer is cloudResources.kinds' answer.
type KindsAnswer struct {
	PoolID   string `json:"poolId"`
	Provider string `json:"provider"`
	Kinds    []Kind `json:"kinds"`
}

// CreateInput is cloudResources.create's input.
type CreateInput struct {
	TenantID       string          `json:"tenantId" jsonschema:"required" id:"tenant"`
	ProjectID      string          `json:"projectId,omitempty" id:"prj"`
	PoolID         string          `json:"poolId" jsonschema:"required" id:"pool"`
	Kind           string          `json:"kind" jsonschema:"required,maxLength=64,pattern=^[a-z0-9]+(?:[.-][a-z0-9]+)*$"`
	Name           string          `json:"name" jsonschema:"required,maxLength=63,pattern=^[a-z]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	Description    string          `json:"description,omitempty" jsonschema:"maxLength=256"`
	ParentID       string          `json:"parentId,omitempty" id:"crs"`
	Spec           json.RawMessage `json:"spec" jsonschema:"required,type=object"`
	IdempotencyKey string          `json:"idempotencyKey" jsonschema:"required" id:"tenant"`
}

// ListInput is cloudResources.list's input: oldest first, at most
// maxListed (the spec's input and cap: it does not page).
type ListInput struct {
	TenantID       string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID         string `json:"poolId,omitempty" id:"pool"`
	ProjectID      string `json:"projectId,omitempty" id:"prj"`
	Kind           string `json:"kind,omitempty" jsonschema:"maxLength=64,pattern=^[a-z0-9]+(?:[.-][a-z0-9]+)*$"`
	Family         string `json:"family,omitempty" jsonschema:"enum=storage,enum=network,enum=edge,enum=data,enum=platform,enum=ai,enum=observability"`
	IncludeDeleted bool   `json:"includeDeleted,omitempty"`
}

// maxListed is the most resources a list answers.
const maxListed = 500

// ResourceList is cloudResources.list's answer; Truncated says the cap
// cut it.
type ResourceList struct {
	Items     []Resource `json:"items"`
	Truncated bool       `json:"truncated"`
}

// ResourceInput names one resource.
type ResourceInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ResourceID string `json:"resourceId" jsonschema:"required" id:"crs"`
}

// UpdateInput is cloudResources.update's input: spec is merged onto the
// stored one (a null member removes it); description null clears it.
type UpdateInput struct {
	TenantID    string          `json:"tenantId" jsonschema:"required" id:"tenant"`
	ResourceID  string          `json:"resourceId" jsonschema:"required" id:"crs"`
	Spec        json.RawMessage `json:"spec,omitempty" jsonschema:"type=object"`
	Description *string         `json:"description,omitempty" jsonschema:"nullable,maxLength=256"`
}

// The methods.
const (
	Kinds    rpc.Ref[KindsInput, KindsAnswer]       = "cloudResources.kinds"
	Create   rpc.Ref[CreateInput, Resource]         = "cloudResources.create"
	List     rpc.Ref[ListInput, ResourceList]       = "cloudResources.list"
	Get      rpc.Ref[ResourceInput, Resource]       = "cloudResources.get"
	Update   rpc.Ref[UpdateInput, Resource]         = "cloudResources.update"
	Delete   rpc.Ref[ResourceInput, Resource]       = "cloudResources.delete"
	Release  rpc.Ref[ResourceInput, Resource]       = "cloudResources.release"
	Adopt    rpc.Ref[AdoptInput, Resource]          = "cloudResources.adopt"
	Discover rpc.Ref[DiscoverInput, DiscoverAnswer] = "cloudResources.discover"
	Catalog  rpc.Ref[CatalogInput, CatalogAnswer]   = "cloudResources.catalog"
	Signals  rpc.Ref[SignalsInput, SignalsAnswer]   = "cloudResources.signals"
)

type methods struct {
	d       rpc.Deps
	signals *signalCache
}

func (m methods) types() domain.Types {
	return domain.Types{Resource: m.d.Catalog.FullName(domain.ResourceType), Pool: m.d.Catalog.FullName(pools.ResourceType)}
}

// Methods describes the cloudResources.* methods.
func Methods(d rpc.Deps) []rpc.Descriptor {
	m := methods{d: d, signals: newSignalCache(signalsTTL)}
	const read = "compute:cloud-resources:read"
	return []rpc.Descriptor{
		&rpc.Method[KindsInput, KindsAnswer]{Name: Kinds, Action: read, DecidedOn: "compute-tenant",
			Phase: "v1.0", Kind: core.KindRead,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in KindsInput) (KindsAnswer, error) {
				return kinds(ctx, tx, c.TenantID, in.PoolID, d.CloudResources.Quotas)
			}},
		&rpc.Method[CatalogInput, CatalogAnswer]{Name: Catalog, Action: read, DecidedOn: "compute-tenant",
			Phase: "v1.0", Kind: core.KindRead, Direct: m.catalog},
		&rpc.Method[SignalsInput, SignalsAnswer]{Name: Signals, Action: read, DecidedOn: "compute-tenant",
			Phase: "v1.0", Kind: core.KindRead, Direct: m.signalsOf},
		&rpc.Method[CreateInput, Resource]{Name: Create, Action: "compute:cloud-resources:create", DecidedOn: "compute-cloud-resource",
			Phase: "v1.0", Kind: core.KindAdmission,
			Admission: draftAdmission(m, m.draft)},
		&rpc.Method[ListInput, ResourceList]{Name: List, Action: read, DecidedOn: "compute-tenant + items",
			Phase: "v1.0", Kind: core.KindRead,
			List: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ListInput) (rpc.Page, error) {
				q := store.PageQuery{Limit: maxListed}
				f := domain.Filter{PoolID: in.PoolID, ProjectID: in.ProjectID, Kind: in.Kind, Family: in.Family, IncludeEnded: in.IncludeDeleted}
				items, err := domain.List(ctx, tx, m.types().Resource, c.TenantID, f, q)
				return rpc.PageOf(items, q, func(r Resource) store.Key { return store.Key{At: r.CreatedAt, ID: r.ID} },
					func(r Resource) iam.Resource {
						// An ended resource's authorization row is gone: its
						// record is read as the tenant's, as the list is.
						if rules.Ended(r.State) {
							return d.Resource("tenant", r.TenantID)
						}
						return d.Resource(domain.ResourceType, r.ID)
					},
					func(kept []Resource, next string) any { return ResourceList{Items: kept, Truncated: next != ""} }), err
			}},
		&rpc.Method[ResourceInput, Resource]{Name: Get, Action: read, DecidedOn: "compute-cloud-resource",
			Phase: "v1.0", Kind: core.KindRead,
			Read: func(c *rpc.Call, b *store.Batch, in ResourceInput) func() (Resource, error) {
				return domain.QueueLoad(b, c.TenantID, in.ResourceID)
			}},
		&rpc.Method[UpdateInput, Resource]{Name: Update, Action: "compute:cloud-resources:update", DecidedOn: "compute-cloud-resource",
			Phase: "v1.0", Kind: core.KindMutation, Run: m.update, After: signalAfter[UpdateInput](m)},
		&rpc.Method[ResourceInput, Resource]{Name: Delete, Action: "compute:cloud-resources:delete", DecidedOn: "compute-cloud-resource",
			Phase: "v1.0", Kind: core.KindMutation,
			Run: func(ctx context.Context, c *rpc.Call, tx store.Tx, in ResourceInput) (Resource, error) {
				return domain.Delete(ctx, tx, c.TenantID, in.ResourceID)
			},
			After: m.afterDelete},
		&rpc.Method[ResourceInput, Resource]{Name: Release, Action: "compute:cloud-resources:delete", DecidedOn: "compute-cloud-resource",
			Phase: "v1.0", Kind: core.KindMutation, Run: m.release, After: signalAfter[ResourceInput](m)},
		&rpc.Method[DiscoverInput, DiscoverAnswer]{Name: Discover, Action: read, DecidedOn: "compute-tenant",
			Phase: "v1.0", Kind: core.KindRead, Direct: m.discover},
		&rpc.Method[AdoptInput, Resource]{Name: Adopt, Action: "compute:cloud-resources:create", DecidedOn: "compute-cloud-resource",
			Phase: "v1.0", Kind: core.KindAdmission,
			Admission: draftAdmission(m, m.adoptDraft)},
	}
}

// draftAdmission is create's and adopt's admission: draft writes the
// draft the decision is made on; the rest is shared.
func draftAdmission[In any](m methods, draft func(ctx context.Context, c *rpc.Call, tx store.Tx, draftID string, in In) (store.AuthzResource, error)) *rpc.Admission[In, Resource] {
	return &rpc.Admission[In, Resource]{
		Prepare: func(ctx context.Context, c *rpc.Call, tx store.Tx, draftID string, in In) (iam.Resource, error) {
			row, err := draft(ctx, c, tx, draftID, in)
			return iam.Resource{Type: row.Type, ID: row.ID}, err
		},
		Complete: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ In) (Resource, error) {
			return m.complete(ctx, c, tx)
		},
		Denied: func(ctx context.Context, c *rpc.Call, tx store.Tx, _ In) error {
			return domain.Deny(ctx, tx, c.TenantID, c.Resource.ID)
		},
		Started: func(ctx context.Context, c *rpc.Call, _ In) error { return m.start(ctx, c) },
	}
}

// providerPool reads the pool a call names and its account: a pool the
// tenant cannot see is NOT_FOUND; one that is not a provider pool, or
// whose provider serves no cloud resources, is UNSUPPORTED.
func providerPool(ctx context.Context, tx store.Tx, tenantID, poolID string) (pools.Pool, provideraccounts.Account, *drivers.KindSet, error) {
	p, err := pools.View(ctx, tx, tenantID, poolID)
	if err != nil {
		return pools.Pool{}, provideraccounts.Account{}, nil, err
	}
	if p.Class != "provider" || p.ProviderAccountID == "" {
		return pools.Pool{}, provideraccounts.Account{}, nil, core.Errorf(core.CodeUnsupported, "pool %s is a %s pool; cloud resources live in provider pools", p.ID, p.Class).
			WithDetails(map[string]any{"reason": "notProviderPool"})
	}
	acct, err := provideraccounts.Get(ctx, tx, p.ProviderAccountID)
	if err != nil {
		return pools.Pool{}, provideraccounts.Account{}, nil, err
	}
	set := activities.KindsOf(acct.Provider)
	if set == nil {
		return pools.Pool{}, provideraccounts.Account{}, nil, core.Errorf(core.CodeUnsupported, "provider %s serves no cloud resources", acct.Provider).
			WithDetails(map[string]any{"reason": "noCloudResources", "provider": acct.Provider})
	}
	return p, acct, set, nil
}

// kinds answers the kinds of the pool's provider.
func kinds(ctx context.Context, tx store.Tx, tenantID, poolID string, quotas rules.Quotas) (KindsAnswer, error) {
	p, acct, set, err := providerPool(ctx, tx, tenantID, poolID)
	if err != nil {
		return KindsAnswer{}, err
	}
	out := KindsAnswer{PoolID: p.ID, Provider: acct.Provider, Kinds: []Kind{}}
	for _, m := range set.All() {
		out.Kinds = append(out.Kinds, Kind{Manifest: m, Available: !m.Preview || acct.Previews, Quota: quotas.Of(m.Kind)})
	}
	return out, nil
}

// start starts the admitted resource's workflow (after the commit and on
// every replay) and records the start; a failure leaves the start owed
// to the reconciler, and the call answers UNAVAILABLE so a retry with
// the same key starts it.
func (m methods) start(ctx context.Context, c *rpc.Call) error {
	if m.d.Temporal == nil {
		return nil
	}
	var r Resource
	if err := m.d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		r, err = domain.Load(ctx, tx, c.TenantID, c.Resource.ID, false)
		return err
	}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := activities.StartResource(ctx, m.d.Temporal, m.d.TaskQueue, m.params(r)); err != nil {
		return err
	}
	return domain.WorkflowStarted(ctx, m.d.Store.Pool, r.ID)
}

func (m methods) params(r Resource) activities.ResourceParams {
	return activities.ResourceParams{TenantID: r.TenantID, ResourceID: r.ID, PoolID: r.PoolID,
		ConvergingEvery: m.d.CloudResources.ConvergingEvery, SettledEvery: m.d.CloudResources.SettledEvery}
}

// signal asks the resource's workflow to reconcile now, best effort: the
// row holds the change, and the workflow's next wait (or the
// reconciler's start) finds it.
func (m methods) signal(ctx context.Context, id string) {
	if m.d.Temporal == nil {
		return
	}
	if err := activities.Signal(ctx, m.d.Temporal, id); err != nil {
		m.d.Logger.WarnContext(ctx, "signalling a cloud resource's workflow", "resource", id, "error", err)
	}
}

func signalAfter[In any](m methods) func(ctx context.Context, c *rpc.Call, _ In, out Resource) (Resource, error) {
	return func(ctx context.Context, c *rpc.Call, _ In, out Resource) (Resource, error) {
		m.signal(ctx, out.ID)
		return out, nil
	}
}

// afterDelete signals the resource's workflow and those of the children
// the delete marked, so the children go first without waiting.
func (m methods) afterDelete(ctx context.Context, c *rpc.Call, _ ResourceInput, out Resource) (Resource, error) {
	var children []Resource
	_ = m.d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		children, err = domain.Descendants(ctx, tx, out.ID)
		return err
	})
	for _, ch := range children {
		m.signal(ctx, ch.ID)
	}
	m.signal(ctx, out.ID)
	return out, nil
}

package cloudresources

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	activities "github.com/better-compute/better-compute/activities/cloudresources"
	"github.com/better-compute/better-compute/api/provideraccounts"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	drivers "github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/cloudresources"
	"github.com/better-compute/better-compute/store/pools"
	accounts "github.com/better-compute/better-compute/store/provideraccounts"
	"github.com/better-compute/better-compute/store/secrets"
)

// DiscoverInput is cloudResources.discover's input.
type DiscoverInput struct {
	TenantID string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID   string `json:"poolId" jsonschema:"required" id:"pool"`
	Kind     string `json:"kind" jsonschema:"required,maxLength=64,pattern=^[a-z0-9]+(?:[.-][a-z0-9]+)*$"`
}

// Discovered is one resource of the tenant's own account.
type Discovered struct {
	ProviderID string          `json:"providerId"`
	Name       string          `json:"name"`
	Region     string          `json:"region,omitempty"`
	Spec       json.RawMessage `json:"spec"`
	// ManagedBy is "this" deployment, an "other" one, or absent: none.
	ManagedBy  string `json:"managedBy,omitempty"`
	ResourceID string `json:"resourceId,omitempty"`
}

// DiscoverAnswer is cloudResources.discover's answer (a bounded set, at
// most 500).
type DiscoverAnswer struct {
	PoolID    string       `json:"poolId"`
	Kind      string       `json:"kind"`
	Resources []Discovered `json:"resources"`
}

// AdoptInput is cloudResources.adopt's input.
type AdoptInput struct {
	TenantID       string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ProjectID      string `json:"projectId,omitempty" id:"prj"`
	PoolID         string `json:"poolId" jsonschema:"required" id:"pool"`
	Kind           string `json:"kind" jsonschema:"required,maxLength=64,pattern=^[a-z0-9]+(?:[.-][a-z0-9]+)*$"`
	ProviderID     string `json:"providerId" jsonschema:"required,minLength=1,maxLength=200"`
	Name           string `json:"name" jsonschema:"required,maxLength=63,pattern=^[a-z]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	Description    string `json:"description,omitempty" jsonschema:"maxLength=256"`
	IdempotencyKey string `json:"idempotencyKey" jsonschema:"required" id:"tenant"`
}

// CatalogInput is cloudResources.catalog's input.
type CatalogInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID     string `json:"poolId" jsonschema:"required" id:"pool"`
	InstallsOn string `json:"installsOn,omitempty" jsonschema:"enum=instance,enum=kubernetes"`
}

// CatalogAnswer is cloudResources.catalog's answer (at most 1000).
type CatalogAnswer struct {
	PoolID string               `json:"poolId"`
	Apps   []drivers.CatalogApp `json:"apps"`
}

// SignalsInput is cloudResources.signals' input.
type SignalsInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	PoolID     string `json:"poolId" jsonschema:"required" id:"pool"`
	ResourceID string `json:"resourceId,omitempty" id:"crs"`
}

// Signal is a provider's signal with the resource that records it.
type Signal struct {
	drivers.Signal
	ResourceID string `json:"resourceId,omitempty"`
}

// SignalsAnswer is cloudResources.signals' answer (newest first, at most
// 500).
type SignalsAnswer struct {
	PoolID  string   `json:"poolId"`
	Signals []Signal `json:"signals"`
}

// opened is a pool's account, opened for one call.
type opened struct {
	pool pools.Pool
	acct accounts.Account
	set  *drivers.KindSet
	res  drivers.ProviderResources
}

// open reads the pool and resolves its account's token in a read-write
// transaction of its own (the resolution is recorded), commits, then
// opens the account: no transaction is held across a provider call.
// check runs on the pool and account inside the transaction.
func (m methods) open(ctx context.Context, c *rpc.Call, poolID, purpose string, check func(tx store.Tx, o *opened) error) (opened, error) {
	var o opened
	var cred providers.Credential
	switch {
	case m.d.Providers == nil:
		return o, core.Errorf(core.CodeUnavailable, "no provider drivers are configured")
	case !m.d.Secrets.Configured():
		return o, core.Errorf(core.CodeUnavailable, "no secret store is configured")
	}
	err := m.d.Store.InTx(ctx, store.ReadWrite, func(tx store.Tx) (err error) {
		if o.pool, o.acct, o.set, err = providerPool(ctx, tx, c.TenantID, poolID); err != nil {
			return err
		}
		if check != nil {
			if err := check(tx, &o); err != nil {
				return err
			}
		}
		token, err := accounts.Token(ctx, tx, m.d.Secrets, o.acct, secrets.Use{Purpose: purpose,
			IdentityKind: c.Caller.IdentityKind, IdentityID: c.Caller.IdentityID, RequestID: c.Cred.RequestID})
		cred = providers.Credential{Kind: o.acct.Provider, Token: token, BaseURL: o.acct.BaseURL}
		return err
	})
	if err != nil {
		return o, err
	}
	if o.res, err = activities.Open(ctx, m.d.Providers, cred); err != nil {
		return o, provideraccounts.ProviderError(err)
	}
	return o, nil
}

// ownAccount refuses a pool on an account of another tenant (a platform
// pool offered to the tenant): discover and adopt are for the tenant's
// own account.
func ownAccount(tenantID string, o *opened) error {
	if o.acct.TenantID != tenantID {
		return core.Errorf(core.CodeAccessDenied, "pool %s is on an account of another tenant: only the tenant's own account is discovered or adopted from", o.pool.ID).
			WithDetails(map[string]any{"reason": "notAccountOwner"})
	}
	return nil
}

// discover lists the kind's resources on the tenant's own account, each
// with who manages it and the resource that records it.
func (m methods) discover(ctx context.Context, c *rpc.Call, in DiscoverInput) (DiscoverAnswer, error) {
	o, err := m.open(ctx, c, in.PoolID, "cloud-resources-discover", func(_ store.Tx, o *opened) error {
		if err := ownAccount(c.TenantID, o); err != nil {
			return err
		}
		_, err := m.servedKind(o.set, o.acct, in.Kind)
		return err
	})
	if err != nil {
		return DiscoverAnswer{}, err
	}
	found, err := o.res.List(ctx, in.Kind, drivers.MaxList)
	if errors.Is(err, drivers.ErrNotListable) {
		return DiscoverAnswer{}, core.Errorf(core.CodeUnsupported, "a %s lives in a parent: discover the parent", in.Kind).
			WithDetails(map[string]any{"reason": "parent"})
	}
	if err != nil {
		return DiscoverAnswer{}, provideraccounts.ProviderError(err)
	}
	ids := make([]string, 0, len(found))
	for _, f := range found {
		ids = append(ids, f.ProviderID)
	}
	var recorded map[string]string
	if err := m.d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		recorded, err = domain.RecordedProviderIDs(ctx, tx, o.acct.ID, in.Kind, ids)
		return err
	}); err != nil {
		return DiscoverAnswer{}, err
	}
	out := DiscoverAnswer{PoolID: o.pool.ID, Kind: in.Kind, Resources: []Discovered{}}
	for _, f := range found[:min(len(found), drivers.MaxList)] {
		d := Discovered{ProviderID: f.ProviderID, Name: f.Name, Region: f.Region, Spec: f.Spec, ResourceID: recorded[f.ProviderID]}
		if d.Spec == nil {
			d.Spec = json.RawMessage(`{}`)
		}
		if _, managed := drivers.ManagedBy(f.Labels); managed {
			d.ManagedBy = "other"
		}
		if d.ResourceID != "" {
			d.ManagedBy = "this"
		}
		out.Resources = append(out.Resources, d)
	}
	return out, nil
}

// adoptDraft asks the provider for the one resource before anything is
// recorded, then drafts it pending, adopted, with an empty spec.
func (m methods) adoptDraft(ctx context.Context, c *rpc.Call, tx store.Tx, draftID string, in AdoptInput) (store.AuthzResource, error) {
	p, acct, set, err := providerPool(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return store.AuthzResource{}, err
	}
	o := opened{pool: p, acct: acct, set: set}
	if err := ownAccount(c.TenantID, &o); err != nil {
		return store.AuthzResource{}, err
	}
	man, err := m.servedKind(set, acct, in.Kind)
	if err != nil {
		return store.AuthzResource{}, err
	}
	switch {
	case man.Parent != "":
		return store.AuthzResource{}, core.Errorf(core.CodeUnsupported, "a %s lives in a %s: adopt the parent and create its children", man.Kind, man.Parent).
			WithDetails(map[string]any{"reason": "parent"})
	case man.Books != nil:
		return store.AuthzResource{}, core.Errorf(core.CodeUnsupported, "a %s books capacity quota, and nothing was charged for what it runs on: create it through better-compute instead", man.Kind).
			WithDetails(map[string]any{"reason": "quotaBooked"})
	}
	if holder, err := domain.RecordedProviderIDs(ctx, tx, acct.ID, in.Kind, []string{in.ProviderID}); err != nil {
		return store.AuthzResource{}, err
	} else if id := holder[in.ProviderID]; id != "" {
		return store.AuthzResource{}, core.Errorf(core.CodeConflict, "%s is recorded already", in.ProviderID).
			WithDetails(map[string]any{"resourceId": id})
	}
	// The provider is asked inside the draft's transaction: an adopt is
	// rare, and a refusal here must leave nothing behind.
	token, err := accounts.Token(ctx, tx, m.d.Secrets, acct, secrets.Use{Purpose: "cloud-resources-adopt",
		IdentityKind: c.Caller.IdentityKind, IdentityID: c.Caller.IdentityID, RequestID: c.Cred.RequestID})
	if err != nil {
		return store.AuthzResource{}, err
	}
	res, err := activities.Open(ctx, m.d.Providers, providers.Credential{Kind: acct.Provider, Token: token, BaseURL: acct.BaseURL})
	if err != nil {
		return store.AuthzResource{}, provideraccounts.ProviderError(err)
	}
	callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	obs, err := res.Observe(callCtx, drivers.ObserveRequest{Ref: drivers.Ref{Kind: in.Kind, ProviderID: in.ProviderID}})
	switch {
	case errors.Is(err, providers.ErrNotFound):
		return store.AuthzResource{}, core.Errorf(core.CodeNotFound, "the provider has no %s %s", in.Kind, in.ProviderID)
	case err != nil:
		return store.AuthzResource{}, provideraccounts.ProviderError(err)
	}
	if _, managed := drivers.ManagedBy(obs.Labels); managed {
		return store.AuthzResource{}, core.Errorf(core.CodeInvalidState, "%s is managed by another deployment", in.ProviderID).
			WithDetails(map[string]any{"reason": "managedByAnother"})
	}
	return domain.Draft(ctx, tx, m.types(), c.TenantID, draftID, c.Caller.IdentityID, domain.Request{Pool: p, Provider: acct.Provider,
		Kind: man.Kind, Family: man.Family, Name: in.Name, Region: obs.Region, Spec: json.RawMessage(`{}`), Project: in.ProjectID,
		Description: in.Description, ProviderID: obs.ProviderID})
}

// catalog lists the provider's installable applications.
func (m methods) catalog(ctx context.Context, c *rpc.Call, in CatalogInput) (CatalogAnswer, error) {
	o, err := m.open(ctx, c, in.PoolID, "cloud-resources-catalog", nil)
	if err != nil {
		return CatalogAnswer{}, err
	}
	cat, ok := o.res.(drivers.Catalog)
	if !ok {
		return CatalogAnswer{}, core.Errorf(core.CodeUnsupported, "provider %s has no catalog", o.acct.Provider).
			WithDetails(map[string]any{"reason": "noCatalog"})
	}
	apps, err := cat.Catalog(ctx, in.InstallsOn)
	if err != nil {
		return CatalogAnswer{}, provideraccounts.ProviderError(err)
	}
	if apps == nil {
		apps = []drivers.CatalogApp{}
	}
	return CatalogAnswer{PoolID: o.pool.ID, Apps: apps[:min(len(apps), drivers.MaxCatalog)]}, nil
}

// signalsTTL is how long one answer of a provider account is reused,
// whichever tenant asked.
const signalsTTL = 30 * time.Second

// signalCache keeps each account's last signals answer for signalsTTL.
type signalCache struct {
	ttl time.Duration
	mu  sync.Mutex
	at  map[string]cachedSignals
}

type cachedSignals struct {
	at      time.Time
	signals []drivers.Signal
	err     error
}

func newSignalCache(ttl time.Duration) *signalCache {
	return &signalCache{ttl: ttl, at: map[string]cachedSignals{}}
}

// get answers the account's signals, asking fetch at most once per ttl.
func (s *signalCache) get(accountID string, fetch func() ([]drivers.Signal, error)) ([]drivers.Signal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.at[accountID]; ok && time.Since(c.at) < s.ttl {
		return c.signals, c.err
	}
	sig, err := fetch()
	s.at[accountID] = cachedSignals{at: time.Now(), signals: sig, err: err}
	return sig, err
}

// signalsOf answers the pool's provider signals: a tenant of a shared
// pool sees only those about its own resources, the pool's owner every
// one.
func (m methods) signalsOf(ctx context.Context, c *rpc.Call, in SignalsInput) (SignalsAnswer, error) {
	o, err := m.open(ctx, c, in.PoolID, "cloud-resources-signals", nil)
	if err != nil {
		return SignalsAnswer{}, err
	}
	src, ok := o.res.(drivers.Signals)
	switch {
	case ok && !o.acct.Previews:
		// DigitalOcean's signals are a preview of its API.
		return SignalsAnswer{}, core.Errorf(core.CodeUnsupported, "the provider holds its signals behind previews; the account has none").
			WithDetails(map[string]any{"reason": "preview"})
	case !ok:
		return SignalsAnswer{}, core.Errorf(core.CodeUnsupported, "provider %s raises no signals", o.acct.Provider).
			WithDetails(map[string]any{"reason": "noSignals"})
	}
	all, err := m.signals.get(o.acct.ID, func() ([]drivers.Signal, error) {
		sig, err := src.Signals(ctx)
		return drivers.CleanSignals(sig), err
	})
	if errors.Is(err, drivers.ErrPreview) {
		return SignalsAnswer{}, core.Errorf(core.CodeUnsupported, "the provider holds its signals behind previews; the account has none").
			WithDetails(map[string]any{"reason": "preview"})
	}
	if err != nil {
		return SignalsAnswer{}, provideraccounts.ProviderError(err)
	}
	ids := make([]string, 0, len(all))
	for _, s := range all {
		ids = append(ids, s.ProviderID)
	}
	var recorded map[string]domain.Recorded
	if err := m.d.Store.InTx(ctx, store.ReadOnly, func(tx store.Tx) (err error) {
		recorded, err = domain.RecordedOnAccount(ctx, tx, o.acct.ID, ids)
		return err
	}); err != nil {
		return SignalsAnswer{}, err
	}
	owner := o.acct.TenantID == c.TenantID
	out := SignalsAnswer{PoolID: o.pool.ID, Signals: []Signal{}}
	for _, s := range all {
		r, known := recorded[s.Kind+"\x00"+s.ProviderID]
		if !owner && (!known || r.TenantID != c.TenantID) {
			continue
		}
		sig := Signal{Signal: s}
		if known {
			sig.ResourceID = r.ID
		}
		if in.ResourceID != "" && sig.ResourceID != in.ResourceID {
			continue
		}
		out.Signals = append(out.Signals, sig)
	}
	return out, nil
}

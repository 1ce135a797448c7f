package cloudresources

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	activities "github.com/better-compute/better-compute/activities/cloudresources"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	coresecrets "github.com/better-compute/better-compute/core/secrets"
	drivers "github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/store"
	domain "github.com/better-compute/better-compute/store/cloudresources"
	"github.com/better-compute/better-compute/store/instances"
	"github.com/better-compute/better-compute/store/provideraccounts"
)

// draft checks a create against the pool, the account and the kind's
// manifest, then writes the draft the decision is made on. Every refusal
// here comes before anything is written.
func (m methods) draft(ctx context.Context, c *rpc.Call, tx store.Tx, draftID string, in CreateInput) (store.AuthzResource, error) {
	p, acct, set, err := providerPool(ctx, tx, c.TenantID, in.PoolID)
	if err != nil {
		return store.AuthzResource{}, err
	}
	if p.ArchivedAt != nil {
		return store.AuthzResource{}, core.Errorf(core.CodeInvalidState, "pool %s is archived", p.ID).
			WithDetails(map[string]any{"reason": "archived"})
	}
	man, err := m.servedKind(set, acct, in.Kind)
	if err != nil {
		return store.AuthzResource{}, err
	}
	if len(in.Spec) > drivers.MaxSpecBytes {
		return store.AuthzResource{}, badField("spec", "tooLarge", "spec is %d bytes of JSON; at most %d", len(in.Spec), drivers.MaxSpecBytes)
	}
	if err := m.checkSpec(ctx, tx, c.TenantID, acct, man, in.Spec, nil); err != nil {
		return store.AuthzResource{}, err
	}
	switch {
	case man.Parent != "" && in.ParentID == "":
		return store.AuthzResource{}, badField("parentId", "required", "a %s lives in a %s: name it in parentId", man.Kind, man.Parent)
	case man.Parent == "" && in.ParentID != "":
		return store.AuthzResource{}, badField("parentId", "noParent", "a %s lives in no other resource", man.Kind)
	}
	req := domain.Request{Pool: p, Provider: acct.Provider, Kind: man.Kind, Family: man.Family, Name: in.Name,
		Region: regionOf(in.Spec), Spec: in.Spec, Project: in.ProjectID, Description: in.Description,
		ParentID: in.ParentID, ParentKind: man.Parent, Identity: identityOf(man, in.Spec)}
	if req.Booking, err = bookingOf(man, in.Spec); err != nil {
		return store.AuthzResource{}, err
	}
	return domain.Draft(ctx, tx, m.types(), c.TenantID, draftID, c.Caller.IdentityID, req)
}

// servedKind is the kind's manifest when the account may use it: an
// unknown kind, a preview on an account without previews, or a kind with
// secret outputs on a deployment without a secret store is UNSUPPORTED.
func (m methods) servedKind(set *drivers.KindSet, acct provideraccounts.Account, kind string) (*drivers.Manifest, error) {
	man, ok := set.Lookup(kind)
	switch {
	case !ok:
		return nil, core.Errorf(core.CodeUnsupported, "provider %s serves no kind %s", acct.Provider, kind).
			WithDetails(map[string]any{"reason": "kind", "kind": kind})
	case man.Preview && !acct.Previews:
		return nil, core.Errorf(core.CodeUnsupported, "%s is a provider preview; the account has no previews", kind).
			WithDetails(map[string]any{"reason": "preview", "kind": kind})
	case len(man.SecretOutputs) > 0 && !m.d.Secrets.Configured():
		return nil, core.Errorf(core.CodeUnsupported, "%s has secret outputs and this deployment has no secret store", kind).
			WithDetails(map[string]any{"reason": "noSecretStore", "kind": kind})
	}
	return man, nil
}

// checkSpec validates a (merged) spec: the manifest's schema, a regional
// kind's region among the account's, the account-wide rule on a shared
// account, SecretRefs to the tenant's own secrets, and the instances and
// networks it names (those newly named when before is set).
func (m methods) checkSpec(ctx context.Context, tx store.Tx, tenantID string, acct provideraccounts.Account,
	man *drivers.Manifest, spec, before json.RawMessage) error {
	if err := man.Validate(spec); err != nil {
		return err
	}
	if region := regionOf(spec); man.Regional && len(acct.Regions) > 0 && !slices.Contains(acct.Regions, region) {
		return badField("spec.region", "region", "region %s is not one the account configures (%s)", region, strings.Join(acct.Regions, ", "))
	}
	if acct.TenantID != tenantID {
		if fields := man.AccountWide(spec); len(fields) > 0 {
			return core.Errorf(core.CodeInvalidInput, "on a shared account a spec may not reach account-wide objects: %s", strings.Join(fields, ", ")).
				WithDetails(map[string]any{"reason": "accountWide", "fields": fields})
		}
	}
	for _, ref := range activities.SpecSecretRefs(spec) {
		owner, _, err := coresecrets.ParseRef(ref)
		if err != nil || owner != tenantID {
			return badField("spec", "secretRef", "a secret in a spec is a secret:// reference to a secret of tenant %s", tenantID)
		}
		ok, err := m.d.Secrets.Exists(ctx, tx, tenantID, ref)
		if err != nil {
			return err
		}
		if !ok {
			return badField("spec", "secretRef", "spec names a secret that does not exist")
		}
	}
	named := newlyNamed(man.Instances(spec), man.Instances(before), before != nil)
	if len(named) > 0 {
		live, err := instances.ProviderServers(ctx, tx, tenantID, acct.ID, named)
		if err != nil {
			return err
		}
		var missing []string
		for _, id := range named {
			if _, ok := live[id]; !ok {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return core.Errorf(core.CodeInvalidInput, "spec names instances that are not live instances of the tenant on the pool's account: %s",
				strings.Join(missing, ", ")).WithDetails(map[string]any{"reason": "instance", "instances": missing})
		}
	}
	// No method creates networks yet: every network a spec newly names is
	// one that is not live.
	if nets := newlyNamed(man.Networks(spec), man.Networks(before), before != nil); len(nets) > 0 {
		return core.Errorf(core.CodeInvalidInput, "spec names networks that are not live networks of the tenant on the pool's account: %s",
			strings.Join(nets, ", ")).WithDetails(map[string]any{"reason": "network", "networks": nets})
	}
	return nil
}

// newlyNamed are the ids of now not in before (all of now without one).
func newlyNamed(now, before []string, changed bool) []string {
	if !changed {
		return now
	}
	var out []string
	for _, id := range now {
		if !slices.Contains(before, id) {
			out = append(out, id)
		}
	}
	return out
}

func badField(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

func regionOf(spec json.RawMessage) string {
	var s struct {
		Region string `json:"region"`
	}
	_ = json.Unmarshal(spec, &s)
	return s.Region
}

// identityOf is the spec's identity within its parent (nil: the kind has
// none; "" for one per parent).
func identityOf(man *drivers.Manifest, spec json.RawMessage) *string {
	if man.Identity == nil {
		return nil
	}
	v := ""
	if man.Identity.Field != "" {
		var fields map[string]any
		_ = json.Unmarshal(spec, &fields)
		v, _ = fields[man.Identity.Field].(string)
	}
	return &v
}

func bookingOf(man *drivers.Manifest, spec json.RawMessage) (*domain.Booking, error) {
	if man.Books == nil {
		return nil, nil
	}
	b, err := man.Booking(spec)
	if err != nil {
		return nil, badField("spec", "booking", "%v", err)
	}
	return &domain.Booking{Quota: b.Quota, Amount: b.Amount}, nil
}

// complete admits a decided create or adopt (store/cloudresources.Complete).
func (m methods) complete(ctx context.Context, c *rpc.Call, tx store.Tx) (Resource, error) {
	return domain.Complete(ctx, tx, c.TenantID, c.Resource.ID, domain.Limits{Quotas: m.d.CloudResources.Quotas})
}

// update merges the spec onto the stored one and checks the result as
// create does; a change outside the kind's updatable fields is
// INVALID_STATE reason replaceRequired with the fields.
func (m methods) update(ctx context.Context, c *rpc.Call, tx store.Tx, in UpdateInput) (Resource, error) {
	if in.Description == nil && nullDescription(c.Input) {
		in.Description = new(string) // null clears it
	}
	return domain.Update(ctx, tx, c.TenantID, in.ResourceID, in.Spec != nil, func(r Resource) (domain.Change, error) {
		ch := domain.Change{Description: in.Description}
		if in.Spec == nil {
			return ch, nil
		}
		_, acct, set, err := providerPool(ctx, tx, c.TenantID, r.PoolID)
		if err != nil {
			return ch, err
		}
		man, ok := set.Lookup(r.Kind)
		if !ok {
			return ch, core.Errorf(core.CodeUnsupported, "provider %s no longer serves kind %s", acct.Provider, r.Kind)
		}
		merged, err := mergeSpec(r.Spec, in.Spec)
		if err != nil {
			return ch, err
		}
		if len(merged) > drivers.MaxSpecBytes {
			return ch, badField("spec", "tooLarge", "the merged spec is %d bytes of JSON; at most %d", len(merged), drivers.MaxSpecBytes)
		}
		if err := m.checkSpec(ctx, tx, c.TenantID, acct, man, merged, r.Spec); err != nil {
			return ch, err
		}
		if fields := man.ReplaceRequired(r.Spec, merged); len(fields) > 0 {
			return ch, core.Errorf(core.CodeInvalidState, "%s cannot change in place: create a new resource instead", strings.Join(fields, ", ")).
				WithDetails(map[string]any{"reason": "replaceRequired", "fields": fields})
		}
		ch.Spec = merged
		ch.Booking, err = bookingOf(man, merged)
		return ch, err
	})
}

// nullDescription says whether the input names description as null.
func nullDescription(input json.RawMessage) bool {
	var fields map[string]json.RawMessage
	if json.Unmarshal(input, &fields) != nil {
		return false
	}
	v, ok := fields["description"]
	return ok && string(v) == "null"
}

// mergeSpec merges patch onto spec as a JSON merge patch (RFC 7386): an
// object member replaces, a null removes, objects merge recursively.
func mergeSpec(spec, patch json.RawMessage) (json.RawMessage, error) {
	var base, p map[string]any
	if err := json.Unmarshal(spec, &base); err != nil || base == nil {
		base = map[string]any{}
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, badField("spec", "type", "spec must be a JSON object")
	}
	return json.Marshal(mergeObject(base, p))
}

func mergeObject(base, patch map[string]any) map[string]any {
	for k, v := range patch {
		if v == nil {
			delete(base, k)
			continue
		}
		if po, ok := v.(map[string]any); ok {
			if bo, ok := base[k].(map[string]any); ok {
				base[k] = mergeObject(bo, po)
				continue
			}
		}
		base[k] = v
	}
	return base
}

// release checks the kind is releasable, then marks the release.
func (m methods) release(ctx context.Context, c *rpc.Call, tx store.Tx, in ResourceInput) (Resource, error) {
	r, err := domain.Load(ctx, tx, c.TenantID, in.ResourceID, false)
	if err != nil {
		return Resource{}, err
	}
	releasable := true
	if set := activities.KindsOf(r.Provider); set != nil {
		if man, ok := set.Lookup(r.Kind); ok {
			releasable = man.Releasable
		}
	}
	return domain.Release(ctx, tx, c.TenantID, in.ResourceID, releasable)
}

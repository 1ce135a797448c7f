// Package cloudresources is the provider-neutral seam to a provider's
// managed data and platform services (managed databases and what lives in
// them, apps, functions, inference endpoints): the kind manifests that
// describe what each kind takes and reports, and the ProviderResources
// interface the cloud.resources reconciler calls. DigitalOcean's kinds
// live in drivers/cloudresources/digitalocean; AWS and GCP kinds fit the
// same interface under their own prefixes.
//
// Calls fail with the errors of drivers/providers (ErrNotFound,
// ErrUnavailable, ErrNotSent, ErrRefused, *RateLimited), so the
// reconciler reads one vocabulary for machines and resources. Providers
// are called only from activities, never inside a database transaction.
package cloudresources

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/better-compute/better-compute/drivers/providers"
)

// ProviderResources is one provider account's view of its cloud resources.
type ProviderResources interface {
	// Kinds are the kinds this provider serves.
	Kinds() *KindSet
	// Observe reads one resource. With a ProviderID it reads that one
	// (ErrNotFound when it does not exist). Without one it finds the
	// resource a create may have made whose answer was lost: the one of
	// Name (inside ParentProviderID for a kind with a parent) carrying
	// Owner's ownership labels; ErrNotFound when there is none, ErrRefused
	// when the name is held by a resource without them (never ours to take).
	Observe(ctx context.Context, req ObserveRequest) (Observed, error)
	// Create asks the provider for a resource. Its outcome may be unknown
	// (ErrUnavailable without ErrNotSent): the caller observes by name and
	// owner before any second create.
	Create(ctx context.Context, req CreateRequest) (Observed, error)
	// Update applies a change of the kind's updatable spec fields in place.
	Update(ctx context.Context, req UpdateRequest) (Observed, error)
	// Delete deletes one resource; one already gone is not an error.
	Delete(ctx context.Context, ref Ref) error
	// List is discover: the kind's resources on the account, at most limit
	// (MaxList when limit is not positive), each with the spec the provider
	// reports and its Labels (ManagedBy reads them). A kind with a parent
	// is ErrNotListable.
	List(ctx context.Context, kind string, limit int) ([]Observed, error)
	// Label is adopt's takeover: it writes owner's ownership labels on the
	// resource and answers it as the provider then reports it. One that
	// carries another resource's labels is ErrManagedByAnother; a kind the
	// provider owns by its name is ErrOwnedByName. A child kind carries no
	// labels of its own (its parent's are its ownership): Label checks the
	// parent and answers the child.
	Label(ctx context.Context, ref Ref, owner Owner) (Observed, error)
	// Unlabel is release: it removes owner's ownership labels and leaves
	// the resource running. It is idempotent; a resource already gone is
	// not an error; a kind owned by its name is ErrOwnedByName.
	Unlabel(ctx context.Context, ref Ref, owner Owner) error
}

// Ref names a resource at the provider.
type Ref struct {
	Kind string
	// ParentProviderID is the parent's provider id for a kind with a parent
	// (a database user lives in its cluster), empty otherwise.
	ParentProviderID string
	ProviderID       string
}

// ObserveRequest is what Observe looks for: Ref.ProviderID, or when that
// is empty, Name and Owner.
type ObserveRequest struct {
	Ref
	Name  string
	Owner Owner
}

// CreateRequest is a resource to create.
type CreateRequest struct {
	Kind             string
	ParentProviderID string
	// Name is the provider-side name (Manifest.ProviderName).
	Name  string
	Owner Owner
	// Spec is valid for the kind's manifest; its SecretRefs are not
	// resolved: their values are in Secrets.
	Spec    json.RawMessage
	Secrets SecretValues
}

// UpdateRequest is an in-place change: New differs from Old only in the
// kind's updatable fields (Manifest.ReplaceRequired is empty).
type UpdateRequest struct {
	Ref
	Owner   Owner
	Old     json.RawMessage
	New     json.RawMessage
	Secrets SecretValues
}

// Observed is a resource as the provider reports it.
type Observed struct {
	Ref
	Name   string
	Region string
	// Status is the provider's own word for the resource's state; Ready
	// says whether it serves.
	Status string
	Ready  bool
	// Spec is the resource in the terms of the kind's spec, as the
	// provider reports it (what discover and adopt record).
	Spec json.RawMessage
	// Labels are the ownership labels or tags it carries.
	Labels []string
	// Outputs are the kind's plain outputs.
	Outputs map[string]string
	// Secrets are the kind's secret outputs the provider answered with
	// (DigitalOcean returns a password once): they are sealed in the run
	// that received them and never written anywhere else.
	Secrets SecretValues
	// CreatedAt is epoch ms.
	CreatedAt int64
}

// SecretValues maps a secret output (or a resolved SecretRef of a spec) to
// its value. It prints and marshals without its values, so a log line or
// an event that takes it by mistake carries only its names.
type SecretValues map[string]string

// String names the keys only.
func (s SecretValues) String() string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return fmt.Sprintf("SecretValues%v", keys)
}

// GoString is String, for %#v.
func (s SecretValues) GoString() string { return s.String() }

// MarshalJSON writes the keys with redacted values.
func (s SecretValues) MarshalJSON() ([]byte, error) {
	out := make(map[string]string, len(s))
	for k := range s {
		out[k] = "[redacted]"
	}
	return json.Marshal(out)
}

// Ownership labels of a managed resource, written as DigitalOcean tags
// (better-compute-managed, better-compute-resource:<id>,
// better-compute-tenant:<tenant>) where the provider has no labels.
const (
	LabelManaged  = providers.ManagedTag
	LabelResource = "better-compute-resource"
	LabelTenant   = "better-compute-tenant"
)

// resourceNamePrefix starts every deterministic resource name.
const resourceNamePrefix = "bc-r-"

// ResourceName is the deterministic provider-side name of a resource:
// "bc-r-" and the first 24 characters of its id's body.
func ResourceName(resourceID string) string {
	return resourceNamePrefix + providers.NameBody(resourceID)
}

// Owner is who a managed resource belongs to.
type Owner struct {
	ResourceID string
	TenantID   string
}

// Labels are the owner's ownership labels as key and value.
func (o Owner) Labels() map[string]string {
	return map[string]string{
		LabelManaged:  "true",
		LabelResource: o.ResourceID,
		LabelTenant:   o.TenantID,
	}
}

// Tags are the owner's ownership labels as tags.
func (o Owner) Tags() []string {
	return []string{
		LabelManaged,
		LabelResource + ":" + providers.TagValue(o.ResourceID),
		providers.TenantTag(o.TenantID),
	}
}

// Owns says whether tags carry all of the owner's ownership tags.
func (o Owner) Owns(tags []string) bool {
	for _, t := range o.Tags() {
		if !slices.Contains(tags, t) {
			return false
		}
	}
	return true
}

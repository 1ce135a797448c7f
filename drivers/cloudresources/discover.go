package cloudresources

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/drivers/providers"
)

// Bounds of the read-only listings.
const (
	MaxList    = 500
	MaxCatalog = 1000
	MaxSignals = 500
	// MaxSignalDetail bounds a signal's detail, in bytes.
	MaxSignalDetail = 500
)

// The refusals the reconciler and the API tell apart. Each wraps
// providers.ErrRefused, so a caller that knows only that vocabulary still
// reads a refusal.
var (
	// ErrManagedByAnother: the resource carries the ownership labels of
	// another resource (another deployment, or another resource of this
	// one): adopt is INVALID_STATE managedByAnother.
	ErrManagedByAnother = fmt.Errorf("cloudresources: managed by another: %w", providers.ErrRefused)
	// ErrOwnedByName: the kind carries no labels at the provider, it is
	// owned by its deterministic name (a Functions namespace): release is
	// UNSUPPORTED.
	ErrOwnedByName = fmt.Errorf("cloudresources: the kind is owned by its name, not by labels: %w", providers.ErrRefused)
	// ErrNotListable: discover lists top-level kinds only.
	ErrNotListable = fmt.Errorf("cloudresources: only a kind without a parent is listed: %w", providers.ErrRefused)
	// ErrPreview: the provider serves this only to an account with
	// previews enabled: UNSUPPORTED reason preview.
	ErrPreview = fmt.Errorf("cloudresources: the account has no previews: %w", providers.ErrRefused)
)

// ManagedBy reads the ownership labels back: whether labels carry
// better-compute-managed, and the resource id of better-compute-resource
// ("" when managed without one). Whether that id is this deployment's is
// the store's question (is it recorded?).
func ManagedBy(labels []string) (resourceID string, managed bool) {
	managed = slices.Contains(labels, LabelManaged)
	for _, l := range labels {
		if v, ok := strings.CutPrefix(l, LabelResource+":"); ok && v != "" {
			return v, managed
		}
	}
	return "", managed
}

// CheckTakeover answers ErrManagedByAnother when labels carry the
// ownership of a resource other than owner's: managed without owner's
// resource label, or with any other resource label (two deployments that
// labelled it at once).
func CheckTakeover(labels []string, owner Owner) error {
	mine := providers.TagValue(owner.ResourceID)
	id, managed := ManagedBy(labels)
	if managed && id == "" {
		return fmt.Errorf("cloudresources: it is managed without a resource label: %w", ErrManagedByAnother)
	}
	for _, l := range labels {
		if v, ok := strings.CutPrefix(l, LabelResource+":"); ok && managed && v != mine {
			return fmt.Errorf("cloudresources: it carries the labels of resource %q: %w", v, ErrManagedByAnother)
		}
	}
	return nil
}

// Installs-on values of a catalog application.
const (
	InstallsOnInstance   = "instance"
	InstallsOnKubernetes = "kubernetes"
)

// CatalogApp is one installable application of the provider's catalog.
type CatalogApp struct {
	// Slug is what an install names: for InstallsOnInstance, the image of
	// an instance create.
	Slug string `json:"slug"`
	// Name is the provider's display name (the slug where it lists none).
	Name        string `json:"name"`
	InstallsOn  string `json:"installsOn"`
	Description string `json:"description,omitempty"`
}

// Catalog is the optional interface of a provider with an application
// catalog (DigitalOcean's 1-Click apps).
type Catalog interface {
	// Catalog answers at most MaxCatalog applications; installsOn ""
	// answers every one, else only those of InstallsOnInstance or
	// InstallsOnKubernetes (another value is refused).
	Catalog(ctx context.Context, installsOn string) ([]CatalogApp, error)
}

// Signal severities.
const (
	SeverityCritical = "critical"
	SeverityWarning  = "warning"
	SeverityInfo     = "info"
)

// Signal is a read-only signal the provider raises about a resource.
type Signal struct {
	ID       string `json:"id"`
	Severity string `json:"severity"`
	// Title is one line; Detail one line of at most MaxSignalDetail bytes.
	Title  string `json:"title"`
	Detail string `json:"detail,omitempty"`
	// At is epoch ms.
	At int64 `json:"at"`
	// Kind and ProviderID name the resource it is about.
	Kind       string `json:"kind"`
	ProviderID string `json:"providerId"`
}

// Signals is the optional interface of a provider that raises signals.
type Signals interface {
	// Signals answers at most MaxSignals, newest first, the malformed
	// dropped (CleanSignals). A provider holding them behind previews on
	// an account without is ErrPreview.
	Signals(ctx context.Context) ([]Signal, error)
}

// CleanSignals drops the malformed signals (no id, kind or provider id, a
// severity not of the three, an empty or multi-line title, a multi-line
// detail or one over MaxSignalDetail, no time) and answers the rest newest
// first (by id among equals), at most MaxSignals.
func CleanSignals(in []Signal) []Signal {
	out := make([]Signal, 0, len(in))
	for _, s := range in {
		if signalProblem(s) == nil {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b Signal) int {
		if a.At != b.At {
			if a.At > b.At {
				return -1
			}
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
	if len(out) > MaxSignals {
		out = out[:MaxSignals]
	}
	return out
}

func signalProblem(s Signal) error {
	switch {
	case s.ID == "" || s.Kind == "" || s.ProviderID == "":
		return errors.New("no id, kind or provider id")
	case !slices.Contains([]string{SeverityCritical, SeverityWarning, SeverityInfo}, s.Severity):
		return errors.New("unknown severity")
	case strings.TrimSpace(s.Title) == "" || multiLine(s.Title):
		return errors.New("empty or multi-line title")
	case len(s.Detail) > MaxSignalDetail || multiLine(s.Detail):
		return errors.New("detail too long or multi-line")
	case s.At <= 0:
		return errors.New("no time")
	}
	return nil
}

func multiLine(s string) bool { return strings.ContainsAny(s, "\r\n\u2028\u2029") }

// InstanceResolver is the optional interface of a provider whose specs may
// name the tenant's instances (a database firewall's trusted instances):
// it rewrites a spec in the provider's own terms, given each instance's
// provider server id (a droplet rule each), before a create or an update.
type InstanceResolver interface {
	ResolveInstances(kind string, spec json.RawMessage, servers map[string]string) (json.RawMessage, error)
}

// SecretRotator is the optional interface of a provider that can issue a
// resource's secret outputs again (a database user's new password): the
// reconciler's way back when the answer that carried them was lost.
type SecretRotator interface {
	// RotateSecrets answers new secret outputs of the resource, or
	// ErrRefused for a kind whose secrets cannot be issued again.
	RotateSecrets(ctx context.Context, ref Ref) (SecretValues, error)
}

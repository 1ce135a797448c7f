package digitalocean

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/digitalocean/godo"

	"github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/drivers/providers"
	doprovider "github.com/better-compute/better-compute/drivers/providers/digitalocean"
)

var (
	_ cloudresources.Catalog = (*Resources)(nil)
	_ cloudresources.Signals = (*Resources)(nil)
)

// List implements cloudresources.ProviderResources: discover. A cluster
// is listed with its tags; an app with its ownership envs as labels; a
// namespace and an endpoint carry none (owned by name). An endpoint's spec
// needs a read of its own (the listing has no model), one per endpoint.
func (r *Resources) List(ctx context.Context, kind string, limit int) ([]cloudresources.Observed, error) {
	if limit <= 0 || limit > cloudresources.MaxList {
		limit = cloudresources.MaxList
	}
	m, ok := Kinds().Lookup(kind)
	if !ok {
		return nil, unsupported(kind)
	}
	if m.Parent != "" {
		return nil, fmt.Errorf("digitalocean: %s lives in a %s: %w", kind, m.Parent, cloudresources.ErrNotListable)
	}
	var out []cloudresources.Observed
	switch kind {
	case KindCluster:
		for page := 1; page <= maxPages; page++ {
			dbs, resp, err := r.client.Databases.List(ctx, &godo.ListOptions{Page: page, PerPage: perPage})
			if err != nil {
				return nil, doprovider.MapError("listing database clusters", err)
			}
			for i := range dbs {
				if dbs[i].EngineSlug == "pg" && len(out) < limit {
					o := clusterObserved(&dbs[i])
					o.Secrets = nil
					out = append(out, o)
				}
			}
			if len(out) >= limit || lastPage(resp, len(dbs)) {
				return out, nil
			}
		}
		return nil, tooManyPages("database clusters")
	case KindApp:
		apps, err := r.listApps(ctx, limit)
		if err != nil {
			return nil, err
		}
		for _, a := range apps {
			out = append(out, appObserved(a))
		}
	case KindNamespace:
		list, _, err := r.client.Functions.ListNamespaces(ctx)
		if err != nil {
			return nil, doprovider.MapError("listing functions namespaces", err)
		}
		for i := range list[:min(len(list), limit)] {
			out = append(out, namespaceObserved(&list[i]))
		}
	case KindInference:
		items, err := r.listInferences(ctx, "", limit)
		if err != nil {
			return nil, err
		}
		for _, it := range items {
			in, err := r.getInference(ctx, it.ID)
			if errors.Is(err, providers.ErrNotFound) {
				continue // deleted since the listing
			}
			if err != nil {
				return nil, err
			}
			out = append(out, inferenceObserved(in))
		}
	default:
		return nil, unsupported(kind)
	}
	return nonNilObserved(out), nil
}

func nonNilObserved(s []cloudresources.Observed) []cloudresources.Observed {
	if s == nil {
		return []cloudresources.Observed{}
	}
	return s
}

// Label implements cloudresources.ProviderResources: adopt's takeover. A
// cluster is tagged through /v2/tags/{tag}/resources; an app's spec gets
// the ownership envs (a new deployment); a child answers itself once its
// cluster is not another's.
func (r *Resources) Label(ctx context.Context, ref cloudresources.Ref, owner cloudresources.Owner) (cloudresources.Observed, error) {
	if ref.ProviderID == "" {
		return cloudresources.Observed{}, refused("labelling %s without a provider id", ref.Kind)
	}
	switch ref.Kind {
	case KindCluster:
		o, err := r.getCluster(ctx, ref.ProviderID)
		if err != nil {
			return cloudresources.Observed{}, err
		}
		if err := cloudresources.CheckTakeover(o.Labels, owner); err != nil {
			return cloudresources.Observed{}, fmt.Errorf("digitalocean: database cluster %s: %w", ref.ProviderID, err)
		}
		for _, tag := range owner.Tags() {
			if slices.Contains(o.Labels, tag) {
				continue
			}
			if err := r.tagCluster(ctx, tag, ref.ProviderID, true); err != nil {
				return cloudresources.Observed{}, err
			}
		}
		o, err = r.getCluster(ctx, ref.ProviderID)
		if err != nil {
			return cloudresources.Observed{}, err
		}
		// Another deployment may have tagged it between the read and ours.
		if err := cloudresources.CheckTakeover(o.Labels, owner); err != nil {
			return cloudresources.Observed{}, fmt.Errorf("digitalocean: database cluster %s: %w", ref.ProviderID, err)
		}
		o.Secrets = nil
		return o, nil
	case KindApp:
		a, err := r.getApp(ctx, ref.ProviderID)
		if err != nil {
			return cloudresources.Observed{}, err
		}
		labels := appLabels(a.Spec)
		if err := cloudresources.CheckTakeover(labels, owner); err != nil {
			return cloudresources.Observed{}, fmt.Errorf("digitalocean: app %s: %w", ref.ProviderID, err)
		}
		if owner.Owns(labels) {
			return appObserved(a), nil
		}
		a, err = r.relabelApp(ctx, a, &owner)
		if err != nil {
			return cloudresources.Observed{}, err
		}
		return appObserved(a), nil
	case KindNamespace, KindInference:
		return cloudresources.Observed{}, fmt.Errorf("digitalocean: %s: %w", ref.Kind, cloudresources.ErrOwnedByName)
	case KindUser, KindDatabase, KindPool, KindFirewall, KindReplica:
		parent, err := r.getCluster(ctx, ref.ParentProviderID)
		if err != nil {
			return cloudresources.Observed{}, err
		}
		if err := cloudresources.CheckTakeover(parent.Labels, owner); err != nil {
			return cloudresources.Observed{}, fmt.Errorf("digitalocean: the cluster of %s %s: %w", ref.Kind, ref.ProviderID, err)
		}
		if ref.Kind == KindFirewall {
			return r.getFirewall(ctx, ref.ParentProviderID)
		}
		return r.getChild(ctx, ref.Kind, ref.ParentProviderID, ref.ProviderID)
	}
	return cloudresources.Observed{}, unsupported(ref.Kind)
}

// Unlabel implements cloudresources.ProviderResources: release. Only
// owner's own labels go, and none from a resource another took meanwhile.
func (r *Resources) Unlabel(ctx context.Context, ref cloudresources.Ref, owner cloudresources.Owner) error {
	if ref.ProviderID == "" {
		return refused("unlabelling %s without a provider id", ref.Kind)
	}
	switch ref.Kind {
	case KindCluster:
		o, err := r.getCluster(ctx, ref.ProviderID)
		if errors.Is(err, providers.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if cloudresources.CheckTakeover(o.Labels, owner) != nil {
			return nil // not ours any more: nothing of ours to remove
		}
		for _, tag := range owner.Tags() {
			if !slices.Contains(o.Labels, tag) {
				continue
			}
			if err := r.tagCluster(ctx, tag, ref.ProviderID, false); err != nil && !errors.Is(err, providers.ErrNotFound) {
				return err
			}
		}
		return nil
	case KindApp:
		a, err := r.getApp(ctx, ref.ProviderID)
		if errors.Is(err, providers.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		labels := appLabels(a.Spec)
		if len(labels) == 0 || cloudresources.CheckTakeover(labels, owner) != nil {
			return nil
		}
		_, err = r.relabelApp(ctx, a, nil)
		return err
	case KindNamespace, KindInference:
		return fmt.Errorf("digitalocean: %s: %w", ref.Kind, cloudresources.ErrOwnedByName)
	case KindUser, KindDatabase, KindPool, KindFirewall, KindReplica:
		return nil // its ownership is its cluster's
	}
	return unsupported(ref.Kind)
}

// tagCluster tags (or untags) a cluster; tagging creates the tag first
// (DigitalOcean answers an existing one again).
func (r *Resources) tagCluster(ctx context.Context, tag, id string, add bool) error {
	res := []godo.Resource{{ID: id, Type: godo.DatabaseResourceType}}
	if !add {
		_, err := r.client.Tags.UntagResources(ctx, tag, &godo.UntagResourcesRequest{Resources: res})
		return mapErr("untagging database cluster "+id, err)
	}
	if _, _, err := r.client.Tags.Create(ctx, &godo.TagCreateRequest{Name: tag}); err != nil {
		return doprovider.MapError("creating tag "+tag, err)
	}
	_, err := r.client.Tags.TagResources(ctx, tag, &godo.TagResourcesRequest{Resources: res})
	return mapErr("tagging database cluster "+id, err)
}

func mapErr(what string, err error) error {
	if err == nil {
		return nil
	}
	return doprovider.MapError(what, err)
}

// Catalog implements cloudresources.Catalog over GET /v2/1-clicks: type
// droplet installs on an instance (its slug is the image of a create),
// kubernetes on a cluster. DigitalOcean lists a slug and a type only, so
// Name is the slug.
func (r *Resources) Catalog(ctx context.Context, installsOn string) ([]cloudresources.CatalogApp, error) {
	types := map[string]string{"droplet": cloudresources.InstallsOnInstance, "kubernetes": cloudresources.InstallsOnKubernetes}
	var ask []string
	switch installsOn {
	case "":
		ask = []string{"droplet", "kubernetes"}
	case cloudresources.InstallsOnInstance:
		ask = []string{"droplet"}
	case cloudresources.InstallsOnKubernetes:
		ask = []string{"kubernetes"}
	default:
		return nil, refused("installsOn %q is not instance or kubernetes", installsOn)
	}
	out := []cloudresources.CatalogApp{}
	for _, typ := range ask {
		list, _, err := r.client.OneClick.List(ctx, typ)
		if err != nil {
			return nil, doprovider.MapError("listing 1-click apps", err)
		}
		for _, oc := range list {
			if oc == nil || oc.Slug == "" || types[oc.Type] != types[typ] {
				continue
			}
			if len(out) == cloudresources.MaxCatalog {
				return out, nil
			}
			out = append(out, cloudresources.CatalogApp{Slug: oc.Slug, Name: oc.Slug, InstallsOn: types[typ]})
		}
	}
	return out, nil
}

// signalsPath is our fake's design of DigitalOcean's preview signals API
// (docs/fake-digitalocean.md); maxSignalPages bounds the read.
const (
	signalsPath    = "v2/gen-ai/signals"
	maxSignalPages = 25
)

// signalKinds maps a signal's resource type to its kind.
var signalKinds = map[string]string{
	"database": KindCluster, "app": KindApp, "functions_namespace": KindNamespace, "dedicated_inference": KindInference,
}

type wireSignal struct {
	ID        string `json:"id"`
	Severity  string `json:"severity"`
	Title     string `json:"title"`
	Detail    string `json:"detail"`
	CreatedAt string `json:"created_at"`
	Resource  struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	} `json:"resource"`
}

// Signals implements cloudresources.Signals, through godo's client (its
// limiter and token). A 403 is an account without previews.
func (r *Resources) Signals(ctx context.Context) ([]cloudresources.Signal, error) {
	var all []cloudresources.Signal
	for page := 1; page <= maxSignalPages; page++ {
		req, err := r.client.NewRequest(ctx, http.MethodGet, fmt.Sprintf("%s?page=%d&per_page=%d", signalsPath, page, perPage), nil)
		if err != nil {
			return nil, fmt.Errorf("digitalocean: signals: %w", err)
		}
		var root struct {
			Signals []json.RawMessage `json:"signals"`
			Links   *godo.Links       `json:"links"`
		}
		if _, err := r.client.Do(ctx, req, &root); err != nil {
			var er *godo.ErrorResponse
			if errors.As(err, &er) && er.Response != nil && er.Response.StatusCode == http.StatusForbidden {
				return nil, fmt.Errorf("digitalocean: signals: %s: %w", er.Message, cloudresources.ErrPreview)
			}
			return nil, doprovider.MapError("listing signals", err)
		}
		for _, raw := range root.Signals {
			// One malformed signal must not hide the others.
			var w wireSignal
			if json.Unmarshal(raw, &w) != nil {
				continue
			}
			at, err := time.Parse(time.RFC3339, w.CreatedAt)
			if err != nil {
				continue
			}
			all = append(all, cloudresources.Signal{
				ID: w.ID, Severity: w.Severity, Title: w.Title, Detail: w.Detail, At: at.UnixMilli(),
				Kind: signalKinds[w.Resource.Type], ProviderID: w.Resource.ID,
			})
		}
		if root.Links == nil || root.Links.IsLastPage() || len(root.Signals) == 0 {
			break
		}
	}
	return cloudresources.CleanSignals(all), nil
}

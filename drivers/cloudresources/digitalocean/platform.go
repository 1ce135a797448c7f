package digitalocean

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/digitalocean/godo"

	"github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/drivers/providers"
	doprovider "github.com/better-compute/better-compute/drivers/providers/digitalocean"
)

// An app has no tags at DigitalOcean: its ownership labels are app-level
// environment variables of its spec (run time, general), which every
// component sees and which survive DigitalOcean's own edits of the spec.
// Observed.Labels writes them as the tags other kinds carry, and
// Observed.Spec leaves them out.
const (
	envManaged  = "BETTER_COMPUTE_MANAGED"
	envResource = "BETTER_COMPUTE_RESOURCE"
	envTenant   = "BETTER_COMPUTE_TENANT"
)

func isOwnershipEnv(key string) bool {
	return key == envManaged || key == envResource || key == envTenant
}

func ownershipEnvs(owner cloudresources.Owner) []*godo.AppVariableDefinition {
	env := func(k, v string) *godo.AppVariableDefinition {
		return &godo.AppVariableDefinition{Key: k, Value: v, Scope: godo.AppVariableScope_RunTime, Type: godo.AppVariableType_General}
	}
	return []*godo.AppVariableDefinition{env(envManaged, "true"), env(envResource, owner.ResourceID), env(envTenant, owner.TenantID)}
}

// appLabels reads the ownership envs back as tags.
func appLabels(spec *godo.AppSpec) []string {
	labels := []string{}
	if spec == nil {
		return labels
	}
	for _, e := range spec.Envs {
		switch {
		case e == nil:
		case e.Key == envManaged && e.Value == "true":
			labels = append(labels, cloudresources.LabelManaged)
		case e.Key == envResource && e.Value != "":
			labels = append(labels, cloudresources.LabelResource+":"+providers.TagValue(e.Value))
		case e.Key == envTenant && e.Value != "":
			labels = append(labels, providers.TenantTag(e.Value))
		}
	}
	return labels
}

// withOwnership answers spec's envs without any ownership env, plus
// owner's when owner is set.
func withOwnership(envs []*godo.AppVariableDefinition, owner *cloudresources.Owner) []*godo.AppVariableDefinition {
	out := slices.DeleteFunc(slices.Clone(envs), func(e *godo.AppVariableDefinition) bool { return e == nil || isOwnershipEnv(e.Key) })
	if owner != nil {
		out = append(out, ownershipEnvs(*owner)...)
	}
	return out
}

// appSpec decodes a do.app spec (DigitalOcean's field names) into godo's,
// named name, with its SecretRefs resolved from secrets and owner's
// ownership envs.
func appSpec(raw json.RawMessage, name string, owner cloudresources.Owner, secrets cloudresources.SecretValues) (*godo.AppSpec, error) {
	var spec godo.AppSpec
	if err := decodeSpec(raw, &spec); err != nil {
		return nil, err
	}
	spec.Name = name
	resolve := func(envs []*godo.AppVariableDefinition) error {
		for _, e := range envs {
			if e == nil || e.Type != godo.AppVariableType_Secret {
				continue
			}
			v, ok := secrets[e.Value]
			if !ok {
				return refused("env %s: its SecretRef is not resolved", e.Key)
			}
			e.Value = v
		}
		return nil
	}
	lists := [][]*godo.AppVariableDefinition{spec.Envs}
	for _, s := range spec.Services {
		lists = append(lists, s.Envs)
	}
	for _, w := range spec.Workers {
		lists = append(lists, w.Envs)
	}
	for _, j := range spec.Jobs {
		lists = append(lists, j.Envs)
	}
	for _, s := range spec.StaticSites {
		lists = append(lists, s.Envs)
	}
	for _, l := range lists {
		if err := resolve(l); err != nil {
			return nil, err
		}
	}
	spec.Envs = withOwnership(spec.Envs, &owner)
	return &spec, nil
}

// appObservedSpec is the spec in the kind's terms: without the ownership
// envs, and without the value of any secret env (DigitalOcean answers it
// encrypted, the fake as sent: neither is ever recorded).
func appObservedSpec(spec *godo.AppSpec) json.RawMessage {
	if spec == nil {
		return json.RawMessage(`{}`)
	}
	raw := mustJSON(spec)
	var copySpec godo.AppSpec
	_ = json.Unmarshal(raw, &copySpec)
	copySpec.Envs = withOwnership(copySpec.Envs, nil)
	if len(copySpec.Envs) == 0 {
		copySpec.Envs = nil
	}
	hide := func(envs []*godo.AppVariableDefinition) {
		for _, e := range envs {
			if e != nil && e.Type == godo.AppVariableType_Secret {
				e.Value = ""
			}
		}
	}
	hide(copySpec.Envs)
	for _, s := range copySpec.Services {
		hide(s.Envs)
	}
	for _, w := range copySpec.Workers {
		hide(w.Envs)
	}
	for _, j := range copySpec.Jobs {
		hide(j.Envs)
	}
	for _, s := range copySpec.StaticSites {
		hide(s.Envs)
	}
	return mustJSON(&copySpec)
}

func appObserved(a *godo.App) cloudresources.Observed {
	o := cloudresources.Observed{
		Ref:    cloudresources.Ref{Kind: KindApp, ProviderID: a.ID},
		Spec:   appObservedSpec(a.Spec),
		Labels: appLabels(a.Spec),
		Outputs: map[string]string{
			"defaultIngress": a.DefaultIngress, "liveUrl": a.LiveURL, "liveDomain": a.LiveDomain,
		},
		CreatedAt: epochMillis(a.CreatedAt.UnixMilli()),
	}
	if a.Spec != nil {
		o.Name, o.Region = a.Spec.Name, a.Spec.Region
	}
	if a.Region != nil && a.Region.Slug != "" {
		o.Region = a.Region.Slug
	}
	switch {
	case a.InProgressDeployment != nil:
		o.Status = "deploying"
	case a.ActiveDeployment != nil:
		o.Status = "active"
	default:
		o.Status = "pending"
	}
	if d := a.ActiveDeployment; d != nil {
		o.Outputs["activeDeploymentId"] = d.ID
		o.Ready = d.Phase == godo.DeploymentPhase_Active
	}
	return o
}

func (r *Resources) createApp(ctx context.Context, req cloudresources.CreateRequest) (cloudresources.Observed, error) {
	spec, err := appSpec(req.Spec, req.Name, req.Owner, req.Secrets)
	if err != nil {
		return cloudresources.Observed{}, err
	}
	a, _, err := r.client.Apps.Create(ctx, &godo.AppCreateRequest{Spec: spec})
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("creating app "+req.Name, err)
	}
	return appObserved(a), nil
}

func (r *Resources) getApp(ctx context.Context, id string) (*godo.App, error) {
	a, _, err := r.client.Apps.Get(ctx, id)
	if err != nil {
		return nil, doprovider.MapError("reading app "+id, err)
	}
	return a, nil
}

// updateApp deploys the new spec, under the app's current name.
func (r *Resources) updateApp(ctx context.Context, req cloudresources.UpdateRequest) (cloudresources.Observed, error) {
	cur, err := r.getApp(ctx, req.ProviderID)
	if err != nil {
		return cloudresources.Observed{}, err
	}
	spec, err := appSpec(req.New, cur.Spec.GetName(), req.Owner, req.Secrets)
	if err != nil {
		return cloudresources.Observed{}, err
	}
	a, _, err := r.client.Apps.Update(ctx, req.ProviderID, &godo.AppUpdateRequest{Spec: spec})
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("updating app "+req.ProviderID, err)
	}
	return appObserved(a), nil
}

// relabelApp writes the app's spec back with owner's ownership envs (nil:
// none), which deploys it again.
func (r *Resources) relabelApp(ctx context.Context, a *godo.App, owner *cloudresources.Owner) (*godo.App, error) {
	if a.Spec == nil {
		return nil, refused("app %s answered no spec", a.ID)
	}
	spec := *a.Spec
	spec.Envs = withOwnership(spec.Envs, owner)
	updated, _, err := r.client.Apps.Update(ctx, a.ID, &godo.AppUpdateRequest{Spec: &spec})
	if err != nil {
		return nil, doprovider.MapError("labelling app "+a.ID, err)
	}
	return updated, nil
}

func (r *Resources) listApps(ctx context.Context, limit int) ([]*godo.App, error) {
	var out []*godo.App
	for page := 1; page <= maxPages; page++ {
		apps, resp, err := r.client.Apps.List(ctx, &godo.ListOptions{Page: page, PerPage: perPage})
		if err != nil {
			return nil, doprovider.MapError("listing apps", err)
		}
		out = append(out, apps...)
		if len(out) >= limit || lastPage(resp, len(apps)) {
			return out[:min(len(out), limit)], nil
		}
	}
	return nil, tooManyPages("apps")
}

// findApp is the app named name, when it carries owner's labels.
func (r *Resources) findApp(ctx context.Context, name string, owner cloudresources.Owner) (cloudresources.Observed, error) {
	apps, err := r.listApps(ctx, maxPages*perPage)
	if err != nil {
		return cloudresources.Observed{}, err
	}
	for _, a := range apps {
		if a.Spec.GetName() != name {
			continue
		}
		o := appObserved(a)
		if !owner.Owns(o.Labels) {
			return cloudresources.Observed{}, refused("app %s is not managed by this owner", name)
		}
		return o, nil
	}
	return cloudresources.Observed{}, fmt.Errorf("digitalocean: app %s: %w", name, providers.ErrNotFound)
}

// A Functions namespace is owned by its label, the deterministic name: it
// carries nothing else.

type regionSpec struct {
	Region string `json:"region"`
}

func namespaceObserved(n *godo.FunctionsNamespace) cloudresources.Observed {
	return cloudresources.Observed{
		Ref:  cloudresources.Ref{Kind: KindNamespace, ProviderID: n.Namespace},
		Name: n.Label, Region: n.Region, Status: "active", Ready: true,
		Spec: mustJSON(regionSpec{Region: n.Region}), Labels: []string{},
		Outputs:   map[string]string{"namespace": n.Namespace, "apiHost": n.ApiHost, "uuid": n.UUID},
		CreatedAt: epochMillis(n.CreatedAt.UnixMilli()),
	}
}

// withKey adds the namespace's key as its secret output.
func withKey(o cloudresources.Observed, n *godo.FunctionsNamespace) cloudresources.Observed {
	if n.Key != "" {
		o.Secrets = cloudresources.SecretValues{"key": n.Key}
	}
	return o
}

func (r *Resources) createNamespace(ctx context.Context, req cloudresources.CreateRequest) (cloudresources.Observed, error) {
	var spec regionSpec
	if err := decodeSpec(req.Spec, &spec); err != nil {
		return cloudresources.Observed{}, err
	}
	n, _, err := r.client.Functions.CreateNamespace(ctx, &godo.FunctionsNamespaceCreateRequest{Label: req.Name, Region: spec.Region})
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("creating functions namespace "+req.Name, err)
	}
	return withKey(namespaceObserved(n), n), nil
}

func (r *Resources) getNamespace(ctx context.Context, id string) (*godo.FunctionsNamespace, error) {
	n, _, err := r.client.Functions.GetNamespace(ctx, id)
	if err != nil {
		return nil, doprovider.MapError("reading functions namespace "+id, err)
	}
	return n, nil
}

// findNamespace is the namespace labelled name. It answers its key: a
// create whose answer was lost has no other way to it (DigitalOcean's GET
// answers the key; a plain Observe drops it).
func (r *Resources) findNamespace(ctx context.Context, name string) (cloudresources.Observed, error) {
	list, _, err := r.client.Functions.ListNamespaces(ctx)
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("listing functions namespaces", err)
	}
	for i := range list {
		if list[i].Label != name {
			continue
		}
		n, err := r.getNamespace(ctx, list[i].Namespace)
		if err != nil {
			return cloudresources.Observed{}, err
		}
		return withKey(namespaceObserved(n), n), nil
	}
	return cloudresources.Observed{}, fmt.Errorf("digitalocean: functions namespace %s: %w", name, providers.ErrNotFound)
}

// A dedicated inference endpoint carries no labels either: it is owned by
// its deterministic name.

type inferenceSpec struct {
	Region               string `json:"region"`
	ModelSlug            string `json:"model_slug"`
	ModelProvider        string `json:"model_provider"`
	ProviderModelID      string `json:"provider_model_id,omitempty"`
	AcceleratorSlug      string `json:"accelerator_slug"`
	Type                 string `json:"type,omitempty"`
	Replicas             uint64 `json:"replicas"`
	MaxReplicas          uint64 `json:"maxReplicas,omitempty"`
	EnablePublicEndpoint bool   `json:"enable_public_endpoint,omitempty"`
	VPCUUID              string `json:"vpc_uuid,omitempty"`
	HuggingFaceToken     string `json:"hugging_face_token,omitempty"`
}

// inferenceRequest is godo's spec of one model on one accelerator type,
// and the gated model's token resolved from secrets.
func inferenceRequest(raw json.RawMessage, name string, secrets cloudresources.SecretValues) (*godo.DedicatedInferenceSpecRequest, *godo.DedicatedInferenceSecrets, error) {
	var spec inferenceSpec
	if err := decodeSpec(raw, &spec); err != nil {
		return nil, nil, err
	}
	req := &godo.DedicatedInferenceSpecRequest{
		Version: 1, Name: name, Region: spec.Region, EnablePublicEndpoint: spec.EnablePublicEndpoint,
		ModelDeployments: []*godo.DedicatedInferenceModelRequest{{
			ModelSlug: spec.ModelSlug, ModelProvider: spec.ModelProvider, ProviderModelID: spec.ProviderModelID,
			Accelerators: []*godo.DedicatedInferenceAcceleratorRequest{{AcceleratorSlug: spec.AcceleratorSlug, Scale: spec.Replicas, Type: spec.Type}},
		}},
	}
	if spec.VPCUUID != "" {
		req.VPC = &godo.DedicatedInferenceVPCRequest{UUID: spec.VPCUUID}
	}
	var sec *godo.DedicatedInferenceSecrets
	if spec.HuggingFaceToken != "" {
		token, ok := secrets[spec.HuggingFaceToken]
		if !ok {
			return nil, nil, refused("hugging_face_token: its SecretRef is not resolved")
		}
		sec = &godo.DedicatedInferenceSecrets{HuggingFaceToken: token}
	}
	return req, sec, nil
}

func inferenceObserved(in *godo.DedicatedInference) cloudresources.Observed {
	o := cloudresources.Observed{
		Ref:  cloudresources.Ref{Kind: KindInference, ProviderID: in.ID},
		Name: in.Name, Region: in.Region, Status: in.Status, Ready: in.Status == "active",
		Labels: []string{}, Outputs: map[string]string{"status": in.Status},
		CreatedAt: epochMillis(in.CreatedAt.UnixMilli()),
	}
	if e := in.Endpoints; e != nil {
		o.Outputs["publicEndpointFqdn"], o.Outputs["privateEndpointFqdn"] = e.PublicEndpointFQDN, e.PrivateEndpointFQDN
	}
	d := in.DeploymentSpec
	if d == nil {
		d = in.PendingDeploymentSpec
	}
	spec := inferenceSpec{Region: in.Region, VPCUUID: in.VPCUUID}
	if d != nil {
		spec.EnablePublicEndpoint = d.EnablePublicEndpoint
		if len(d.ModelDeployments) > 0 && d.ModelDeployments[0] != nil {
			m := d.ModelDeployments[0]
			spec.ModelSlug, spec.ModelProvider, spec.ProviderModelID = m.ModelSlug, m.ModelProvider, m.ProviderModelID
			if len(m.Accelerators) > 0 && m.Accelerators[0] != nil {
				a := m.Accelerators[0]
				spec.AcceleratorSlug, spec.Replicas, spec.Type = a.AcceleratorSlug, a.Scale, a.Type
			}
		}
	}
	o.Spec = mustJSON(spec)
	return o
}

func (r *Resources) createInference(ctx context.Context, req cloudresources.CreateRequest) (cloudresources.Observed, error) {
	spec, secrets, err := inferenceRequest(req.Spec, req.Name, req.Secrets)
	if err != nil {
		return cloudresources.Observed{}, err
	}
	in, token, _, err := r.client.DedicatedInference.Create(ctx, &godo.DedicatedInferenceCreateRequest{Spec: spec, Secrets: secrets})
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("creating dedicated inference "+req.Name, err)
	}
	o := inferenceObserved(in)
	if token != nil && token.Value != "" {
		o.Secrets = cloudresources.SecretValues{"token": token.Value}
	}
	return o, nil
}

func (r *Resources) getInference(ctx context.Context, id string) (*godo.DedicatedInference, error) {
	in, _, err := r.client.DedicatedInference.Get(ctx, id)
	if err != nil {
		return nil, doprovider.MapError("reading dedicated inference "+id, err)
	}
	return in, nil
}

func (r *Resources) updateInference(ctx context.Context, req cloudresources.UpdateRequest) (cloudresources.Observed, error) {
	cur, err := r.getInference(ctx, req.ProviderID)
	if err != nil {
		return cloudresources.Observed{}, err
	}
	spec, secrets, err := inferenceRequest(req.New, cur.Name, req.Secrets)
	if err != nil {
		return cloudresources.Observed{}, err
	}
	spec.Region = cur.Region
	in, _, err := r.client.DedicatedInference.Update(ctx, req.ProviderID, &godo.DedicatedInferenceUpdateRequest{Spec: spec, Secrets: secrets})
	if err != nil {
		return cloudresources.Observed{}, doprovider.MapError("updating dedicated inference "+req.ProviderID, err)
	}
	return inferenceObserved(in), nil
}

func (r *Resources) listInferences(ctx context.Context, name string, limit int) ([]godo.DedicatedInferenceListItem, error) {
	var out []godo.DedicatedInferenceListItem
	for page := 1; page <= maxPages; page++ {
		items, resp, err := r.client.DedicatedInference.List(ctx, &godo.DedicatedInferenceListOptions{
			Name: name, ListOptions: godo.ListOptions{Page: page, PerPage: perPage},
		})
		if err != nil {
			return nil, doprovider.MapError("listing dedicated inferences", err)
		}
		out = append(out, items...)
		if len(out) >= limit || lastPage(resp, len(items)) {
			return out[:min(len(out), limit)], nil
		}
	}
	return nil, tooManyPages("dedicated inferences")
}

// findInference is the endpoint named name (names are ours: owned by name).
func (r *Resources) findInference(ctx context.Context, name string) (cloudresources.Observed, error) {
	items, err := r.listInferences(ctx, name, maxPages*perPage)
	if err != nil {
		return cloudresources.Observed{}, err
	}
	for _, it := range items {
		if it.Name == name {
			in, err := r.getInference(ctx, it.ID)
			if err != nil {
				return cloudresources.Observed{}, err
			}
			return inferenceObserved(in), nil
		}
	}
	return cloudresources.Observed{}, fmt.Errorf("digitalocean: dedicated inference %s: %w", name, providers.ErrNotFound)
}

func lastPage(resp *godo.Response, n int) bool {
	return resp == nil || resp.Links == nil || resp.Links.IsLastPage() || n == 0
}

func tooManyPages(what string) error {
	return fmt.Errorf("digitalocean: listing %s: more than %d pages: %w", what, maxPages, providers.ErrUnavailable)
}

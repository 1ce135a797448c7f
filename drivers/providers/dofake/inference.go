package dofake

import (
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Dedicated inference statuses.
const (
	InferenceProvisioning = "provisioning"
	InferenceActive       = "active"
	InferenceUpdating     = "updating"
)

// inferenceSpec is godo's DedicatedInferenceSpecRequest.
type inferenceSpec struct {
	Version              int    `json:"version"`
	Name                 string `json:"name"`
	Region               string `json:"region"`
	EnablePublicEndpoint bool   `json:"enable_public_endpoint"`
	VPC                  *struct {
		UUID string `json:"uuid"`
	} `json:"vpc"`
	ModelDeployments []struct {
		ModelID         string `json:"model_id"`
		ModelSlug       string `json:"model_slug"`
		ModelProvider   string `json:"model_provider"`
		ProviderModelID string `json:"provider_model_id"`
		Accelerators    []struct {
			AcceleratorSlug string `json:"accelerator_slug"`
			Scale           uint64 `json:"scale"`
			Type            string `json:"type"`
		} `json:"accelerators"`
	} `json:"model_deployments"`
}

type inference struct {
	id, name, region, vpc string
	spec                  inferenceSpec // the spec deployed (or being deployed first)
	pending               *inferenceSpec
	specID, pendingID     string
	status                string
	due                   time.Time
	created, updated      time.Time
	listedAt              time.Time
	seq                   int
}

func (in *inference) settle(now time.Time) {
	if in.status == InferenceActive || in.due.After(now) {
		return
	}
	if in.pending != nil {
		in.spec, in.specID, in.pending, in.pendingID = *in.pending, in.pendingID, nil, ""
	}
	in.status, in.updated = InferenceActive, in.due
}

type wireInferenceAccelerator struct {
	AcceleratorID   string `json:"accelerator_id"`
	AcceleratorSlug string `json:"accelerator_slug"`
	State           string `json:"state"`
	Type            string `json:"type"`
	Scale           uint64 `json:"scale"`
}

type wireInferenceModel struct {
	ModelID         string                     `json:"model_id"`
	ModelSlug       string                     `json:"model_slug"`
	ModelProvider   string                     `json:"model_provider"`
	ProviderModelID string                     `json:"provider_model_id,omitempty"`
	Accelerators    []wireInferenceAccelerator `json:"accelerators"`
}

type wireInferenceDeployment struct {
	Version              int    `json:"version"`
	ID                   string `json:"id"`
	DedicatedInferenceID string `json:"dedicated_inference_id"`
	State                string `json:"state"`
	EnablePublicEndpoint bool   `json:"enable_public_endpoint"`
	VPCConfig            struct {
		VPCUUID string `json:"vpc_uuid"`
	} `json:"vpc_config"`
	ModelDeployments []wireInferenceModel `json:"model_deployments"`
}

type wireEndpoints struct {
	PublicEndpointFQDN  string `json:"public_endpoint_fqdn,omitempty"`
	PrivateEndpointFQDN string `json:"private_endpoint_fqdn,omitempty"`
}

type wireInference struct {
	ID                    string                   `json:"id"`
	Name                  string                   `json:"name"`
	Region                string                   `json:"region"`
	Status                string                   `json:"status"`
	VPCUUID               string                   `json:"vpc_uuid"`
	Endpoints             *wireEndpoints           `json:"endpoints,omitempty"`
	Spec                  *wireInferenceDeployment `json:"spec,omitempty"`
	PendingDeploymentSpec *wireInferenceDeployment `json:"pending_deployment_spec,omitempty"`
	CreatedAt             string                   `json:"created_at"`
	UpdatedAt             string                   `json:"updated_at"`
}

func (in *inference) wireSpec(s inferenceSpec, id, state string) *wireInferenceDeployment {
	w := &wireInferenceDeployment{
		Version: s.Version, ID: id, DedicatedInferenceID: in.id, State: state,
		EnablePublicEndpoint: s.EnablePublicEndpoint, ModelDeployments: []wireInferenceModel{},
	}
	w.VPCConfig.VPCUUID = in.vpc
	for i, m := range s.ModelDeployments {
		wm := wireInferenceModel{ModelID: m.ModelID, ModelSlug: m.ModelSlug, ModelProvider: m.ModelProvider, ProviderModelID: m.ProviderModelID, Accelerators: []wireInferenceAccelerator{}}
		if wm.ModelID == "" {
			wm.ModelID = fmt.Sprintf("%s-model-%d", id[:8], i)
		}
		for j, acc := range m.Accelerators {
			wm.Accelerators = append(wm.Accelerators, wireInferenceAccelerator{
				AcceleratorID: fmt.Sprintf("%s-acc-%d-%d", id[:8], i, j), AcceleratorSlug: acc.AcceleratorSlug,
				State: state, Type: acc.Type, Scale: acc.Scale,
			})
		}
		w.ModelDeployments = append(w.ModelDeployments, wm)
	}
	return w
}

func (in *inference) wire() wireInference {
	w := wireInference{
		ID: in.id, Name: in.name, Region: in.region, Status: in.status, VPCUUID: in.vpc,
		CreatedAt: stamp(in.created), UpdatedAt: stamp(in.updated),
	}
	if in.status == InferenceProvisioning {
		w.PendingDeploymentSpec = in.wireSpec(in.spec, in.specID, "pending")
		return w
	}
	w.Spec = in.wireSpec(in.spec, in.specID, "active")
	if in.pending != nil {
		w.PendingDeploymentSpec = in.wireSpec(*in.pending, in.pendingID, "pending")
	}
	w.Endpoints = &wireEndpoints{PrivateEndpointFQDN: fmt.Sprintf("%s.%s.private.inference.dofake.invalid", in.name, in.id[:8])}
	if in.spec.EnablePublicEndpoint {
		w.Endpoints.PublicEndpointFQDN = fmt.Sprintf("%s.%s.inference.dofake.invalid", in.name, in.id[:8])
	}
	return w
}

// checkInferenceSpec answers what is wrong with s ("" when nothing): the
// accelerators must be GPU sizes offered in its region.
func (st *state) checkInferenceSpec(s inferenceSpec) string {
	if !appNameRE.MatchString(s.Name) {
		return "spec.name must be 2 to 32 lowercase letters, digits and dashes, starting with a letter."
	}
	if region := st.region(s.Region); region == nil || !region.Available {
		return fmt.Sprintf("spec.region %q is not available.", s.Region)
	}
	if len(s.ModelDeployments) == 0 {
		return "spec.model_deployments needs at least one model."
	}
	for _, m := range s.ModelDeployments {
		if m.ModelSlug == "" {
			return "every model deployment needs a model_slug."
		}
		if len(m.Accelerators) == 0 {
			return "every model deployment needs accelerators."
		}
		for _, acc := range m.Accelerators {
			size := st.size(acc.AcceleratorSlug)
			if size == nil || size.GPUInfo == nil || !slices.Contains(size.Regions, s.Region) {
				return fmt.Sprintf("accelerator %q is not offered in %s.", acc.AcceleratorSlug, s.Region)
			}
			if acc.Scale < 1 {
				return "an accelerator's scale must be at least 1."
			}
		}
	}
	return ""
}

func (f *Fake) createInference(r *http.Request, now time.Time) (int, any) {
	st := &f.st
	var req struct {
		Spec *inferenceSpec `json:"spec"`
	}
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	if req.Spec == nil {
		return fail(http.StatusUnprocessableEntity, "spec is required.")
	}
	if msg := st.checkInferenceSpec(*req.Spec); msg != "" {
		return fail(http.StatusUnprocessableEntity, "%s", msg)
	}
	id, seq := st.newID(KindDedicatedInferences)
	specID, _ := st.newID("inferenceSpecs")
	in := &inference{
		id: id, name: req.Spec.Name, region: req.Spec.Region, spec: *req.Spec, specID: specID,
		status: InferenceProvisioning, due: now.Add(st.settings.DeployDelay),
		created: now, updated: now, listedAt: now.Add(st.settings.ListLag), seq: seq,
	}
	in.vpc = vpcUUID(in.region)
	if req.Spec.VPC != nil && req.Spec.VPC.UUID != "" {
		in.vpc = req.Spec.VPC.UUID
	}
	st.inferences[in.id] = in
	tokenID, _ := st.newID("inferenceTokens")
	token := map[string]any{"id": tokenID, "name": "default", "value": newSecret("di_"), "is_managed": true, "created_at": stamp(now)}
	return http.StatusAccepted, map[string]any{"dedicated_inference": in.wire(), "token": token}
}

func (f *Fake) listInferences(r *http.Request, now time.Time) (int, any) {
	q := r.URL.Query()
	var listed []*inference
	for _, in := range f.st.inferences {
		if !listedBy(in.listedAt, now) {
			continue
		}
		if (q.Get("region") != "" && in.region != q.Get("region")) || (q.Get("name") != "" && in.name != q.Get("name")) {
			continue
		}
		listed = append(listed, in)
	}
	slices.SortFunc(listed, func(a, b *inference) int { return a.seq - b.seq })
	type listItem struct {
		ID              string         `json:"id"`
		Name            string         `json:"name"`
		Region          string         `json:"region"`
		Status          string         `json:"status"`
		VPCUUID         string         `json:"vpc_uuid"`
		ProviderModelID []string       `json:"provider_model_id,omitempty"`
		Endpoints       *wireEndpoints `json:"endpoints,omitempty"`
		CreatedAt       string         `json:"created_at"`
		UpdatedAt       string         `json:"updated_at"`
	}
	out := []listItem{}
	for _, in := range listed {
		f.st.drifted(KindDedicatedInferences, in.id, in)
		w := in.wire()
		item := listItem{ID: w.ID, Name: w.Name, Region: w.Region, Status: w.Status, VPCUUID: w.VPCUUID, Endpoints: w.Endpoints, CreatedAt: w.CreatedAt, UpdatedAt: w.UpdatedAt}
		for _, m := range in.spec.ModelDeployments {
			if m.ProviderModelID != "" {
				item.ProviderModelID = append(item.ProviderModelID, m.ProviderModelID)
			}
		}
		out = append(out, item)
	}
	return paged(r, "dedicated_inferences", out)
}

func (f *Fake) getInference(r *http.Request, _ time.Time) (int, any) {
	in := f.st.inferences[r.PathValue("id")]
	if in == nil {
		return notFoundAnswer()
	}
	f.st.drifted(KindDedicatedInferences, in.id, in)
	return http.StatusOK, map[string]any{"dedicated_inference": in.wire()}
}

// updateInference deploys a new spec: the endpoint is "updating" with the
// spec pending until DeployDelay passed. Its name and region stay.
func (f *Fake) updateInference(r *http.Request, now time.Time) (int, any) {
	st := &f.st
	in := st.inferences[r.PathValue("id")]
	if in == nil {
		return notFoundAnswer()
	}
	var req struct {
		Spec *inferenceSpec `json:"spec"`
	}
	if err := decode(r, &req); err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	if req.Spec == nil {
		return fail(http.StatusUnprocessableEntity, "spec is required.")
	}
	if in.status == InferenceProvisioning {
		return fail(http.StatusUnprocessableEntity, "The endpoint is still being provisioned.")
	}
	if req.Spec.Name != in.name || req.Spec.Region != in.region {
		return fail(http.StatusUnprocessableEntity, "spec.name and spec.region cannot change.")
	}
	if msg := st.checkInferenceSpec(*req.Spec); msg != "" {
		return fail(http.StatusUnprocessableEntity, "%s", msg)
	}
	pendingID, _ := st.newID("inferenceSpecs")
	in.pending, in.pendingID = req.Spec, pendingID
	in.status, in.due, in.updated = InferenceUpdating, now.Add(st.settings.DeployDelay), now
	return http.StatusAccepted, map[string]any{"dedicated_inference": in.wire()}
}

func (f *Fake) deleteInference(r *http.Request, _ time.Time) (int, any) {
	in := f.st.inferences[r.PathValue("id")]
	if in == nil {
		return notFoundAnswer()
	}
	delete(f.st.inferences, in.id)
	return http.StatusNoContent, nil
}

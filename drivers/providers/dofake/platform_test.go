package dofake_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/godo"

	"github.com/better-compute/better-compute/drivers/providers/dofake"
)

const deployDelay = 90 * time.Second

func appSpec(name string, instances int64) *godo.AppSpec {
	return &godo.AppSpec{
		Name: name, Region: "ams",
		Services: []*godo.AppServiceSpec{{
			Name: "web", InstanceCount: instances, InstanceSizeSlug: "apps-s-1vcpu-1gb",
			Image: &godo.ImageSourceSpec{RegistryType: godo.ImageSourceSpecRegistryType_DockerHub, Repository: "nginx", Tag: "1.27"},
		}},
	}
}

func TestApps(t *testing.T) {
	e := newEnv(t, dofake.Settings{DeployDelay: deployDelay})
	ctx := context.Background()
	a, resp, err := e.do.Apps.Create(ctx, &godo.AppCreateRequest{Spec: appSpec("shop", 1)})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("create app: %v", err)
	}
	if a.ID == "" || a.Spec.Name != "shop" || a.Spec.Services[0].Image.Repository != "nginx" || a.Region == nil || a.Region.Slug != "ams" ||
		a.ActiveDeployment != nil || a.InProgressDeployment == nil || a.InProgressDeployment.Phase != godo.DeploymentPhase_Building || a.LiveURL != "" {
		t.Fatalf("created app = %+v", a)
	}
	first := a.InProgressDeployment.ID

	e.clock.Advance(deployDelay)
	got, _, err := e.do.Apps.Get(ctx, a.ID)
	if err != nil || got.ActiveDeployment == nil || got.ActiveDeployment.ID != first || got.ActiveDeployment.Phase != godo.DeploymentPhase_Active ||
		got.InProgressDeployment != nil || !strings.HasSuffix(got.LiveURL, ".invalid") || got.LastDeploymentActiveAt.IsZero() {
		t.Fatalf("deployed app = %+v, %v", got, err)
	}

	// An update deploys the new spec; the old deployment serves until then.
	if _, _, err := e.do.Apps.Update(ctx, a.ID, &godo.AppUpdateRequest{Spec: &godo.AppSpec{Name: "shop"}}); statusOf(err) != 422 {
		t.Fatalf("an update without components: %v, want 422", err)
	}
	updated, _, err := e.do.Apps.Update(ctx, a.ID, &godo.AppUpdateRequest{Spec: appSpec("shop", 3)})
	if err != nil || updated.Spec.Services[0].InstanceCount != 3 || updated.ActiveDeployment.ID != first || updated.InProgressDeployment == nil {
		t.Fatalf("updated app = %+v, %v", updated, err)
	}
	second := updated.InProgressDeployment.ID
	e.clock.Advance(deployDelay)
	if d, _, err := e.do.Apps.GetDeployment(ctx, a.ID, second); err != nil || d.Phase != godo.DeploymentPhase_Active || d.Spec.Services[0].InstanceCount != 3 {
		t.Fatalf("the second deployment = %+v, %v", d, err)
	}
	deployments, _, err := e.do.Apps.ListDeployments(ctx, a.ID, nil)
	if err != nil || len(deployments) != 2 || deployments[1].ID != first || deployments[1].Phase != godo.DeploymentPhase_Superseded {
		t.Fatalf("deployments = %+v, %v", deployments, err)
	}

	for _, tc := range []struct {
		name string
		spec *godo.AppSpec
	}{
		{"a name in use", appSpec("shop", 1)},
		{"a bad name", appSpec("Shop!", 1)},
		{"an unknown region", func() *godo.AppSpec { s := appSpec("other", 1); s.Region = "mars"; return s }()},
		{"no components", &godo.AppSpec{Name: "empty"}},
	} {
		if _, _, err := e.do.Apps.Create(ctx, &godo.AppCreateRequest{Spec: tc.spec}); statusOf(err) != 422 {
			t.Errorf("%s: %v, want 422", tc.name, err)
		}
	}
	if apps, _, err := e.do.Apps.List(ctx, nil); err != nil || len(apps) != 1 || apps[0].ID != a.ID {
		t.Fatalf("apps = %+v, %v", apps, err)
	}
	if _, err := e.do.Apps.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.do.Apps.Get(ctx, a.ID); statusOf(err) != 404 {
		t.Fatalf("a deleted app: %v", err)
	}
	if s := e.fake.Stats(); s.Created[dofake.KindApps] != 1 || s.Live[dofake.KindApps] != 0 {
		t.Fatalf("apps created %d live %d", s.Created[dofake.KindApps], s.Live[dofake.KindApps])
	}
}

func TestFunctionsNamespaces(t *testing.T) {
	e := newEnv(t, dofake.Settings{ListLag: 10 * time.Second})
	ctx := context.Background()
	fn := e.do.Functions
	if _, _, err := fn.CreateNamespace(ctx, &godo.FunctionsNamespaceCreateRequest{Label: "jobs", Region: "mars1"}); statusOf(err) != 422 {
		t.Fatalf("an unknown region: %v", err)
	}
	ns, _, err := fn.CreateNamespace(ctx, &godo.FunctionsNamespaceCreateRequest{Label: "jobs", Region: "fra1"})
	if err != nil || !strings.HasPrefix(ns.Namespace, "fn-") || ns.UUID == "" || ns.Key == "" || ns.Label != "jobs" || ns.Region != "fra1" ||
		!strings.HasSuffix(ns.ApiHost, ".invalid") {
		t.Fatalf("create namespace: %+v, %v", ns, err)
	}
	if list, _, err := fn.ListNamespaces(ctx); err != nil || len(list) != 0 {
		t.Fatalf("during the lag, namespaces = %+v, %v", list, err)
	}
	got, _, err := fn.GetNamespace(ctx, ns.Namespace)
	if err != nil || got.UUID != ns.UUID || got.Key != ns.Key {
		t.Fatalf("get namespace: %+v, %v", got, err)
	}
	e.clock.Advance(10 * time.Second)
	list, _, err := fn.ListNamespaces(ctx)
	if err != nil || len(list) != 1 || list[0].Namespace != ns.Namespace || list[0].Key != "" {
		t.Fatalf("namespaces = %+v, %v", list, err)
	}
	if _, err := fn.DeleteNamespace(ctx, ns.Namespace); err != nil {
		t.Fatal(err)
	}
	if _, _, err := fn.GetNamespace(ctx, ns.Namespace); statusOf(err) != 404 {
		t.Fatalf("a deleted namespace: %v", err)
	}
	if n := e.fake.Created(dofake.KindFunctionsNamespaces); n != 1 {
		t.Fatalf("%d namespaces created", n)
	}
}

func inferenceSpec(name string, scale uint64) *godo.DedicatedInferenceSpecRequest {
	return &godo.DedicatedInferenceSpecRequest{
		Version: 1, Name: name, Region: "tor1", EnablePublicEndpoint: true,
		ModelDeployments: []*godo.DedicatedInferenceModelRequest{{
			ModelSlug: "llama-3-8b", ModelProvider: "hugging_face", ProviderModelID: "meta-llama/Meta-Llama-3-8B",
			Accelerators: []*godo.DedicatedInferenceAcceleratorRequest{{AcceleratorSlug: "gpu-h100x1-80gb", Scale: scale, Type: "prefill_decode"}},
		}},
	}
}

func TestDedicatedInference(t *testing.T) {
	e := newEnv(t, dofake.Settings{DeployDelay: deployDelay})
	ctx := context.Background()
	di := e.do.DedicatedInference
	bad := inferenceSpec("chat", 1)
	bad.Region = "nyc3" // no GPUs there
	if _, _, _, err := di.Create(ctx, &godo.DedicatedInferenceCreateRequest{Spec: bad}); statusOf(err) != 422 {
		t.Fatalf("accelerators not offered in the region: %v", err)
	}
	in, token, resp, err := di.Create(ctx, &godo.DedicatedInferenceCreateRequest{Spec: inferenceSpec("chat", 2)})
	if err != nil || resp.StatusCode != http.StatusAccepted || in.Status != "provisioning" || in.PendingDeploymentSpec == nil ||
		token == nil || token.Value == "" {
		t.Fatalf("create: %+v, token %+v, %v", in, token, err)
	}
	e.clock.Advance(deployDelay)
	got, _, err := di.Get(ctx, in.ID)
	if err != nil || got.Status != "active" || got.DeploymentSpec == nil || got.PendingDeploymentSpec != nil || got.Endpoints == nil ||
		got.Endpoints.PublicEndpointFQDN == "" || got.DeploymentSpec.ModelDeployments[0].Accelerators[0].Scale != 2 {
		t.Fatalf("active endpoint = %+v, %v", got, err)
	}
	upd, _, err := di.Update(ctx, in.ID, &godo.DedicatedInferenceUpdateRequest{Spec: inferenceSpec("chat", 4)})
	if err != nil || upd.Status != "updating" || upd.PendingDeploymentSpec == nil || upd.DeploymentSpec.ModelDeployments[0].Accelerators[0].Scale != 2 {
		t.Fatalf("update: %+v, %v", upd, err)
	}
	e.clock.Advance(deployDelay)
	got, _, _ = di.Get(ctx, in.ID)
	if got.Status != "active" || got.DeploymentSpec.ModelDeployments[0].Accelerators[0].Scale != 4 {
		t.Fatalf("updated endpoint = %+v", got)
	}
	list, _, err := di.List(ctx, &godo.DedicatedInferenceListOptions{Region: "tor1"})
	if err != nil || len(list) != 1 || list[0].ID != in.ID {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if other, _, _ := di.List(ctx, &godo.DedicatedInferenceListOptions{Name: "other"}); len(other) != 0 {
		t.Fatalf("list by another name = %+v", other)
	}
	if _, err := di.Delete(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := di.Get(ctx, in.ID); statusOf(err) != 404 {
		t.Fatalf("a deleted endpoint: %v", err)
	}
}

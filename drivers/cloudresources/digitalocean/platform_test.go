package digitalocean_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/godo"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/drivers/cloudresources/digitalocean"
	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/drivers/providers/dofake"
)

const deployDelay = 2 * time.Minute

var other = cloudresources.Owner{ResourceID: "cres_01jzzzzzzzzzzzzzzzzzzzzzz0", TenantID: "ten_other"}

func TestDiscoverAndTakeOverClusters(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ours := e.onlineCluster(t)
	foreign, _, err := e.do.Databases.Create(ctx, &godo.DatabaseCreateRequest{
		Name: "legacy-pg", EngineSlug: "pg", SizeSlug: "db-s-1vcpu-2gb", Region: "nyc3", NumNodes: 1, Tags: []string{"team:data"},
	})
	require.NoError(t, err)
	_, _, err = e.do.Databases.Create(ctx, &godo.DatabaseCreateRequest{Name: "cache", EngineSlug: "valkey", SizeSlug: "db-s-1vcpu-2gb", Region: "nyc3", NumNodes: 1})
	require.NoError(t, err)
	e.clock.Advance(dbDelay)

	listed, err := e.res.List(ctx, digitalocean.KindCluster, 0)
	require.NoError(t, err)
	require.Len(t, listed, 2, "only the pg clusters")
	byName := map[string]cloudresources.Observed{}
	for _, o := range listed {
		byName[o.Name] = o
		require.Nil(t, o.Secrets)
		requireValidSpec(t, o)
	}
	id, managed := cloudresources.ManagedBy(byName[ours.Name].Labels)
	require.True(t, managed)
	require.Equal(t, owner.ResourceID, id)
	_, managed = cloudresources.ManagedBy(byName["legacy-pg"].Labels)
	require.False(t, managed)
	one, err := e.res.List(ctx, digitalocean.KindCluster, 1)
	require.NoError(t, err)
	require.Len(t, one, 1)

	// Adopt's takeover: our tags join the cluster's own.
	ref := cloudresources.Ref{Kind: digitalocean.KindCluster, ProviderID: foreign.ID}
	adopter := cloudresources.Owner{ResourceID: "cres_01jadoptadoptadoptadopt00", TenantID: "ten_acme"}
	labelled, err := e.res.Label(ctx, ref, adopter)
	require.NoError(t, err)
	require.True(t, adopter.Owns(labelled.Labels))
	require.Contains(t, labelled.Labels, "team:data")
	require.Nil(t, labelled.Secrets)
	again, err := e.res.Label(ctx, ref, adopter)
	require.NoError(t, err)
	require.ElementsMatch(t, labelled.Labels, again.Labels)

	// Another resource cannot take it, nor ours.
	_, err = e.res.Label(ctx, ref, other)
	require.ErrorIs(t, err, cloudresources.ErrManagedByAnother)
	_, err = e.res.Label(ctx, ours.Ref, other)
	require.ErrorIs(t, err, cloudresources.ErrManagedByAnother)
	// A child of another's cluster neither.
	_, err = e.res.Label(ctx, cloudresources.Ref{Kind: digitalocean.KindDatabase, ParentProviderID: foreign.ID, ProviderID: "defaultdb"}, other)
	require.ErrorIs(t, err, cloudresources.ErrManagedByAnother)
	child, err := e.res.Label(ctx, cloudresources.Ref{Kind: digitalocean.KindDatabase, ParentProviderID: foreign.ID, ProviderID: "defaultdb"}, adopter)
	require.NoError(t, err)
	require.Equal(t, "defaultdb", child.Name)

	// Release: another's Unlabel changes nothing; ours removes only ours.
	require.NoError(t, e.res.Unlabel(ctx, ref, other))
	got, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: ref})
	require.NoError(t, err)
	require.True(t, adopter.Owns(got.Labels))
	require.NoError(t, e.res.Unlabel(ctx, ref, adopter))
	got, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: ref})
	require.NoError(t, err)
	require.Equal(t, []string{"team:data"}, got.Labels)
	require.Equal(t, "online", got.Status, "release leaves it running")
	require.NoError(t, e.res.Unlabel(ctx, ref, adopter), "idempotent")
	require.NoError(t, e.res.Unlabel(ctx, cloudresources.Ref{Kind: digitalocean.KindCluster, ProviderID: "gone"}, adopter))
	_, err = e.res.Label(ctx, cloudresources.Ref{Kind: digitalocean.KindCluster, ProviderID: "gone"}, adopter)
	require.ErrorIs(t, err, providers.ErrNotFound)

	for _, kind := range []string{digitalocean.KindUser, digitalocean.KindFirewall, digitalocean.KindReplica} {
		_, err = e.res.List(ctx, kind, 0)
		require.ErrorIs(t, err, cloudresources.ErrNotListable, kind)
	}
}

func appSpecJSON(instances int) json.RawMessage {
	return json.RawMessage(`{"region":"ams","services":[{"name":"web","instance_count":` + itoa(instances) + `,
		"image":{"registry_type":"DOCKER_HUB","repository":"nginx","tag":"1.27"},
		"envs":[{"key":"DB_PASSWORD","type":"SECRET","value":"secret://vault/db"}]}],
		"envs":[{"key":"MODE","value":"prod"}]}`)
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestAppLifecycle(t *testing.T) {
	e := newEnvWith(t, dofake.Settings{DeployDelay: deployDelay})
	ctx := context.Background()
	name := cloudresources.ResourceName(owner.ResourceID)
	secrets := cloudresources.SecretValues{"secret://vault/db": "hunter2-not-logged"}

	_, err := e.res.Create(ctx, cloudresources.CreateRequest{Kind: digitalocean.KindApp, Name: name, Owner: owner, Spec: appSpecJSON(1)})
	require.ErrorIs(t, err, providers.ErrRefused, "an unresolved SecretRef is never sent")
	require.Zero(t, e.fake.Created(dofake.KindApps))

	created, err := e.res.Create(ctx, cloudresources.CreateRequest{Kind: digitalocean.KindApp, Name: name, Owner: owner, Spec: appSpecJSON(1), Secrets: secrets})
	require.NoError(t, err)
	require.Equal(t, name, created.Name)
	require.Equal(t, "ams", created.Region)
	require.Equal(t, "deploying", created.Status)
	require.False(t, created.Ready)
	require.True(t, owner.Owns(created.Labels))
	require.NotContains(t, string(created.Spec), "BETTER_COMPUTE", "the ownership envs are not the spec's")
	require.NotContains(t, string(created.Spec), "hunter2", "a secret env's value is never observed")
	require.Contains(t, string(created.Spec), `"MODE"`)
	requireValidSpecExceptSecrets(t, created)

	// The app got the resolved secret; DigitalOcean answers it encrypted.
	kept := e.fake.AppSpec(created.ProviderID)
	require.Equal(t, "hunter2-not-logged", kept["services"].([]any)[0].(map[string]any)["envs"].([]any)[0].(map[string]any)["value"])
	a, _, err := e.do.Apps.Get(ctx, created.ProviderID)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(a.Spec.Services[0].Envs[0].Value, "EV["))

	e.clock.Advance(deployDelay)
	got, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.NoError(t, err)
	require.True(t, got.Ready)
	require.Equal(t, "active", got.Status)
	require.NotEmpty(t, got.Outputs["liveUrl"])
	require.NotEmpty(t, got.Outputs["activeDeploymentId"])

	// The lost create is found by name and owner; another's is refused.
	found, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindApp}, Name: name, Owner: owner})
	require.NoError(t, err)
	require.Equal(t, created.ProviderID, found.ProviderID)
	_, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindApp}, Name: name, Owner: other})
	require.ErrorIs(t, err, providers.ErrRefused)
	_, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindApp}, Name: "bc-r-none", Owner: owner})
	require.ErrorIs(t, err, providers.ErrNotFound)

	updated, err := e.res.Update(ctx, cloudresources.UpdateRequest{Ref: created.Ref, Owner: owner, Old: appSpecJSON(1), New: appSpecJSON(3), Secrets: secrets})
	require.NoError(t, err)
	require.Equal(t, "deploying", updated.Status)
	require.Equal(t, name, updated.Name, "the name stays")
	require.True(t, owner.Owns(updated.Labels))
	e.clock.Advance(deployDelay)
	got, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.NoError(t, err)
	require.Contains(t, string(got.Spec), `"instance_count":3`)

	listed, err := e.res.List(ctx, digitalocean.KindApp, 0)
	require.NoError(t, err)
	require.Len(t, listed, 1)
	id, managed := cloudresources.ManagedBy(listed[0].Labels)
	require.True(t, managed)
	require.Equal(t, owner.ResourceID, id)

	require.NoError(t, e.res.Delete(ctx, created.Ref))
	require.NoError(t, e.res.Delete(ctx, created.Ref), "already gone")
	_, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.ErrorIs(t, err, providers.ErrNotFound)
}

// requireValidSpecExceptSecrets validates an app's observed spec once its
// secret envs carry a placeholder ref (their values are never observed).
func requireValidSpecExceptSecrets(t *testing.T, o cloudresources.Observed) {
	t.Helper()
	o.Spec = json.RawMessage(strings.ReplaceAll(string(o.Spec), `"type":"SECRET"`, `"type":"SECRET","value":"secret://x/y"`))
	requireValidSpec(t, o)
}

func TestAppTakeOverAndRelease(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	a, _, err := e.do.Apps.Create(ctx, &godo.AppCreateRequest{Spec: &godo.AppSpec{
		Name: "shop", Region: "fra",
		Services: []*godo.AppServiceSpec{{Name: "web", Image: &godo.ImageSourceSpec{RegistryType: godo.ImageSourceSpecRegistryType_DockerHub, Repository: "nginx"}}},
		Envs: []*godo.AppVariableDefinition{
			{Key: "MODE", Value: "prod"},
			{Key: "TOKEN", Value: "s3cret", Type: godo.AppVariableType_Secret},
		},
	}})
	require.NoError(t, err)
	ref := cloudresources.Ref{Kind: digitalocean.KindApp, ProviderID: a.ID}

	listed, err := e.res.List(ctx, digitalocean.KindApp, 0)
	require.NoError(t, err)
	require.Len(t, listed, 1)
	_, managed := cloudresources.ManagedBy(listed[0].Labels)
	require.False(t, managed)

	labelled, err := e.res.Label(ctx, ref, owner)
	require.NoError(t, err)
	require.True(t, owner.Owns(labelled.Labels))
	require.Equal(t, "shop", labelled.Name)
	require.NotContains(t, string(labelled.Spec), "s3cret")
	_, err = e.res.Label(ctx, ref, other)
	require.ErrorIs(t, err, cloudresources.ErrManagedByAnother)

	require.NoError(t, e.res.Unlabel(ctx, ref, owner))
	got, _, err := e.do.Apps.Get(ctx, a.ID)
	require.NoError(t, err)
	require.Len(t, got.Spec.Envs, 2, "only the app's own envs stay")
	require.Equal(t, "MODE", got.Spec.Envs[0].Key)
	// Sent back encrypted by the label and the unlabel, the secret is kept.
	require.Equal(t, "s3cret", e.fake.AppSpec(a.ID)["envs"].([]any)[1].(map[string]any)["value"])
	require.NoError(t, e.res.Unlabel(ctx, ref, owner), "idempotent")
	deployments := e.fake.Requests("PUT /v2/apps/{id}")
	require.Equal(t, 2, deployments, "a label and an unlabel, nothing for the second unlabel")
}

func TestFunctionsNamespace(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	name := cloudresources.ResourceName(owner.ResourceID)
	created, err := e.res.Create(ctx, cloudresources.CreateRequest{Kind: digitalocean.KindNamespace, Name: name, Owner: owner, Spec: json.RawMessage(`{"region":"nyc1"}`)})
	require.NoError(t, err)
	require.Equal(t, name, created.Name)
	require.True(t, created.Ready)
	require.NotEmpty(t, created.Outputs["apiHost"])
	require.NotEmpty(t, created.Outputs["uuid"])
	require.Equal(t, created.ProviderID, created.Outputs["namespace"])
	require.Equal(t, []string{"key"}, keys(created.Secrets))
	require.NotContains(t, created.Outputs, "key")
	requireValidSpec(t, created)

	got, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.NoError(t, err)
	require.Nil(t, got.Secrets, "a read carries no key")
	// A lost create is found by its label, with its key: there is no other way to it.
	found, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindNamespace}, Name: name, Owner: owner})
	require.NoError(t, err)
	require.Equal(t, created.ProviderID, found.ProviderID)
	require.Equal(t, created.Secrets["key"], found.Secrets["key"])

	_, err = e.res.Label(ctx, created.Ref, owner)
	require.ErrorIs(t, err, cloudresources.ErrOwnedByName)
	require.ErrorIs(t, e.res.Unlabel(ctx, created.Ref, owner), cloudresources.ErrOwnedByName)
	_, err = e.res.Update(ctx, cloudresources.UpdateRequest{Ref: created.Ref, Owner: owner, Old: created.Spec, New: created.Spec})
	require.ErrorIs(t, err, providers.ErrRefused)

	listed, err := e.res.List(ctx, digitalocean.KindNamespace, 0)
	require.NoError(t, err)
	require.Len(t, listed, 1)
	require.Nil(t, listed[0].Secrets)

	require.NoError(t, e.res.Delete(ctx, created.Ref))
	require.NoError(t, e.res.Delete(ctx, created.Ref))
	_, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindNamespace}, Name: name, Owner: owner})
	require.ErrorIs(t, err, providers.ErrNotFound)
}

func inferenceSpec(replicas int) json.RawMessage {
	return json.RawMessage(`{"region":"nyc2","model_slug":"llama-3-1-8b","model_provider":"hugging_face",
		"provider_model_id":"meta-llama/Llama-3.1-8B-Instruct","accelerator_slug":"gpu-h100x1-80gb","type":"prefill_decode",
		"replicas":` + itoa(replicas) + `,"enable_public_endpoint":true,"hugging_face_token":"secret://vault/hf"}`)
}

func TestDedicatedInference(t *testing.T) {
	e := newEnvWith(t, dofake.Settings{DeployDelay: deployDelay})
	ctx := context.Background()
	name := cloudresources.ResourceName(owner.ResourceID)
	secrets := cloudresources.SecretValues{"secret://vault/hf": "hf_not_logged"}

	_, err := e.res.Create(ctx, cloudresources.CreateRequest{Kind: digitalocean.KindInference, Name: name, Owner: owner, Spec: inferenceSpec(1)})
	require.ErrorIs(t, err, providers.ErrRefused, "an unresolved SecretRef is never sent")

	created, err := e.res.Create(ctx, cloudresources.CreateRequest{Kind: digitalocean.KindInference, Name: name, Owner: owner, Spec: inferenceSpec(1), Secrets: secrets})
	require.NoError(t, err)
	require.Equal(t, "provisioning", created.Status)
	require.False(t, created.Ready)
	require.Equal(t, []string{"token"}, keys(created.Secrets))
	require.NotContains(t, string(created.Spec), "hf_not_logged")
	require.Equal(t, "gpu-h100x1-80gb", specField(t, created.Spec, "accelerator_slug"))

	e.clock.Advance(deployDelay)
	got, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.NoError(t, err)
	require.True(t, got.Ready)
	require.Nil(t, got.Secrets)
	require.NotEmpty(t, got.Outputs["publicEndpointFqdn"])
	require.NotEmpty(t, got.Outputs["privateEndpointFqdn"])
	requireValidSpec(t, got)

	updated, err := e.res.Update(ctx, cloudresources.UpdateRequest{Ref: created.Ref, Owner: owner, Old: inferenceSpec(1), New: inferenceSpec(2), Secrets: secrets})
	require.NoError(t, err)
	require.Equal(t, "updating", updated.Status)
	e.clock.Advance(deployDelay)
	got, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.NoError(t, err)
	var spec map[string]any
	require.NoError(t, json.Unmarshal(got.Spec, &spec))
	require.EqualValues(t, 2, spec["replicas"])

	found, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindInference}, Name: name, Owner: owner})
	require.NoError(t, err)
	require.Equal(t, created.ProviderID, found.ProviderID)
	listed, err := e.res.List(ctx, digitalocean.KindInference, 0)
	require.NoError(t, err)
	require.Len(t, listed, 1)
	requireValidSpec(t, listed[0])

	_, err = e.res.Label(ctx, created.Ref, owner)
	require.ErrorIs(t, err, cloudresources.ErrOwnedByName)
	require.NoError(t, e.res.Delete(ctx, created.Ref))
	require.NoError(t, e.res.Delete(ctx, created.Ref))
	_, err = e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindInference}, Name: name, Owner: owner})
	require.ErrorIs(t, err, providers.ErrNotFound)
}

func TestCatalog(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	all, err := e.res.Catalog(ctx, "")
	require.NoError(t, err)
	require.Len(t, all, len(dofake.DefaultOneClicks()))
	for _, tt := range []struct {
		installsOn string
		want       int
	}{{cloudresources.InstallsOnInstance, 3}, {cloudresources.InstallsOnKubernetes, 2}} {
		apps, err := e.res.Catalog(ctx, tt.installsOn)
		require.NoError(t, err)
		require.Len(t, apps, tt.want, tt.installsOn)
		for _, a := range apps {
			require.Equal(t, tt.installsOn, a.InstallsOn)
			require.NotEmpty(t, a.Slug)
			require.Equal(t, a.Slug, a.Name)
		}
	}
	_, err = e.res.Catalog(ctx, "droplet")
	require.ErrorIs(t, err, providers.ErrRefused)
}

func TestSignals(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.res.Signals(ctx)
	require.ErrorIs(t, err, cloudresources.ErrPreview)

	signal := func(id, severity, title, at, typ string) json.RawMessage {
		b, _ := json.Marshal(map[string]any{"id": id, "severity": severity, "title": title, "detail": "d", "created_at": at,
			"resource": map[string]string{"type": typ, "id": "res-" + id}})
		return b
	}
	require.NoError(t, e.fake.AddSignals(
		signal("old", "info", "deployed", "2026-12-01T10:00:00Z", "app"),
		signal("new", "critical", "agent run failed", "2026-12-01T12:00:00Z", "dedicated_inference"),
		signal("mid", "warning", "asks for a human", "2026-12-01T11:00:00Z", "database"),
		signal("bad-severity", "fatal", "x", "2026-12-01T12:30:00Z", "app"),
		signal("bad-title", "info", "two\nlines", "2026-12-01T12:30:00Z", "app"),
		signal("bad-time", "info", "x", "yesterday", "app"),
		signal("bad-type", "info", "x", "2026-12-01T12:30:00Z", "droplet"),
		json.RawMessage(`{"id":"bad-shape","title":42}`),
	))
	e.fake.EnablePreviews(token)
	got, err := e.res.Signals(ctx)
	require.NoError(t, err)
	var ids []string
	for _, s := range got {
		ids = append(ids, s.ID)
	}
	require.Equal(t, []string{"new", "mid", "old"}, ids)
	require.Equal(t, digitalocean.KindInference, got[0].Kind)
	require.Equal(t, "res-new", got[0].ProviderID)
	require.Equal(t, time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixMilli(), got[0].At)
	require.Equal(t, digitalocean.KindCluster, got[1].Kind)
}

// A kind the manifest says cannot be released is one Unlabel refuses as
// owned by its name, and the other way round.
func TestReleasableMatchesTheDriver(t *testing.T) {
	e := newEnv(t)
	for _, m := range digitalocean.Kinds().All() {
		if m.Parent != "" {
			continue
		}
		err := e.res.Unlabel(context.Background(), cloudresources.Ref{Kind: m.Kind, ProviderID: "gone"}, owner)
		require.Equal(t, !m.Releasable, errors.Is(err, cloudresources.ErrOwnedByName), "%s: %v", m.Kind, err)
		if m.Releasable {
			require.NoError(t, err, m.Kind)
		}
	}
}

// A create whose answer was lost is found by name and owner, once.
func TestLostAppCreateIsFound(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	name := cloudresources.ResourceName(owner.ResourceID)
	require.NoError(t, e.fake.Inject(dofake.Fault{Method: "POST", Path: "/v2/apps", Kind: dofake.FaultApplyThenDrop}))
	_, err := e.res.Create(ctx, cloudresources.CreateRequest{Kind: digitalocean.KindApp, Name: name, Owner: owner, Spec: appSpecJSON(1),
		Secrets: cloudresources.SecretValues{"secret://vault/db": "x"}})
	require.ErrorIs(t, err, providers.ErrUnavailable)
	found, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindApp}, Name: name, Owner: owner})
	require.NoError(t, err)
	require.NotEmpty(t, found.ProviderID)
	require.Equal(t, 1, e.fake.Created(dofake.KindApps))
}

// discover pages through DigitalOcean's listings and stops at its limit.
func TestListPages(t *testing.T) {
	e := newEnvWith(t, dofake.Settings{PerMinute: 10000, PerHour: 100000})
	ctx := context.Background()
	const n = 205
	for i := range n {
		_, _, err := e.do.Apps.Create(ctx, &godo.AppCreateRequest{Spec: &godo.AppSpec{
			Name: "app-" + itoa(i), Region: "nyc",
			Services: []*godo.AppServiceSpec{{Name: "web", Image: &godo.ImageSourceSpec{RegistryType: godo.ImageSourceSpecRegistryType_DockerHub, Repository: "nginx"}}},
		}})
		require.NoError(t, err)
	}
	all, err := e.res.List(ctx, digitalocean.KindApp, 0)
	require.NoError(t, err)
	require.Len(t, all, n)
	require.Equal(t, "app-204", all[n-1].Name)
	some, err := e.res.List(ctx, digitalocean.KindApp, 201)
	require.NoError(t, err)
	require.Len(t, some, 201)
}

// Within the listing lag a lost create is not found by name: the caller
// must wait the lag out before it creates again. Once listed, the
// namespace is found with its key.
func TestLostNamespaceCreateAfterTheLag(t *testing.T) {
	const lag = time.Minute
	e := newEnvWith(t, dofake.Settings{ListLag: lag})
	ctx := context.Background()
	name := cloudresources.ResourceName(owner.ResourceID)
	require.NoError(t, e.fake.Inject(dofake.Fault{Method: "POST", Path: "/v2/functions/namespaces", Kind: dofake.FaultApplyThenStatus, Status: 500}))
	_, err := e.res.Create(ctx, cloudresources.CreateRequest{Kind: digitalocean.KindNamespace, Name: name, Owner: owner, Spec: json.RawMessage(`{"region":"nyc1"}`)})
	require.ErrorIs(t, err, providers.ErrUnavailable)
	lookup := cloudresources.ObserveRequest{Ref: cloudresources.Ref{Kind: digitalocean.KindNamespace}, Name: name, Owner: owner}
	_, err = e.res.Observe(ctx, lookup)
	require.ErrorIs(t, err, providers.ErrNotFound)
	e.clock.Advance(lag)
	found, err := e.res.Observe(ctx, lookup)
	require.NoError(t, err)
	require.NotEmpty(t, found.Secrets["key"])
	require.Equal(t, 1, e.fake.Created(dofake.KindFunctionsNamespaces))
}

// A change behind the owner's back shows in the observed spec.
func TestInferenceDrift(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	created, err := e.res.Create(ctx, cloudresources.CreateRequest{Kind: digitalocean.KindInference, Name: cloudresources.ResourceName(owner.ResourceID),
		Owner: owner, Spec: inferenceSpec(1), Secrets: cloudresources.SecretValues{"secret://vault/hf": "t"}})
	require.NoError(t, err)
	require.Error(t, e.fake.Drift(dofake.DriftRule{Kind: dofake.KindDedicatedInferences, Field: "model_slug", Value: "x"}), "a field not modelled")
	require.Error(t, e.fake.Drift(dofake.DriftRule{Kind: dofake.KindDedicatedInferences, Field: "scale", Value: "two"}), "a value of the wrong type")
	require.NoError(t, e.fake.Drift(dofake.DriftRule{Kind: dofake.KindDedicatedInferences, ID: created.ProviderID, Field: "scale", Value: 4}))
	require.NoError(t, e.fake.Drift(dofake.DriftRule{Kind: dofake.KindDedicatedInferences, ID: created.ProviderID, Field: "enable_public_endpoint", Value: false}))
	got, err := e.res.Observe(ctx, cloudresources.ObserveRequest{Ref: created.Ref})
	require.NoError(t, err)
	var spec map[string]any
	require.NoError(t, json.Unmarshal(got.Spec, &spec))
	require.EqualValues(t, 4, spec["replicas"])
	require.NotContains(t, spec, "enable_public_endpoint")
	require.Empty(t, got.Outputs["publicEndpointFqdn"])
	listed, err := e.res.List(ctx, digitalocean.KindInference, 0)
	require.NoError(t, err)
	require.Equal(t, got.Spec, listed[0].Spec)
}

package dofake_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/digitalocean/godo"

	"github.com/better-compute/better-compute/drivers/providers/dofake"
)

func TestTaggingDatabases(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	db := e.createCluster(t, pgCreate("tagged-pg"))
	res := &godo.TagResourcesRequest{Resources: []godo.Resource{{ID: db.ID, Type: godo.DatabaseResourceType}}}

	if _, err := e.do.Tags.TagResources(ctx, "team:a", res); statusOf(err) != http.StatusNotFound {
		t.Fatalf("tagging with a tag that does not exist: %v, want 404", err)
	}
	if _, _, err := e.do.Tags.Create(ctx, &godo.TagCreateRequest{Name: "team:a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.do.Tags.TagResources(ctx, "team:a", res); err != nil {
		t.Fatalf("tag a database: %v", err)
	}
	// Twice is once.
	if _, err := e.do.Tags.TagResources(ctx, "team:a", res); err != nil {
		t.Fatal(err)
	}
	got, _, err := e.do.Databases.Get(ctx, db.ID)
	if err != nil || !slices.Equal(got.Tags, []string{"team:a"}) {
		t.Fatalf("tags = %v, %v", got.Tags, err)
	}
	if tag, _, err := e.do.Tags.Get(ctx, "team:a"); err != nil || tag.Resources.Databases.Count != 1 || tag.Resources.Count != 1 {
		t.Fatalf("tag = %+v, %v", tag.Resources, err)
	}
	if len(e.taggedClusters(t, "team:a")) != 1 {
		t.Fatal("the tag does not list the cluster")
	}
	missing := &godo.UntagResourcesRequest{Resources: []godo.Resource{{ID: db.ID, Type: godo.DatabaseResourceType}, {ID: "nope", Type: godo.DatabaseResourceType}}}
	if _, err := e.do.Tags.UntagResources(ctx, "team:a", missing); statusOf(err) != http.StatusNotFound {
		t.Fatalf("untag with an unknown database: %v, want 404", err)
	}
	if got, _, _ := e.do.Databases.Get(ctx, db.ID); len(got.Tags) != 1 {
		t.Fatal("a refused untag changed the tags")
	}
	if _, err := e.do.Tags.UntagResources(ctx, "team:a", &godo.UntagResourcesRequest{Resources: res.Resources}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := e.do.Databases.Get(ctx, db.ID); len(got.Tags) != 0 {
		t.Fatalf("tags after untag = %v", got.Tags)
	}
	vol := &godo.TagResourcesRequest{Resources: []godo.Resource{{ID: "v", Type: godo.VolumeResourceType}}}
	if _, err := e.do.Tags.TagResources(ctx, "team:a", vol); statusOf(err) != http.StatusUnprocessableEntity {
		t.Fatalf("tagging a volume: %v, want 422", err)
	}
	// Tags given at create exist, and deleting one untags the cluster.
	db2 := e.createCluster(t, pgCreate("tagged-pg-2", "env:prod"))
	if _, err := e.do.Tags.Delete(ctx, "env:prod"); err != nil {
		t.Fatalf("delete a create's tag: %v", err)
	}
	if got, _, _ := e.do.Databases.Get(ctx, db2.ID); len(got.Tags) != 0 {
		t.Fatalf("tags after the tag's delete = %v", got.Tags)
	}
}

func TestOneClicks(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	for _, tt := range []struct {
		typ  string
		want int
	}{{"droplet", 3}, {"kubernetes", 2}, {"", 5}} {
		list, _, err := e.do.OneClick.List(ctx, tt.typ)
		if err != nil || len(list) != tt.want {
			t.Fatalf("1-clicks of type %q = %d, %v; want %d", tt.typ, len(list), err, tt.want)
		}
		for _, oc := range list {
			if tt.typ != "" && oc.Type != tt.typ || oc.Slug == "" {
				t.Fatalf("1-click %+v under type %q", oc, tt.typ)
			}
		}
	}
}

func TestSignalsArePreview(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	get := func() (int, []map[string]any) {
		req, err := e.do.NewRequest(ctx, http.MethodGet, "v2/gen-ai/signals", nil)
		if err != nil {
			t.Fatal(err)
		}
		var root struct {
			Signals []map[string]any `json:"signals"`
		}
		resp, err := e.do.Do(ctx, req, &root)
		if resp == nil {
			t.Fatal(err)
		}
		return resp.StatusCode, root.Signals
	}
	if status, _ := get(); status != http.StatusForbidden {
		t.Fatalf("signals without previews: %d, want 403", status)
	}
	if err := e.fake.AddSignals(json.RawMessage(`[1]`)); err == nil {
		t.Fatal("a signal that is not an object was added")
	}
	if err := e.fake.AddSignals(json.RawMessage(`{"id":"s1","severity":"warning","title":"a\nb"}`), json.RawMessage(`{"id":"s2"}`)); err != nil {
		t.Fatal(err)
	}
	e.fake.EnablePreviews(token)
	status, list := get()
	if status != http.StatusOK || len(list) != 2 || list[0]["id"] != "s1" || !strings.Contains(list[0]["title"].(string), "\n") {
		t.Fatalf("signals = %d %v: a malformed one must come back as added", status, list)
	}
	e.fake.ClearSignals()
	if _, list := get(); len(list) != 0 {
		t.Fatalf("signals after clear = %v", list)
	}
}

// DigitalOcean answers every namespace at once: godo's ListNamespaces
// sends no page, so a paged answer would hide all but the first 20.
func TestNamespacesAreNotPaged(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	const n = 25
	for i := range n {
		if _, _, err := e.do.Functions.CreateNamespace(ctx, &godo.FunctionsNamespaceCreateRequest{Label: "ns-" + strings.Repeat("x", i+1), Region: "nyc1"}); err != nil {
			t.Fatal(err)
		}
	}
	list, _, err := e.do.Functions.ListNamespaces(ctx)
	if err != nil || len(list) != n {
		t.Fatalf("namespaces = %d, %v; want %d", len(list), err, n)
	}
}

func TestAppSecretsAreAnsweredEncrypted(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	spec := appSpec("vault", 1)
	spec.Envs = []*godo.AppVariableDefinition{{Key: "TOKEN", Value: "plain-token", Type: godo.AppVariableType_Secret}}
	a, _, err := e.do.Apps.Create(ctx, &godo.AppCreateRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	enc := a.Spec.Envs[0].Value
	if !strings.HasPrefix(enc, "EV[") || strings.Contains(enc, "plain-token") {
		t.Fatalf("a secret env is answered as %q", enc)
	}
	// Sent back encrypted, it keeps its value; an encrypted value of
	// nothing known is refused.
	if _, _, err := e.do.Apps.Update(ctx, a.ID, &godo.AppUpdateRequest{Spec: a.Spec}); err != nil {
		t.Fatal(err)
	}
	if v := e.fake.AppSpec(a.ID)["envs"].([]any)[0].(map[string]any)["value"]; v != "plain-token" {
		t.Fatalf("kept value = %v", v)
	}
	a.Spec.Envs[0].Value = "EV[1:made-up]"
	if _, _, err := e.do.Apps.Update(ctx, a.ID, &godo.AppUpdateRequest{Spec: a.Spec}); statusOf(err) != http.StatusUnprocessableEntity {
		t.Fatalf("an unknown encrypted value: %v, want 422", err)
	}
	if e.fake.AppSpec("nope") != nil {
		t.Fatal("an app that does not exist has a spec")
	}
}

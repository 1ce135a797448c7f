package dofake_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/digitalocean/godo"

	"github.com/better-compute/better-compute/drivers/providers/dofake"
)

// TestDriftRewritesOnEveryRead is what a drift-loop breaker meets: the
// client puts the size back, and the next read shows the provider's
// value again.
func TestDriftRewritesOnEveryRead(t *testing.T) {
	e := newEnv(t, dofake.Settings{DatabaseDelay: time.Minute})
	ctx := context.Background()
	db := e.onlineCluster(t, "orders")
	other := e.onlineCluster(t, "other")
	if err := e.fake.Drift(dofake.DriftRule{Kind: dofake.KindDatabases, ID: db.ID, Field: "size", Value: "db-s-2vcpu-4gb"}); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		got, _, err := e.do.Databases.Get(ctx, db.ID)
		if err != nil || got.SizeSlug != "db-s-2vcpu-4gb" {
			t.Fatalf("round %d: size %q, %v; want the drifted size", round, got.SizeSlug, err)
		}
		if _, err := e.do.Databases.Resize(ctx, db.ID, &godo.DatabaseResizeRequest{SizeSlug: "db-s-1vcpu-2gb"}); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(time.Minute)
	}
	if untouched, _, _ := e.do.Databases.Get(ctx, other.ID); untouched.SizeSlug != "db-s-1vcpu-2gb" {
		t.Fatalf("another cluster drifted to %s", untouched.SizeSlug)
	}
	if n := e.fake.Stats().DriftRewrites; n != 3 {
		t.Fatalf("%d rewrites, want 3", n)
	}

	// A rule for every cluster of the kind, on tags, seen in listings.
	if err := e.fake.Drift(dofake.DriftRule{Kind: dofake.KindDatabases, Field: "tags", Value: []string{"changed-by-hand"}}); err != nil {
		t.Fatal(err)
	}
	all, _, err := e.do.Databases.List(ctx, nil)
	if err != nil || len(all) != 2 || !slices.Equal(all[1].Tags, []string{"changed-by-hand"}) {
		t.Fatalf("listed = %+v, %v", all, err)
	}
	e.fake.ClearDrift()
	if _, err := e.do.Databases.Resize(ctx, db.ID, &godo.DatabaseResizeRequest{SizeSlug: "db-s-1vcpu-2gb"}); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	if got, _, _ := e.do.Databases.Get(ctx, db.ID); got.SizeSlug != "db-s-1vcpu-2gb" {
		t.Fatalf("after clearing the drift, size %s", got.SizeSlug)
	}

	for _, bad := range []dofake.DriftRule{
		{Kind: "volumes", Field: "size", Value: 1},
		{Kind: dofake.KindDatabases, Field: "engine", Value: "mysql"},
		{Kind: dofake.KindDatabases, Field: "num_nodes", Value: "three"},
		{Kind: dofake.KindApps, Field: "spec.", Value: 1},
	} {
		if err := e.fake.Drift(bad); err == nil {
			t.Errorf("drift rule %+v accepted", bad)
		}
	}
	if n := len(e.fake.DriftRules()); n != 0 {
		t.Fatalf("%d rules in force", n)
	}
}

func TestDriftOverTheAdminSurface(t *testing.T) {
	e := newEnv(t, dofake.Settings{})
	ctx := context.Background()
	admin := func(method, path, body string, want int) []byte { return e.admin(t, method, path, body, want) }
	var s dofake.Settings
	if err := json.Unmarshal(admin("PATCH", "/_fake/settings", `{"databaseDelay":"2m","deployDelay":"30s"}`, 200), &s); err != nil ||
		s.DatabaseDelay != 2*time.Minute || s.DeployDelay != 30*time.Second {
		t.Fatalf("settings = %+v, %v", s, err)
	}
	a, _, err := e.do.Apps.Create(ctx, &godo.AppCreateRequest{Spec: appSpec("shop", 1)})
	if err != nil {
		t.Fatal(err)
	}
	ns, _, err := e.do.Functions.CreateNamespace(ctx, &godo.FunctionsNamespaceCreateRequest{Label: "jobs", Region: "nyc1"})
	if err != nil {
		t.Fatal(err)
	}
	admin("POST", "/_fake/drift", `[{"kind":"apps","field":"spec.region","value":"fra"},{"kind":"functionsNamespaces","id":"`+ns.Namespace+`","field":"label","value":"renamed"}]`, 200)
	admin("POST", "/_fake/drift", `[{"kind":"apps","field":"spec.region","value":"fra"},{"kind":"databases","field":"size","value":7}]`, 422)
	admin("POST", "/_fake/drift", `{"kind":`, 400)
	var rules []dofake.DriftRule
	if err := json.Unmarshal(admin("GET", "/_fake/drift", "", 200), &rules); err != nil || len(rules) != 2 || rules[1].Value != "renamed" {
		t.Fatalf("rules = %+v, %v", rules, err)
	}
	if got, _, err := e.do.Apps.Get(ctx, a.ID); err != nil || got.Spec.Region != "fra" || got.Region.Slug != "fra" {
		t.Fatalf("drifted app = %+v, %v", got, err)
	}
	if got, _, err := e.do.Functions.GetNamespace(ctx, ns.Namespace); err != nil || got.Label != "renamed" {
		t.Fatalf("drifted namespace = %+v, %v", got, err)
	}
	admin("DELETE", "/_fake/drift", "", 204)
	var stats dofake.Stats
	if err := json.Unmarshal(admin("GET", "/_fake/stats", "", 200), &stats); err != nil || len(e.fake.DriftRules()) != 0 ||
		stats.Created[dofake.KindApps] != 1 || stats.Created[dofake.KindFunctionsNamespaces] != 1 || stats.DriftRewrites != 2 {
		t.Fatalf("stats = %+v, %v", stats, err)
	}
}

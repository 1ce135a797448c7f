package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/iam/policies"
	"github.com/better-compute/better-compute/store"
)

// families is this test's stand-in for a provider's kind manifest.
var families = map[string]string{"postgres": "data", "load-balancer": "network"}

// serveCloudResourceDrafts serves cloudResources.create with a draft that is
// only its authorization row (the module itself comes with its issue): the
// envelope's admission steps are what is under test, decided by the shipped
// "data family only" policy.
func serveCloudResourceDrafts(t testing.TB, e *env) {
	t.Helper()
	ctx := context.Background()
	data, ok := policies.Get("data-cloud-resources")
	if !ok {
		t.Fatal("the data-family example policy is not shipped")
	}
	if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "acme", Name: "data-only", Cedar: data}); err != nil {
		t.Fatal(err)
	}
	api.ServeTestAdmission(e.server, "cloudResources.create",
		func(ctx context.Context, c *api.Call, tx store.Tx, draftID string) (iam.Resource, error) {
			var in struct{ Kind, PoolID string }
			if err := json.Unmarshal(c.Input, &in); err != nil {
				return iam.Resource{}, err
			}
			row := store.AuthzResource{Type: e.catalog.FullName("cloud-resource"), ID: draftID, TenantID: c.TenantID,
				OwnerID: c.Caller.IdentityID, Attributes: map[string]any{"kind": in.Kind, "family": families[in.Kind], "poolId": in.PoolID}}
			return iam.Resource{Type: row.Type, ID: row.ID}, store.PutAuthzResource(ctx, tx, row)
		},
		func(ctx context.Context, c *api.Call, tx store.Tx) (any, error) {
			return map[string]string{"id": c.Resource.ID, "state": "pending"}, nil
		})
}

func createBody(key, kind string) string {
	pool := "pool_01hzzzzzzzzzzzzzzzzzzzzzzz"
	return `{"tenantId":"acme","poolId":"` + pool + `","kind":"` + kind + `","name":"db1","spec":{},"idempotencyKey":"` + key + `"}`
}

func TestAdmissionDecidesOnTheDraftAndReplaysWithoutADecision(t *testing.T) {
	e := newEnv(t)
	serveCloudResourceDrafts(t, e)
	e.outer.reset()
	status, first := e.call(e.stranger, "cloudResources.create", createBody("k1", "postgres"))
	if status != 200 {
		t.Fatalf("create = %d %s", status, first)
	}
	if r, q := e.outer.require.Load(), e.outer.refresh.Load(); r != 1 || q != 1 {
		t.Fatalf("first admission: %d require, %d refresh; want 1, 1", r, q)
	}
	var out map[string]string
	_ = json.Unmarshal([]byte(first), &out)
	caller, _ := e.outer.Authenticate(context.Background(), iam.Credential{Authorization: "Bearer " + e.stranger})
	if want := core.DerivedID("crs", "acme", caller.IdentityID, "k1"); out["id"] != want {
		t.Fatalf("draft id %s, want the derived %s", out["id"], want)
	}

	e.outer.reset()
	status, again := e.call(e.stranger, "cloudResources.create", createBody("k1", "postgres"))
	if status != 200 || again != first {
		t.Fatalf("replay = %d %s, want the stored %s", status, again, first)
	}
	if n := e.outer.decisions(); n != 0 {
		t.Fatalf("the replay made %d decisions", n)
	}
	status, body := e.call(e.stranger, "cloudResources.create", createBody("k1", "load-balancer"))
	if status != 409 || !strings.Contains(body, "CONFLICT") {
		t.Fatalf("same key, other body = %d %s", status, body)
	}
	var audits int
	if err := e.store.Pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_events WHERE method = 'cloudResources.create'`).Scan(&audits); err != nil || audits != 1 {
		t.Fatalf("audit rows = %d, %v; want 1", audits, err)
	}
}

func TestAdmissionPolicyDeniesTheWrongFamily(t *testing.T) {
	e := newEnv(t)
	serveCloudResourceDrafts(t, e)
	status, body := e.call(e.stranger, "cloudResources.create", createBody("k2", "load-balancer"))
	if status != 403 || !strings.Contains(body, "ACCESS_DENIED") {
		t.Fatalf("network-family create = %d %s", status, body)
	}
}

// A failure between transaction 1 and the decision leaves a prepared draft;
// the retry decides on that same draft and completes once.
func TestAdmissionRetryAfterAFailedDecision(t *testing.T) {
	e := newEnv(t)
	serveCloudResourceDrafts(t, e)
	e.outer.failRequire.Store(true)
	if status, body := e.call(e.stranger, "cloudResources.create", createBody("k3", "postgres")); status != 503 {
		t.Fatalf("create with IAM down = %d %s", status, body)
	}
	status, body := e.call(e.stranger, "cloudResources.create", createBody("k3", "postgres"))
	if status != 200 {
		t.Fatalf("retry = %d %s", status, body)
	}
	var drafts, keys int
	ctx := context.Background()
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM authz_resources WHERE type = 'compute-cloud-resource'`).Scan(&drafts); err != nil || drafts != 1 {
		t.Fatalf("drafts = %d, %v; want 1", drafts, err)
	}
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE result IS NOT NULL`).Scan(&keys); err != nil || keys != 1 {
		t.Fatalf("completed keys = %d, %v; want 1", keys, err)
	}
}

// The decision reads the draft as transaction 1 wrote it, never the copy
// the projection held before: the refresh comes first.
func TestAdmissionNeverDecidesOnAStaleCopy(t *testing.T) {
	e := newEnv(t)
	serveCloudResourceDrafts(t, e)
	ctx := context.Background()
	caller, err := e.outer.Authenticate(ctx, iam.Credential{Authorization: "Bearer " + e.stranger})
	if err != nil {
		t.Fatal(err)
	}
	// The projection holds an allowed copy of the very draft the next call
	// prepares (same derived id), as a tail interval would leave it.
	id := core.DerivedID("crs", "acme", caller.IdentityID, "k4")
	res := iam.Resource{Type: e.catalog.FullName("cloud-resource"), ID: id}
	stale := store.AuthzResource{Type: res.Type, ID: id, TenantID: "acme", Attributes: map[string]any{"family": "data", "kind": "postgres"}}
	if err := e.store.InTx(ctx, store.ReadWrite, func(tx store.Tx) error { return store.PutAuthzResource(ctx, tx, stale) }); err != nil {
		t.Fatal(err)
	}
	if d, err := e.outer.Authorize(ctx, iam.Request{Caller: caller, TenantID: "acme", Action: "compute:cloud-resources:read", Resource: res}); err != nil {
		t.Fatalf("loading the stale copy: %v %v", d, err)
	}
	status, body := e.call(e.stranger, "cloudResources.create", createBody("k4", "load-balancer"))
	if status != 403 {
		t.Fatalf("create decided on the stale copy: %d %s", status, body)
	}
}

package api_test

import (
	"context"
	"github.com/better-compute/better-compute/api/projects"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/deploy/postgres"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/controlplane"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
)

// refreshSecret signs refreshes from the API to the IAM host in these tests.
var refreshSecret = []byte("a-test-refresh-secret-of-32-bytes!!")

// newRemoteEnv is env with the IAM remote: the API decides through an IAM
// host over real HTTP, and the host reads compute's tables from a streaming
// replica of the API's database (IAM's own tables stay on the primary).
func newRemoteEnv(t testing.TB, withRefresh bool) (*env, *postgres.Cluster, *store.Store) {
	t.Helper()
	ctx := context.Background()
	e := newEnv(t) // bootstraps IAM on the primary and serves the embedded API
	replica := testenv.Replica(t)
	replicaStore, err := store.Open(ctx, testenv.ReplicaURL(t, e.dbURL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(replicaStore.Close)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	host, err := controlplane.NewHost(ctx, controlplane.HostConfig{
		IAMStore: e.store, ComputeStore: replicaStore, RefreshSecret: refreshSecret, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(host.Close)
	hostSrv := httptest.NewServer(host.Handler)
	t.Cleanup(hostSrv.Close)

	rc := iam.RemoteConfig{BaseURL: hostSrv.URL}
	if withRefresh {
		rc.Refresh = &iam.RemoteRefresh{Secret: refreshSecret, PrimaryLSN: e.store.WALPosition}
	}
	remote, err := iam.NewRemotePort(rc)
	if err != nil {
		t.Fatal(err)
	}
	e.cache = iam.NewCachingPort(remote, iam.CacheOptions{})
	e.outer = &countingPort{inner: e.cache.Port()}
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e.server = srv
	apiSrv := httptest.NewServer(srv)
	t.Cleanup(apiSrv.Close)
	e.url = apiSrv.URL
	return e, replica, replicaStore
}

// An admission through the remote port sees its draft on the host's replica:
// the signed refresh waits until the replica has replayed transaction 1.
func TestRemoteAdmissionSeesTheDraftOnTheReplica(t *testing.T) {
	e, _, _ := newRemoteEnv(t, true)
	serveCloudResourceDrafts(t, e)
	for i, c := range []struct {
		kind   string
		status int
	}{{"postgres", 200}, {"load-balancer", 403}} {
		status, body := e.call(e.stranger, "cloudResources.create", createBody("r"+string(rune('0'+i)), c.kind))
		if status != c.status {
			t.Fatalf("%s through the remote IAM = %d %s, want %d", c.kind, status, body, c.status)
		}
	}
	if n := e.outer.refresh.Load(); n != 2 {
		t.Fatalf("%d refreshes, want one per admission", n)
	}
}

// With the replica's replay paused, the refresh cannot see transaction 1:
// the admission fails UNAVAILABLE (closed) instead of deciding on nothing,
// and once replay resumes the retry with the same key finishes the draft.
func TestRemoteAdmissionFailsClosedWhileTheReplicaLags(t *testing.T) {
	e, replica, _ := newRemoteEnv(t, true)
	serveCloudResourceDrafts(t, e)
	ctx := context.Background()
	if err := replica.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.ResumeReplay(context.Background()) })
	status, body := e.call(e.stranger, "cloudResources.create", createBody("lag", "postgres"))
	if status != 503 || !strings.Contains(body, "UNAVAILABLE") {
		t.Fatalf("admission with replay paused = %d %s, want 503 UNAVAILABLE", status, body)
	}
	if err := replica.ResumeReplay(ctx); err != nil {
		t.Fatal(err)
	}
	status, body = e.call(e.stranger, "cloudResources.create", createBody("lag", "postgres"))
	if status != 200 {
		t.Fatalf("retry after replay resumed = %d %s", status, body)
	}
	var drafts int
	if err := e.store.Pool.QueryRow(ctx, `SELECT count(*) FROM authz_resources WHERE type = 'compute-cloud-resource'`).Scan(&drafts); err != nil || drafts != 1 {
		t.Fatalf("drafts = %d, %v; want the one the retry finished", drafts, err)
	}
}

// A client's own X-Forwarded-For cannot choose the address policies see:
// the API sends IAM only the socket peer it verified.
func TestRemoteSourceIPCannotBeSpoofed(t *testing.T) {
	e, _, replica := newRemoteEnv(t, true)
	ctx := context.Background()
	p, err := projects.Create.Call(ctx, e.client(e.boot.UserToken), projects.CreateInput{TenantID: "acme", Name: "internal"})
	if err != nil {
		t.Fatal(err)
	}
	// Reads decide on the replica's copy (no refresh): wait, bounded, for it.
	testutil.Eventually(t, time.Minute, "the project to reach the replica", func() bool {
		var n int
		err := replica.Pool.QueryRow(ctx, `SELECT count(*) FROM authz_resources WHERE id = $1`, p.ID).Scan(&n)
		return err == nil && n == 1
	})
	policy := `permit (principal, action == Action::"compute:projects:read", resource is Resource)
when { context has sourceIp && context.sourceIp.isInRange(ip("10.0.0.0/8")) };`
	if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "acme", Name: "office-only", Cedar: policy}); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, e.url+"/api/compute/projects/get",
		strings.NewReader(`{"tenantId":"acme","projectId":"`+p.ID+`"}`))
	req.Header.Set("Authorization", "Bearer "+e.stranger)
	for _, h := range []string{"X-Forwarded-For", "X-Real-Ip"} {
		req.Header.Set(h, "10.1.2.3")
	}
	req.Header.Set("Forwarded", "for=10.1.2.3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a spoofed 10.1.2.3 got %d; the policy must see the real peer 127.0.0.1", resp.StatusCode)
	}
	// The same policy for the real peer allows: the address does reach IAM.
	policy = strings.Replace(policy, "10.0.0.0/8", "127.0.0.1/32", 1)
	if _, err := e.admin.PutPolicy(ctx, iam.PutPolicyInput{TenantID: "acme", Name: "office-only", Cedar: policy}); err != nil {
		t.Fatal(err)
	}
	if _, err := projects.Get.Call(ctx, e.client(e.stranger), projects.ProjectInput{TenantID: "acme", ProjectID: p.ID}); err != nil {
		t.Fatalf("the real peer is refused: %v", err)
	}
}

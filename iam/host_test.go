package iam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam/policies"
	"github.com/better-compute/better-compute/store"
)

var testRefreshSecret = []byte("0123456789abcdef0123456789abcdef-refresh")

// walLSN reads the database's current WAL position (the compute primary's,
// and here also the "replica's": one database plays both).
func walLSN(s *store.Store) func(context.Context) (LSN, error) {
	return func(ctx context.Context) (LSN, error) {
		var txt string
		if err := s.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&txt); err != nil {
			return 0, err
		}
		return store.ParseLSN(txt)
	}
}

// refreshEnv is an IAM host whose embedded IAM resolves through a loaded
// projection of the same database, with signed refresh, and a remote port
// with refresh to it. acme has the example policies; alice is a user of
// pool_1 and owns rsv_1 (24 hours) in the database.
type refreshEnv struct {
	*embTestEnv
	proj   *Projection
	srv    *httptest.Server
	remote Port
	caller *Caller
}

func newRefreshEnv(t *testing.T, replica func(context.Context) (LSN, error), wait time.Duration) *refreshEnv {
	t.Helper()
	env := &refreshEnv{embTestEnv: newEmbTestEnv(t)}
	env.proj = NewProjection(env.db, ProjectionOptions{Catalog: env.cat})
	res, err := NewProjectionResolver(ProjectionResolverConfig{Projection: env.proj, Catalog: env.cat, RootTenant: DefaultRootTenantID})
	if err != nil {
		t.Fatal(err)
	}
	emb := env.newEmbedded(EmbeddedConfig{Resolver: res})
	env.tenant("acme")
	for _, ex := range policies.All() {
		env.policy("acme", ex.Name, ex.Cedar)
	}
	alice := env.identity("acme", KindPerson, "alice", false)
	env.relate(alice, "user", "compute-pool", "pool_1")
	tok := env.token(alice, SessionUser, false)
	put(t, env.db, store.AuthzResource{Type: "compute-pool", ID: "pool_1", TenantID: "acme"},
		env.rsv(24))
	mustLoad(t, env.proj)

	if replica == nil {
		replica = walLSN(env.db)
	}
	h, err := HostHandler(HostConfig{Port: NewCachingPort(emb, CacheOptions{}).Port(), Projection: env.proj,
		ReplicaLSN: replica, RefreshSecret: testRefreshSecret, RefreshWait: wait, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	env.srv = httptest.NewServer(h)
	t.Cleanup(env.srv.Close)
	env.remote, err = NewRemotePort(RemoteConfig{BaseURL: env.srv.URL,
		Refresh: &RemoteRefresh{Secret: testRefreshSecret, PrimaryLSN: walLSN(env.db)}})
	if err != nil {
		t.Fatal(err)
	}
	if env.caller, err = env.remote.Authenticate(env.ctx, Credential{Authorization: "Bearer " + tok.Token}); err != nil {
		t.Fatal(err)
	}
	return env
}

func (env *refreshEnv) rsv(hours float64) store.AuthzResource {
	return store.AuthzResource{Type: "compute-reservation", ID: "rsv_1", TenantID: "acme",
		ParentType: "compute-pool", ParentID: "pool_1", Attributes: map[string]any{"durationHours": hours}}
}

func (env *refreshEnv) extend() error {
	return env.remote.Require(env.ctx, Request{Caller: env.caller, TenantID: "acme", Action: "compute:reservations:extend",
		Resource: Resource{Type: "compute-reservation", ID: "rsv_1"}})
}

// hours is what the host's projection holds for rsv_1 (-1: nothing).
func (env *refreshEnv) hours() float64 {
	e, ok := peek(env.proj, "compute-reservation", "rsv_1")
	if !ok {
		return -1
	}
	h, _ := e.attributes["durationHours"].(float64)
	return h
}

var rsv1 = Resource{Type: "compute-reservation", ID: "rsv_1"}

// TestRemoteRefresh: a signed refresh whose LSN the replica has reached
// re-reads the row, so the admission decides on the committed row (the
// bounded-extend case of the spec).
func TestRemoteRefresh(t *testing.T) {
	env := newRefreshEnv(t, nil, 0)
	if err := env.extend(); err != nil {
		t.Fatalf("24 hours: %v", err)
	}
	put(t, env.db, env.rsv(100)) // an extension committed (transaction 1)
	if err := env.extend(); err != nil || env.hours() != 24 {
		t.Fatalf("before the refresh the host decides on its copy (%v hours): %v", env.hours(), err)
	}
	if err := env.remote.(Refresher).RefreshResource(env.ctx, "acme", rsv1); err != nil {
		t.Fatal(err)
	}
	if env.hours() != 100 {
		t.Fatalf("after the refresh the host holds %v hours", env.hours())
	}
	if err := env.extend(); !errors.Is(err, core.ErrAccessDenied) {
		t.Fatalf("100 hours after the refresh: %v", err)
	}

	// Through the API's cache.
	put(t, env.db, env.rsv(48))
	if err := NewCachingPort(env.remote, CacheOptions{}).Port().(Refresher).RefreshResource(env.ctx, "acme", rsv1); err != nil {
		t.Fatal(err)
	}
	if env.hours() != 48 {
		t.Fatalf("after a refresh through the cache: %v hours", env.hours())
	}
	// A row that is gone stays dropped (the next decision reads the miss
	// path: NOT_FOUND).
	del(t, env.db, "compute-reservation", "rsv_1")
	if err := env.remote.(Refresher).RefreshResource(env.ctx, "acme", rsv1); err != nil {
		t.Fatal(err)
	}
	if env.hours() != -1 {
		t.Fatal("a deleted row is still held")
	}
	if err := env.extend(); !errors.Is(err, core.ErrNotFound) {
		t.Fatalf("a deleted reservation: %v", err)
	}
}

// TestRemoteRefreshReplicaBehind: a replica that never reaches the LSN fails
// the refresh UNAVAILABLE after RefreshWait, without touching the row.
func TestRemoteRefreshReplicaBehind(t *testing.T) {
	behind := func(context.Context) (LSN, error) { return 1, nil }
	env := newRefreshEnv(t, behind, 200*time.Millisecond)
	put(t, env.db, env.rsv(100))
	err := env.remote.(Refresher).RefreshResource(env.ctx, "acme", rsv1)
	if !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("a replica behind: %v", err)
	}
	if env.hours() != 24 {
		t.Fatalf("the row was refreshed: %v hours", env.hours())
	}

	// A replica whose position cannot be read fails the same way.
	broken := newRefreshEnv(t, func(context.Context) (LSN, error) { return 0, errors.New("replica down") }, 200*time.Millisecond)
	if err := broken.remote.(Refresher).RefreshResource(broken.ctx, "acme", rsv1); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("a replica that cannot answer: %v", err)
	}
	// And so does a primary whose position cannot be read: no call at all.
	port, err := NewRemotePort(RemoteConfig{BaseURL: env.srv.URL, Refresh: &RemoteRefresh{Secret: testRefreshSecret,
		PrimaryLSN: func(context.Context) (LSN, error) { return 0, errors.New("primary down") }}})
	if err != nil {
		t.Fatal(err)
	}
	if err := port.(Refresher).RefreshResource(env.ctx, "acme", rsv1); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("a primary that cannot answer: %v", err)
	}
}

// TestRemoteRefreshSignature: unsigned, wrongly signed, stale or future
// refreshes are refused and the projection is not refreshed.
func TestRemoteRefreshSignature(t *testing.T) {
	env := newRefreshEnv(t, nil, 0)
	put(t, env.db, env.rsv(100))
	lsn, err := walLSN(env.db)(env.ctx)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(wireRefresh{TenantID: "acme", Type: rsv1.Type, ID: rsv1.ID, LSN: lsn})
	refreshes := func() uint64 { return env.proj.Stats().Refreshes }
	before := refreshes()

	post := func(body []byte, sig ...string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, env.srv.URL+HostPathRefresh, strings.NewReader(string(body)))
		for _, s := range sig {
			req.Header.Add(RefreshSignatureHeader, s)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var we wireError
		data, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(data, &we)
		code := ""
		if we.Error != nil {
			code = string(we.Error.Code)
		}
		return resp.StatusCode, code
	}
	now := time.Now()
	good := signRefresh(testRefreshSecret, now, body)
	_, mac, _ := strings.Cut(good, ",")
	for _, tc := range []struct {
		name   string
		body   []byte
		sig    []string
		status int
	}{
		{"unsigned", body, nil, 401},
		{"empty", body, []string{""}, 401},
		{"no timestamp", body, []string{mac}, 401},
		{"not hex", body, []string{"t=1,v1=zz"}, 401},
		{"short", body, []string{"t=1,v1=00"}, 401},
		{"two signatures", body, []string{good, good}, 401},
		{"another secret", body, []string{signRefresh([]byte(strings.Repeat("x", 40)), now, body)}, 403},
		{"another body", []byte(strings.Replace(string(body), "rsv_1", "rsv_2", 1)), []string{good}, 403},
		{"another timestamp", body, []string{strings.Replace(good, "t=", "t=1", 1)}, 403},
		{"stale", body, []string{signRefresh(testRefreshSecret, now.Add(-RefreshMaxSkew-time.Minute), body)}, 403},
		{"future", body, []string{signRefresh(testRefreshSecret, now.Add(RefreshMaxSkew+time.Minute), body)}, 403},
	} {
		status, code := post(tc.body, tc.sig...)
		if status != tc.status || code != string(map[int]core.Code{401: core.CodeUnauthn, 403: core.CodeAccessDenied}[tc.status]) {
			t.Fatalf("%s: %d %s, want %d", tc.name, status, code, tc.status)
		}
	}
	if refreshes() != before || env.hours() != 24 {
		t.Fatalf("a refused refresh refreshed the projection (%d refreshes, %v hours)", refreshes()-before, env.hours())
	}

	// A signed body that is not a refresh is INVALID_INPUT.
	for _, bad := range []string{`{"tenantId":"acme","type":"compute-reservation","id":"rsv_1"}`,
		`{"tenantId":"acme","type":"compute-reservation","id":"rsv_1","lsn":"nope"}`,
		`{"tenantId":"acme","type":"compute-reservation","id":"rsv_1","lsn":"0/1","caller":{}}`,
		`{"type":"compute-reservation","id":"rsv_1","lsn":"0/1"}`} {
		if status, code := post([]byte(bad), signRefresh(testRefreshSecret, time.Now(), []byte(bad))); status != 400 || code != "INVALID_INPUT" {
			t.Fatalf("%s: %d %s", bad, status, code)
		}
	}
	if refreshes() != before {
		t.Fatal("a bad body refreshed the projection")
	}

	// The port with another secret fails closed.
	port, err := NewRemotePort(RemoteConfig{BaseURL: env.srv.URL,
		Refresh: &RemoteRefresh{Secret: []byte(strings.Repeat("y", MinRefreshSecret)), PrimaryLSN: walLSN(env.db)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := port.(Refresher).RefreshResource(env.ctx, "acme", rsv1); !errors.Is(err, core.ErrUnavailable) {
		t.Fatalf("another secret: %v", err)
	}
	if refreshes() != before || env.hours() != 24 {
		t.Fatal("a refresh with another secret refreshed the projection")
	}

	// The good one.
	if status, code := post(body, good); status != 200 || env.hours() != 100 {
		t.Fatalf("signed: %d %s, %v hours", status, code, env.hours())
	}
}

func TestHostHandler(t *testing.T) {
	env := newRemoteEnv(t, HostConfig{})
	aliceTok, _ := env.acme()
	call := func(method, path, auth, body string) (int, string) {
		req, _ := http.NewRequest(method, env.srv.URL+path, strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	bearer := "Bearer " + aliceTok.Token
	ok := `{"tenantId":"acme","action":"compute:reservations:create","resource":{"type":"compute-reservation","id":"rsv_ok"}}`
	for _, tc := range []struct {
		name, method, path, auth, body string
		status                         int
		code                           core.Code
	}{
		{"GET", http.MethodGet, HostPathAuthorize, bearer, ok, 405, core.CodeInvalidInput},
		{"unknown method", http.MethodPost, HostPathPrefix + "nope", bearer, ok, 404, core.CodeNotFound},
		{"no credential", http.MethodPost, HostPathAuthorize, "", ok, 401, core.CodeUnauthn},
		{"a bad credential", http.MethodPost, HostPathRequire, "Bearer bc_nope", ok, 401, core.CodeUnauthn},
		// A caller in the body is refused: the host decides for the
		// credential it authenticated.
		{"a caller in the body", http.MethodPost, HostPathAuthorize, bearer,
			`{"tenantId":"acme","action":"compute:reservations:create","resource":{"type":"compute-reservation","id":"rsv_ok"},"caller":{"identityId":"idn_x"}}`,
			400, core.CodeInvalidInput},
		{"an identity in a batch", http.MethodPost, HostPathAuthorizeMany, bearer,
			`{"requests":[{"tenantId":"acme","action":"a","resource":{"type":"t","id":"i"},"identityId":"idn_x"}]}`,
			400, core.CodeInvalidInput},
		{"two values", http.MethodPost, HostPathAuthorize, bearer, ok + ok, 400, core.CodeInvalidInput},
		{"not JSON", http.MethodPost, HostPathAuthorize, bearer, `nope`, 400, core.CodeInvalidInput},
		{"too big", http.MethodPost, HostPathAuthorize, bearer, `{"context":{"x":"` + strings.Repeat("x", MaxHostBody) + `"}}`, 400, core.CodeInvalidInput},
		{"denied", http.MethodPost, HostPathRequire, bearer, strings.Replace(ok, "rsv_ok", "rsv_big", 1), 403, core.CodeAccessDenied},
		{"not found", http.MethodPost, HostPathRequire, bearer, strings.Replace(ok, "rsv_ok", "rsv_absent", 1), 404, core.CodeNotFound},
		{"refresh not configured", http.MethodPost, HostPathRefresh, "", `{}`, 503, core.CodeUnavailable},
	} {
		status, body := call(tc.method, tc.path, tc.auth, tc.body)
		var we wireError
		if status != tc.status || json.Unmarshal([]byte(body), &we) != nil || we.Error == nil || we.Error.Code != tc.code {
			t.Fatalf("%s: %d %s", tc.name, status, body)
		}
		if tc.code == core.CodeAccessDenied && (we.Error.Message != "access denied" || len(we.Error.Details) > 0) {
			t.Fatalf("%s: a denial that is not opaque: %s", tc.name, body)
		}
	}
	// Allowed.
	if status, body := call(http.MethodPost, HostPathRequire, bearer, ok); status != 200 || strings.TrimSpace(body) != `{"ok":true}` {
		t.Fatalf("require: %d %s", status, body)
	}
	if status, body := call(http.MethodPost, HostPathAuthorizeMany, bearer, `{"requests":[]}`); status != 200 || strings.TrimSpace(body) != `{"decisions":[]}` {
		t.Fatalf("empty batch: %d %s", status, body)
	}
	// Integers in a context keep every digit (json.Number).
	big := fmt.Sprintf(`{"tenantId":"acme","action":"compute:reservations:create","resource":{"type":"compute-reservation","id":"rsv_ok"},"context":{"n":%d}}`, int64(1)<<62+1)
	if status, body := call(http.MethodPost, HostPathAuthorize, bearer, big); status != 200 {
		t.Fatalf("a big integer: %d %s", status, body)
	}
}

func TestHostConfig(t *testing.T) {
	p := &Projection{}
	lsn := func(context.Context) (LSN, error) { return 1, nil }
	port := NewCachingPort(nil, CacheOptions{})
	for _, cfg := range []HostConfig{
		{},
		{Port: port, RefreshSecret: []byte("short"), Projection: p, ReplicaLSN: lsn},
		{Port: port, RefreshSecret: testRefreshSecret, ReplicaLSN: lsn},
		{Port: port, RefreshSecret: testRefreshSecret, Projection: p},
	} {
		if _, err := HostHandler(cfg); !errors.Is(err, core.ErrInvalidConfig) {
			t.Fatalf("%+v: %v", cfg, err)
		}
	}
	if _, err := HostHandler(HostConfig{Port: port}); err != nil {
		t.Fatalf("without refresh: %v", err)
	}
}

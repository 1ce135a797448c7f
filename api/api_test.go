package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func newTestServer(t *testing.T, deps Deps) *httptest.Server {
	t.Helper()
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	srv := httptest.NewServer(New(deps))
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, base, path, body string, header http.Header) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return resp.StatusCode, out
}

func code(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func TestCallErrors(t *testing.T) {
	srv := newTestServer(t, Deps{})
	big := `{"x":"` + strings.Repeat("a", maxBody) + `"}`
	cases := []struct {
		name, path, body string
		header           http.Header
		status           int
		code             string
	}{
		{"public method, empty body", "/api/compute/system/version", ``, nil, 200, ""},
		{"unknown field", "/api/compute/system/version", `{"a":1}`, nil, 400, "INVALID_INPUT"},
		{"trailing data", "/api/compute/system/version", `{} {}`, nil, 400, "INVALID_INPUT"},
		{"body too large", "/api/compute/system/version", big, nil, 400, "INVALID_INPUT"},
		{"unknown method", "/api/compute/nope/nope", `{}`, nil, 404, "NOT_FOUND"},
		{"unknown route", "/api/other", `{}`, nil, 404, "NOT_FOUND"},
		{"bogus bearer", "/api/compute/system/whoami", `{}`, http.Header{"Authorization": {"Bearer x"}}, 401, "UNAUTHENTICATED"},
		{"bogus cookie", "/api/compute/system/whoami", `{}`, http.Header{"Cookie": {iamCookie + "=x"}}, 401, "UNAUTHENTICATED"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := post(t, srv.URL, c.path, c.body, c.header)
			if status != c.status || code(body) != c.code {
				t.Fatalf("= %d %v, want %d %q", status, body, c.status, c.code)
			}
		})
	}
}

// fixedAuth accepts one token: a stand-in for the IAM port in this test only.
type fixedAuth struct{ token string }

func (a fixedAuth) Authenticate(_ context.Context, cred Credential) (*Principal, error) {
	if cred.Authorization == "Bearer "+a.token {
		return &Principal{TenantID: "acme", IdentityID: "idn_1", Kind: "person", SessionKind: "user"}, nil
	}
	return nil, core.Errorf(core.CodeUnauthn, "the credential is not valid")
}

func TestWhoamiReportsTheAuthenticatedCaller(t *testing.T) {
	srv := newTestServer(t, Deps{Authenticator: fixedAuth{token: "good"}})
	status, body := post(t, srv.URL, "/api/compute/system/whoami", `{}`, http.Header{"Authorization": {"Bearer good"}})
	if status != 200 || body["authenticated"] != true || body["tenantId"] != "acme" {
		t.Fatalf("whoami = %d %v", status, body)
	}
}

func TestInProcessCallMatchesHTTP(t *testing.T) {
	s := New(Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	out, err := s.Call(context.Background(), Credential{}, "system.version", nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := out.(VersionOutput); !ok || v.API != APIVersion {
		t.Fatalf("Call(system.version) = %#v", out)
	}
	_, err = s.Call(context.Background(), Credential{}, "system.version", json.RawMessage(`{"x":1}`))
	if e := core.AsError(err); e.Code != core.CodeInvalidInput || e.Details["field"] != "x" {
		t.Fatalf("Call with an unknown field = %v", err)
	}
}

// Without a reachable Temporal the health check answers 503 and says which
// dependency failed; the database check still runs for real.
func TestHealthReportsAFailedDependency(t *testing.T) {
	srv := newTestServer(t, Deps{Store: testenv.Store(t)})
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h Health
	raw, _ := io.ReadAll(resp.Body)
	if err := json.NewDecoder(bytes.NewReader(raw)).Decode(&h); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || h.Status != "degraded" ||
		!h.Checks["database"].OK || h.Checks["temporal"].OK || h.Checks["temporal"].Error == "" {
		t.Fatalf("healthz = %d %s", resp.StatusCode, raw)
	}
}

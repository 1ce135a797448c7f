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
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func newTestServer(t *testing.T, deps Deps) *httptest.Server {
	t.Helper()
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := New(deps)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
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
		{"bogus cookie", "/api/compute/system/whoami", `{}`, http.Header{"Cookie": {iam.SessionCookie + "=x"},
			iam.CSRFHeader: {iam.CSRFToken("x")}}, 401, "UNAUTHENTICATED"},
		{"cookie without its CSRF token", "/api/compute/system/whoami", `{}`, http.Header{"Cookie": {iam.SessionCookie + "=x"}}, 403, "ACCESS_DENIED"},
		{"cookie with another's CSRF token", "/api/compute/system/whoami", `{}`, http.Header{"Cookie": {iam.SessionCookie + "=x"},
			iam.CSRFHeader: {iam.CSRFToken("y")}}, 403, "ACCESS_DENIED"},
		{"no credential", "/api/compute/projects/list", `{"tenantId":"acme"}`, nil, 401, "UNAUTHENTICATED"},
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

func TestInProcessCallMatchesHTTP(t *testing.T) {
	s, err := New(Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.Call(context.Background(), iam.Credential{}, "system.version", nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := out.(VersionOutput); !ok || v.API != APIVersion {
		t.Fatalf("Call(system.version) = %#v", out)
	}
	_, err = s.Call(context.Background(), iam.Credential{}, "system.version", json.RawMessage(`{"x":1}`))
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

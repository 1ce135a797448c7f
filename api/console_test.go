package api_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/console"
	"github.com/better-compute/better-compute/iam"
)

// The console's sign-in keeps the token in a Secure, HttpOnly,
// SameSite=Strict cookie only when the form comes from the console's own
// origin, and a page shell carries the cookie's CSRF token (the browser
// tests, e2e.TestConsole, drive the pages themselves).
func TestConsoleSignIn(t *testing.T) {
	e := newEnv(t)
	web, err := console.New(console.Config{IAM: e.outer, RootTenant: api.DefaultRootTenant})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Console: web})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	login := func(origin, token string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/console/login", strings.NewReader(url.Values{"token": {token}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		switch origin {
		case "":
		case "cross-site":
			req.Header.Set("Sec-Fetch-Site", "cross-site")
			req.Header.Set("Origin", hs.URL) // a forged Origin does not outweigh the browser's own header
		default:
			req.Header.Set("Origin", origin)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for name, c := range map[string]struct {
		origin, token string
		status        int
	}{
		"another site's form": {"https://evil.example", e.boot.UserToken, http.StatusForbidden},
		"no origin":           {"", e.boot.UserToken, http.StatusForbidden},
		"a cross-site fetch":  {"cross-site", e.boot.UserToken, http.StatusForbidden},
		"a bogus token":       {hs.URL, "bc_bogus", http.StatusUnauthorized},
	} {
		if resp := login(c.origin, c.token); resp.StatusCode != c.status || len(resp.Cookies()) != 0 {
			t.Errorf("%s: %d with %d cookies, want %d and none", name, resp.StatusCode, len(resp.Cookies()), c.status)
		}
	}
	resp := login(hs.URL, e.boot.UserToken)
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || len(cookies) != 1 {
		t.Fatalf("sign in = %d, cookies %v", resp.StatusCode, cookies)
	}
	ck := cookies[0]
	if ck.Name != iam.SessionCookie || ck.Value != e.boot.UserToken || !ck.HttpOnly || !ck.Secure || ck.SameSite != http.SameSiteStrictMode {
		t.Fatalf("cookie %+v", ck)
	}
	req, _ := http.NewRequest(http.MethodGet, hs.URL+"/console/nodes", nil)
	req.AddCookie(ck)
	page, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(page.Body)
	page.Body.Close()
	csp := page.Header.Get("Content-Security-Policy")
	if page.StatusCode != 200 || !strings.Contains(string(body), `<meta name="bc-csrf" content="`+iam.CSRFToken(ck.Value)+`">`) ||
		!strings.Contains(string(body), `content="acme"`) || strings.Contains(string(body), e.boot.UserToken) ||
		!strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Fatalf("page = %d, CSP %q:\n%s", page.StatusCode, csp, body)
	}
	// A tenant's navigation has no operator page.
	if strings.Contains(string(body), `href="/console/sites"`) {
		t.Fatal("a tenant's navigation lists the operator's pages")
	}
}

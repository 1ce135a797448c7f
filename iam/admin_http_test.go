package iam

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAdminHandler(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	rootAdmin := env.identity("root", KindPerson, "admin", true)
	rootPlain := env.identity("root", KindPerson, "plain", false)
	acmeUser := env.identity("acme", KindPerson, "alice", false)
	adminTok := env.token(rootAdmin, SessionUser, true).Token
	plainTok := env.token(rootPlain, SessionUser, true).Token
	acmeTok := env.token(acmeUser, SessionUser, false).Token
	srv := httptest.NewServer(AdminHandler(env.admin, env.iam))
	defer srv.Close()

	type answer struct {
		status int
		body   map[string]any
	}
	call := func(t *testing.T, method, path, token, cookie, body string) answer {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: SessionCookie, Value: cookie})
			if !strings.Contains(path, "nocsrf") {
				req.Header.Set(CSRFHeader, CSRFToken(cookie))
			}
		}
		req.Header.Set("X-Request-Id", "req-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Fatalf("content type %q", ct)
		}
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return answer{resp.StatusCode, out}
	}
	errCode := func(a answer) string {
		e, _ := a.body["error"].(map[string]any)
		c, _ := e["code"].(string)
		return c
	}

	tests := []struct {
		name          string
		method, path  string
		token, cookie string
		body          string
		status        int
		code          string
	}{
		{"no credential", "POST", "/api/iam/createTenant", "", "", `{"id":"t1","name":"T1"}`, 401, "UNAUTHENTICATED"},
		{"a bad token", "POST", "/api/iam/createTenant", "bc_nope", "", `{"id":"t1","name":"T1"}`, 401, "UNAUTHENTICATED"},
		{"another tenant's identity", "POST", "/api/iam/createTenant", acmeTok, "", `{"id":"t1","name":"T1"}`, 403, "ACCESS_DENIED"},
		{"a root identity without root authority", "POST", "/api/iam/createTenant", plainTok, "", `{"id":"t1","name":"T1"}`, 403, "ACCESS_DENIED"},
		{"denied before the method is looked up", "POST", "/api/iam/nope", acmeTok, "", `{}`, 403, "ACCESS_DENIED"},
		{"root authority", "POST", "/api/iam/createTenant", adminTok, "", `{"id":"t1","name":"T1"}`, 200, ""},
		{"root authority by cookie", "POST", "/api/iam/createTenant", "", adminTok, `{"id":"t2","name":"T2"}`, 200, ""},
		{"a cookie without its CSRF token", "POST", "/api/iam/createTenant?nocsrf", "", adminTok, `{"id":"t3","name":"T3"}`, 403, "ACCESS_DENIED"},
		{"a duplicate", "POST", "/api/iam/createTenant", adminTok, "", `{"id":"t1","name":"T1"}`, 409, "CONFLICT"},
		{"invalid input", "POST", "/api/iam/createTenant", adminTok, "", `{"id":"bad id","name":"x"}`, 400, "INVALID_INPUT"},
		{"an unknown field", "POST", "/api/iam/createTenant", adminTok, "", `{"id":"t3","name":"x","extra":1}`, 400, "INVALID_INPUT"},
		{"not JSON", "POST", "/api/iam/createTenant", adminTok, "", `{`, 400, "INVALID_INPUT"},
		{"two values", "POST", "/api/iam/createTenant", adminTok, "", `{"id":"t4","name":"x"} {}`, 400, "INVALID_INPUT"},
		{"not found", "POST", "/api/iam/deletePolicy", adminTok, "", `{"tenantId":"acme","name":"none"}`, 404, "NOT_FOUND"},
		{"an unknown method", "POST", "/api/iam/nope", adminTok, "", `{}`, 404, "NOT_FOUND"},
		{"GET", "GET", "/api/iam/listPolicies", adminTok, "", ``, 405, "INVALID_INPUT"},
		{"an empty body is {}", "POST", "/api/iam/verifyAudit", adminTok, "", ``, 400, "INVALID_INPUT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := call(t, tt.method, tt.path, tt.token, tt.cookie, tt.body)
			if got.status != tt.status || errCode(got) != tt.code {
				t.Fatalf("%s %s = %d %v, want %d %s", tt.method, tt.path, got.status, got.body, tt.status, tt.code)
			}
			if tt.code != "" {
				e := got.body["error"].(map[string]any)
				if _, ok := e["message"].(string); !ok {
					t.Fatalf("the error has no message: %v", got.body)
				}
			}
		})
	}

	// A whole flow over HTTP: identity, token, policy, relation, audit.
	idn := call(t, "POST", "/api/iam/createIdentity", adminTok, "", `{"tenantId":"acme","kind":"person","name":"bob"}`)
	if idn.status != 200 {
		t.Fatalf("createIdentity = %v", idn)
	}
	bobID := idn.body["id"].(string)
	tok := call(t, "POST", "/api/iam/createToken", adminTok, "", `{"tenantId":"acme","identityId":"`+bobID+`","sessionKind":"user","ttlSeconds":3600}`)
	if tok.status != 200 || !tokenPattern.MatchString(tok.body["token"].(string)) {
		t.Fatalf("createToken = %v", tok)
	}
	if c, err := env.iam.Authenticate(env.ctx, Credential{Authorization: "Bearer " + tok.body["token"].(string)}); err != nil || c.IdentityID != bobID {
		t.Fatalf("the new token: %+v, %v", c, err)
	}
	pol := call(t, "POST", "/api/iam/putPolicy", adminTok, "", `{"tenantId":"acme","name":"p","cedar":"permit (principal, action, resource);"}`)
	if pol.status != 200 {
		t.Fatalf("putPolicy = %v", pol)
	}
	list := call(t, "POST", "/api/iam/listPolicies", adminTok, "", `{"tenantId":"acme"}`)
	if items, _ := list.body["items"].([]any); list.status != 200 || len(items) != 1 {
		t.Fatalf("listPolicies = %v", list)
	}
	rel := call(t, "POST", "/api/iam/addRelation", adminTok, "", `{"tenantId":"acme","subjectId":"`+bobID+`","relation":"user","resourceType":"compute-pool","resourceId":"pool_1"}`)
	if rel.status != 200 {
		t.Fatalf("addRelation = %v", rel)
	}
	bad := call(t, "POST", "/api/iam/addRelation", adminTok, "", `{"tenantId":"acme","subjectId":"`+bobID+`","relation":"owner","resourceType":"compute-pool","resourceId":"pool_1"}`)
	if bad.status != 400 || bad.body["error"].(map[string]any)["details"].(map[string]any)["field"] != "relation" {
		t.Fatalf("a relation the catalog does not declare = %v", bad)
	}
	ver := call(t, "POST", "/api/iam/verifyAudit", adminTok, "", `{"tenantId":"acme"}`)
	if ver.status != 200 || ver.body["ok"] != true {
		t.Fatalf("verifyAudit = %v", ver)
	}

	// The admin changes name their actor; the refusals are on the refused caller's chain.
	entries := env.audit("acme")
	var sawActor, sawRefusal bool
	for _, e := range entries {
		if e.Action == "iam:admin:createIdentity" && e.IdentityID == rootAdmin.ID && e.Details["actorTenantId"] == "root" && e.RequestID == "req-1" {
			sawActor = true
		}
		if e.Action == "iam:admin:createTenant" && !e.Allowed && e.IdentityID == acmeUser.ID {
			sawRefusal = true
		}
	}
	if !sawActor || !sawRefusal {
		t.Fatalf("acme's chain: actor %v, refusal %v: %+v", sawActor, sawRefusal, entries)
	}
	var rootRefusals int
	for _, e := range env.audit("root") {
		if !e.Allowed && e.IdentityID == rootPlain.ID {
			rootRefusals++
		}
	}
	if rootRefusals != 1 {
		t.Fatalf("root's chain has %d refusals of the plain identity", rootRefusals)
	}
}

func TestAdminHandlerStrippedPrefix(t *testing.T) {
	env := newEmbTestEnv(t)
	rootAdmin := env.identity("root", KindPerson, "admin", true)
	tok := env.token(rootAdmin, SessionUser, true).Token
	mux := http.NewServeMux()
	mux.Handle("/api/iam/", http.StripPrefix("/api/iam", AdminHandler(env.admin, env.iam)))
	req := httptest.NewRequest("POST", "/api/iam/getTenant", strings.NewReader(`{"tenantId":"root"}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"id":"root"`) {
		t.Fatalf("%d %s", rec.Code, rec.Body.String())
	}
}

package api_test

import (
	"strings"
	"testing"
)

// A tenant IAM does not know is refused before anything is written in it:
// NOT_FOUND for root (tenant ids are case-sensitive, so "ROOT" is not the
// root tenant), and for every other caller the ACCESS_DENIED a known
// foreign tenant gives, byte for byte.
func TestUnknownTenantsAreRefused(t *testing.T) {
	e := newEnv(t)
	site := func(tenant string) string {
		return `{"tenantId":"` + tenant + `","name":"s1","region":"eu-central","iamRegion":"eu-central-1","kind":"custom"}`
	}
	project := func(tenant string) string { return `{"tenantId":"` + tenant + `","name":"p1"}` }
	for _, tenant := range []string{"ghost-tenant", "ROOT"} {
		for method, body := range map[string]string{"projects.create": project(tenant), "sites.create": site(tenant)} {
			status, raw := e.call(e.boot.AdminToken, method, body)
			if status != 404 || !strings.Contains(raw, `"NOT_FOUND"`) || !strings.Contains(raw, `"field":"tenantId"`) {
				t.Errorf("root's %s in %s = %d %s, want NOT_FOUND", method, tenant, status, raw)
			}
		}
	}
	for _, table := range []string{"projects", "sites", "authz_resources WHERE tenant_id <> 'acme' AND tenant_id <> 'root'"} {
		q := "SELECT count(*) FROM " + table
		if !strings.Contains(table, "WHERE") {
			q += " WHERE tenant_id IN ('ghost-tenant', 'ROOT')"
		}
		if n := e.count(q); n != 0 {
			t.Errorf("%s: %d rows in unknown tenants", table, n)
		}
	}
	// Root still acts in a known tenant.
	if status, raw := e.call(e.boot.AdminToken, "projects.create", project("globex")); status != 200 {
		t.Fatalf("root's create in globex = %d %s", status, raw)
	}

	// Anyone else: one answer for a known and an unknown tenant.
	plain := e.person("root", "operator", nil)
	for name, token := range map[string]string{"a tenant's admin": e.globex, "a root-tenant person without root authority": plain} {
		for method, body := range map[string]func(string) string{"projects.create": project, "sites.create": site} {
			ks, known := e.call(token, method, body("acme"))
			us, unknown := e.call(token, method, body("ghost-tenant"))
			if ks != 403 || us != 403 || known != unknown || !strings.Contains(known, "ACCESS_DENIED") {
				t.Errorf("%s, %s: known tenant = %d %s; unknown = %d %s", name, method, ks, known, us, unknown)
			}
		}
	}
}

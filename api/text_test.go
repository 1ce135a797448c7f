package api_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// A NUL character, invalid UTF-8 or a lone surrogate in any string field is
// INVALID_INPUT naming the field (dotted when nested) with reason encoding,
// before any IAM call and with nothing written: encoding/json would store
// the last two as U+FFFD, and PostgreSQL refuses the first (a 500).
func TestInvalidTextIsRefusedBeforeAnyIAMCall(t *testing.T) {
	e := newEnv(t)
	const pool, site = "pool_01hzzzzzzzzzzzzzzzzzzzzzzz", "site_01hzzzzzzzzzzzzzzzzzzzzzzz"
	cases := []struct{ method, body, field string }{
		{"projects.create", `{"tenantId":"acme","name":"a@b"}`, "name"},
		{"projects.create", `{"tenantId":"acme","name":"ok","description":"x@"}`, "description"},
		{"joinTokens.create", `{"tenantId":"acme","poolId":"` + pool + `","name":"@"}`, "name"},
		{"siteTokens.create", `{"tenantId":"acme","siteId":"` + site + `","name":"t@"}`, "name"},
		{"events.list", `{"tenantId":"acme","resourceId":"prj_@"}`, "resourceId"},
		{"events.list", `{"tenantId":"acme","types":["a","@"]}`, "types.1"},
		{"reservations.create", `{"tenantId":"acme","poolId":"` + pool + `","devices":{"class":"gpu@","count":1},"duration":60,"idempotencyKey":"k"}`, "devices.class"},
		{"system.version", `{"x@":1}`, "x@"},
	}
	bad := map[string]string{"NUL": `\u0000`, "invalid UTF-8": "\xff\xfe", "lone surrogate": `\ud800`, "reversed pair": `\udc00\ud800`}
	for _, c := range cases {
		for what, s := range bad {
			body := strings.Replace(c.body, "@", s, 1)
			field := strings.Replace(c.field, "@", "\x00", 1)
			if strings.Contains(c.field, "@") && what != "NUL" {
				continue // an invalid object name is reported on its object
			}
			e.outer.reset()
			e.queries.n.Store(0)
			status, raw := e.call(e.boot.UserToken, c.method, body)
			var out struct {
				Error struct {
					Code    string         `json:"code"`
					Details map[string]any `json:"details"`
				} `json:"error"`
			}
			_ = json.Unmarshal([]byte(raw), &out)
			if status != 400 || out.Error.Code != "INVALID_INPUT" || out.Error.Details["field"] != field || out.Error.Details["reason"] != "encoding" {
				t.Errorf("%s with %s in %s = %d %s", c.method, what, c.field, status, raw)
			}
			if n := e.outer.authenticate.Load() + e.outer.decisions(); n != 0 {
				t.Errorf("%s with %s: %d IAM calls", c.method, what, n)
			}
			if n := e.queries.n.Load(); n != 0 {
				t.Errorf("%s with %s: %d queries", c.method, what, n)
			}
		}
	}
	// A valid surrogate pair and other non-ASCII text are stored as sent.
	status, raw := e.call(e.boot.UserToken, "projects.create", `{"tenantId":"acme","name":"\ud83d\ude80 Zürich","description":"ok"}`)
	if status != 200 || !strings.Contains(raw, `"name":"🚀 Zürich"`) {
		t.Fatalf("valid non-ASCII name = %d %s", status, raw)
	}
}

package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core"
)

// FuzzEnvelope posts any body to any method path of the real server (a
// migrated database, the embedded IAM) as one of several callers. Whatever
// it sends, the answer is a 2xx, or a 4xx whose body is the API's error
// with a code of the spec that maps to that status: never a 5xx (a panic
// is recovered as one), never another shape. The seed corpus in
// testdata/fuzz/FuzzEnvelope names every method of the registry with odd
// bodies; `go test` runs it, `make test` also fuzzes for a few seconds.
func FuzzEnvelope(f *testing.F) {
	e := newEnv(f)
	tokens := []string{"", e.boot.UserToken, e.boot.AdminToken, e.globex, e.stranger}
	client := &http.Client{Timeout: 30 * time.Second}
	f.Add("projects.create", uint8(1), []byte(`{"tenantId":"acme","name":"fuzz"}`))
	f.Fuzz(func(t *testing.T, method string, caller uint8, body []byte) {
		group, name, _ := strings.Cut(method, ".")
		target := e.url + "/api/compute/" + url.PathEscape(group) + "/" + url.PathEscape(name)
		req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(string(body)))
		if err != nil {
			t.Skip("not a request a client can send")
		}
		if tok := tokens[int(caller)%len(tokens)]; tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s: reading the answer: %v", method, err)
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return
		}
		var out struct {
			Error *struct {
				Code    core.Code `json:"code"`
				Message string    `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(raw, &out); err != nil || out.Error == nil {
			t.Fatalf("%s %q = %d %s: not the API's error shape", method, body, resp.StatusCode, raw)
		}
		if resp.StatusCode >= 500 || resp.StatusCode < 400 || out.Error.Code.HTTPStatus() != resp.StatusCode {
			t.Fatalf("%s %q as caller %d = %d %s", method, body, caller%uint8(len(tokens)), resp.StatusCode, raw)
		}
	})
}

package openapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/openapi"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/iam"
)

// load parses a document with libopenapi and builds its validator.
func load(t *testing.T, raw []byte) (libopenapi.Document, validator.Validator) {
	t.Helper()
	doc, err := libopenapi.NewDocument(raw)
	if err != nil {
		t.Fatalf("libopenapi: %v", err)
	}
	if v := doc.GetVersion(); v != openapi.Version {
		t.Fatalf("openapi version %q, want %q", v, openapi.Version)
	}
	if _, err := doc.BuildV3Model(); err != nil {
		t.Fatalf("BuildV3Model: %v", err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatalf("NewValidator: %v", errs)
	}
	return doc, v
}

type operation struct {
	Served      bool   `json:"x-served"`
	Action      string `json:"x-action"`
	DecidedOn   string `json:"x-decided-on"`
	Phase       string `json:"x-phase"`
	RequestBody struct {
		Content map[string]struct {
			Schema  map[string]any  `json:"schema"`
			Example json.RawMessage `json:"example"`
		} `json:"content"`
	} `json:"requestBody"`
	Responses map[string]struct {
		Content map[string]struct {
			Schema map[string]any `json:"schema"`
		} `json:"content"`
	} `json:"responses"`
}

func operations(t *testing.T, raw []byte) map[string]operation {
	t.Helper()
	var doc struct {
		Paths map[string]struct {
			Post operation `json:"post"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]operation{}
	for path, item := range doc.Paths {
		out[path] = item.Post
	}
	return out
}

// The document `better-compute openapi` prints is OpenAPI 3.1 that
// libopenapi accepts and that validates against the OpenAPI 3.1 schema;
// every method of the registry is an operation whose input schema is
// exactly the one the envelope validates with and whose table cells are
// its row's; every served method has an output schema; and every example
// validates against its operation, both through libopenapi's request
// validator and through the envelope's own schema.
func TestOpenAPIDocument(t *testing.T) {
	raw, err := api.OpenAPI(api.Domains)
	if err != nil {
		t.Fatal(err)
	}
	_, v := load(t, raw)
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("%s: %s (%s)", e.ValidationType, e.Message, e.Reason)
			for _, f := range e.SchemaValidationErrors {
				t.Errorf("  %s: %s", f.KeywordLocation, f.Reason)
			}
		}
		t.FailNow()
	}
	reg, err := api.BuildRegistry(api.Domains)
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{"system.version": true, "system.whoami": true, "system.selfCheck": true}
	for _, domain := range api.Domains {
		for _, d := range domain(rpc.Deps{}) {
			served[d.Info().Name] = true
		}
	}
	ops := operations(t, raw)
	if len(ops) != reg.Len() {
		t.Errorf("%d operations, the registry has %d methods", len(ops), reg.Len())
	}
	servedOps := 0
	for _, m := range reg.Methods() {
		path := openapi.CallPath(m)
		op, ok := ops[path]
		if !ok {
			t.Errorf("%s: no operation at %s", m.FullName(), path)
			continue
		}
		if op.Served != served[m.FullName()] {
			t.Errorf("%s: x-served %v, want %v", m.FullName(), op.Served, served[m.FullName()])
		}
		if op.Served {
			servedOps++
		}
		if op.Action != m.Row.Action || op.DecidedOn != m.Row.DecidedOn || op.Phase != m.Row.Phase {
			t.Errorf("%s: x-action %q x-decided-on %q x-phase %q, the table says %q %q %q", m.FullName(),
				op.Action, op.DecidedOn, op.Phase, m.Row.Action, m.Row.DecidedOn, m.Row.Phase)
		}
		body := op.RequestBody.Content["application/json"]
		want, _ := json.Marshal(m.Schema.Document())
		got, _ := json.Marshal(body.Schema)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: input schema\n%s\nis not the envelope's\n%s", m.FullName(), got, want)
		}
		answer := op.Responses["200"].Content["application/json"]
		if streamed, ok := op.Responses["200"].Content["application/x-ndjson"]; ok {
			answer = streamed // a streamed answer's lines
		}
		if op.Served && answer.Schema["type"] == nil {
			t.Errorf("%s: served, but its answer has no schema", m.FullName())
		}
		if len(body.Example) == 0 {
			t.Errorf("%s: no example", m.FullName())
			continue
		}
		if err := m.Schema.Validate(body.Example); err != nil {
			t.Errorf("%s: the example %s does not validate: %v", m.FullName(), body.Example, err)
		}
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body.Example))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer token")
		if ok, verrs := v.ValidateHttpRequest(req); !ok {
			for _, e := range verrs {
				t.Errorf("%s: the example %s: %s (%s)", m.FullName(), body.Example, e.Message, e.Reason)
			}
		}
	}
	if servedOps != len(served) {
		t.Errorf("%d operations are served, the domains serve %d methods", servedOps, len(served))
	}
}

// GET /api/openapi.json over HTTP, with no credential, answers the same
// document, and system.version counts its served and planned methods.
func TestOpenAPIServed(t *testing.T) {
	s, err := api.New(api.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + api.OpenAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %d %s: %s", api.OpenAPIPath, resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	load(t, raw)
	offline, err := api.OpenAPI(api.Domains)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw, offline) {
		t.Errorf("the served document differs from `better-compute openapi`'s")
	}

	out, err := s.Call(context.Background(), iam.Credential{}, "system.version", nil)
	if err != nil {
		t.Fatal(err)
	}
	version := out.(api.VersionOutput)
	servedOps := 0
	ops := operations(t, raw)
	for _, op := range ops {
		if op.Served {
			servedOps++
		}
	}
	if version.Methods.Served != servedOps || version.Methods.Planned != len(ops)-servedOps {
		t.Errorf("system.version counts %+v, the document has %d served of %d", version.Methods, servedOps, len(ops))
	}
}

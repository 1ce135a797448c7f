package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/openapi"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

func servedRegistry(t *testing.T) *core.Registry {
	t.Helper()
	reg, err := api.BuildRegistry(api.Domains)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// Served methods validate with the schemas their descriptors' input types give.
func TestServedSchemas(t *testing.T) {
	reg := servedRegistry(t)
	cases := []struct {
		name, method, input string
		field, reason       string // "" means valid
	}{
		{"tenant pattern", "projects.list", `{"tenantId":"acme/prod"}`, "tenantId", "pattern"},
		{"tenant empty", "projects.list", `{"tenantId":""}`, "tenantId", "pattern"},
		{"tenant length", "projects.list", `{"tenantId":"` + strings.Repeat("a", 129) + `"}`, "tenantId", "maxLength"},
		{"tenant of 128", "projects.list", `{"tenantId":"` + strings.Repeat("a", 128) + `"}`, "", ""},
		{"tenant type", "projects.list", `{"tenantId":42}`, "tenantId", "type"},
		{"tenant null", "projects.list", `{"tenantId":null}`, "tenantId", "type"},
		{"unknown field", "projects.list", `{"tenantId":"acme","offset":5}`, "offset", "unknown"},
		{"project id pattern", "projects.get", `{"tenantId":"acme","projectId":"prj_01HZYX0000000000000000000A"}`, "projectId", "pattern"},
		{"project id prefix", "projects.get", `{"tenantId":"acme","projectId":"pool_01hzyx0000000000000000000a"}`, "projectId", "pattern"},
		{"project id", "projects.get", `{"tenantId":"acme","projectId":"prj_01hzyx0000000000000000000a"}`, "", ""},
		{"project id missing", "projects.archive", `{"tenantId":"acme"}`, "projectId", "required"},
		{"project name", "projects.create", `{"tenantId":"acme","name":"Training"}`, "", ""},
		{"project name empty", "projects.create", `{"tenantId":"acme","name":""}`, "name", "minLength"},
		{"project name in characters", "projects.create", `{"tenantId":"acme","name":"` + strings.Repeat("é", 128) + `"}`, "", ""},
		{"project name too long", "projects.create", `{"tenantId":"acme","name":"` + strings.Repeat("é", 129) + `"}`, "name", "maxLength"},
		{"sites.create kind", "sites.create", `{"tenantId":"acme","kind":"custom","name":"fra-1","region":"eu-central","iamRegion":"eu-central-1"}`, "", ""},
		{"sites.create kind enum", "sites.create", `{"tenantId":"acme","kind":"cloud"}`, "kind", "enum"},
		{"reservations.list scope", "reservations.list", `{"tenantId":"acme","scope":"everyone"}`, "scope", "enum"},
		{"reservations.create key", "reservations.create", `{"tenantId":"acme","idempotencyKey":"` + strings.Repeat("k", 129) + `"}`, "idempotencyKey", "maxLength"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, ok := reg.Get(tc.method)
			if !ok {
				t.Fatalf("%s is not registered", tc.method)
			}
			err := m.Schema.Validate(json.RawMessage(tc.input))
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err == nil || err.Code != core.CodeInvalidInput || err.Details["field"] != tc.field || err.Details["reason"] != tc.reason {
				t.Fatalf("err = %v, want INVALID_INPUT field %q reason %q", err, tc.field, tc.reason)
			}
		})
	}
}

// For every method, each constrained field just out of bounds is
// INVALID_INPUT naming that field: too long, too short, a bad pattern, out
// of range, a wrong enum value, a wrong type, and an unknown key at every
// object level. The inputs are generated from the schemas themselves, so a
// method added later is covered without a line here.
func TestEveryConstrainedFieldOutOfBounds(t *testing.T) {
	reg := servedRegistry(t)
	checked := 0
	for _, m := range reg.Methods() {
		doc := m.Schema.Document()
		valid := sample(t, doc)
		if err := m.Schema.ValidateValue(valid); err != nil {
			t.Errorf("%s: the generated input %v is not valid: %v", m.FullName(), valid, err)
			continue
		}
		for _, c := range mutations(nil, doc) {
			input := cloneJSON(t, valid)
			c.apply(input)
			err := m.Schema.ValidateValue(input)
			field := strings.Join(c.path, ".")
			if err == nil || err.Code != core.CodeInvalidInput || err.Details["field"] != field || err.Details["reason"] != c.reason {
				t.Errorf("%s: %s %s: err = %v %v, want INVALID_INPUT field %q reason %q", m.FullName(), field, c.what, err, detailsOf(err), field, c.reason)
			}
			checked++
		}
	}
	if checked < 300 {
		t.Errorf("only %d mutations checked", checked)
	}
}

func detailsOf(e *core.Error) map[string]any {
	if e == nil {
		return nil
	}
	return e.Details
}

type mutation struct {
	path   []string
	what   string
	reason string
	apply  func(input map[string]any)
}

// mutations are the out-of-bounds values of every property of an object
// schema at path, and an unknown key in it.
func mutations(path []string, obj map[string]any) []mutation {
	props, _ := obj["properties"].(map[string]any)
	var out []mutation
	at := func(p []string, v any) func(map[string]any) {
		return func(input map[string]any) { setPath(input, p, v) }
	}
	unknown := append(slices.Clone(path), "zzUnknown")
	if obj["additionalProperties"] == false {
		out = append(out, mutation{unknown, "unknown key", "unknown", at(unknown, true)})
	}
	for _, name := range sortedKeys(props) {
		p, _ := props[name].(map[string]any)
		fp := append(slices.Clone(path), name)
		types := typesOf(p)
		if len(types) == 0 {
			continue
		}
		wrong := any(true)
		if slices.Contains(types, "boolean") {
			wrong = "x"
		}
		out = append(out, mutation{fp, "wrong type", "type", at(fp, wrong)})
		switch types[0] {
		case "string":
			minLen, maxLen := num(p["minLength"]), num(p["maxLength"])
			if enum, ok := p["enum"].([]any); ok && len(enum) > 0 {
				out = append(out, mutation{fp, "not in the enum", "enum", at(fp, "not-a-value")})
			}
			if maxLen > 0 {
				out = append(out, mutation{fp, "too long", "maxLength", at(fp, strings.Repeat("a", int(maxLen)+1))})
			}
			if minLen > 0 {
				out = append(out, mutation{fp, "too short", "minLength", at(fp, strings.Repeat("a", int(minLen)-1))})
			}
			if _, ok := p["pattern"]; ok {
				out = append(out, mutation{fp, "bad pattern", "pattern", at(fp, strings.Repeat("!", max(int(minLen), 1)))})
			}
		case "integer", "number":
			if v, ok := p["minimum"]; ok {
				out = append(out, mutation{fp, "below the minimum", "range", at(fp, num(v)-max(1, math.Abs(num(v))))})
			}
			if v, ok := p["maximum"]; ok {
				out = append(out, mutation{fp, "above the maximum", "range", at(fp, num(v)+max(1, math.Abs(num(v))))})
			}
		case "object":
			if _, ok := p["properties"]; ok {
				out = append(out, mutations(fp, p)...)
			}
		}
	}
	return out
}

// sample is a valid value of a schema: required properties only, each the
// least value its constraints allow.
func sample(t *testing.T, p map[string]any) any {
	types := typesOf(p)
	if enum, ok := p["enum"].([]any); ok && len(enum) > 0 {
		return enum[0]
	}
	if len(types) == 0 {
		return map[string]any{}
	}
	switch types[0] {
	case "object":
		out := map[string]any{}
		props, _ := p["properties"].(map[string]any)
		required, _ := p["required"].([]any)
		for _, r := range required {
			out[r.(string)] = sample(t, props[r.(string)].(map[string]any))
		}
		return out
	case "array":
		out := []any{}
		if items, ok := p["items"].(map[string]any); ok {
			for n := num(p["minItems"]); float64(len(out)) < n; {
				out = append(out, sample(t, items))
			}
		}
		return out
	case "string":
		s := ""
		if pat, ok := p["pattern"].(string); ok {
			var err error
			if s, err = openapi.ShortestMatch(pat); err != nil {
				t.Fatal(err)
			}
		}
		for n := num(p["minLength"]); float64(len([]rune(s))) < n; {
			s += "a"
		}
		return s
	case "integer", "number":
		if v, ok := p["minimum"]; ok && num(v) > 0 {
			return num(v)
		}
		return 0
	case "boolean":
		return false
	}
	return nil
}

func typesOf(p map[string]any) []string {
	switch t := p["type"].(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, x := range t {
			if s, ok := x.(string); ok && s != "null" {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func num(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case json.Number:
		f, _ := n.Float64()
		return f
	}
	return 0
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func setPath(input map[string]any, path []string, v any) {
	for _, p := range path[:len(path)-1] {
		next, ok := input[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			input[p] = next
		}
		input = next
	}
	input[path[len(path)-1]] = v
}

func cloneJSON(t *testing.T, v any) map[string]any {
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

type dummyInput struct {
	TenantID   string `json:"tenantId" jsonschema:"required" id:"tenant"`
	ResourceID string `json:"resourceId" jsonschema:"required" id:"crs"`
}

// A descriptor that disagrees with its method-table row, names no row, is
// given twice, or does not fit its kind fails start-up with INVALID_CONFIG.
func TestDescriptorsMustMatchTheTable(t *testing.T) {
	run := func(context.Context, *rpc.Call, store.Tx, dummyInput) (struct{}, error) { return struct{}{}, nil }
	good := func() *rpc.Method[dummyInput, struct{}] {
		return &rpc.Method[dummyInput, struct{}]{Name: "cloudResources.get", Action: "compute:cloud-resources:read",
			DecidedOn: "compute-cloud-resource", Phase: "v1.0", Kind: core.KindRead, Run: run}
	}
	if _, _, err := api.Served([]rpc.Descriptor{good()}); err != nil {
		t.Fatalf("a descriptor that agrees: %v", err)
	}
	cases := map[string]func(m *rpc.Method[dummyInput, struct{}]) []rpc.Descriptor{
		"another action": func(m *rpc.Method[dummyInput, struct{}]) []rpc.Descriptor {
			m.Action = "compute:pools:read"
			return []rpc.Descriptor{m}
		},
		"another decided-on": func(m *rpc.Method[dummyInput, struct{}]) []rpc.Descriptor {
			m.DecidedOn = "compute-tenant"
			return []rpc.Descriptor{m}
		},
		"another phase": func(m *rpc.Method[dummyInput, struct{}]) []rpc.Descriptor {
			m.Phase = "v0.1"
			return []rpc.Descriptor{m}
		},
		"another kind": func(m *rpc.Method[dummyInput, struct{}]) []rpc.Descriptor {
			m.Kind = core.KindMutation
			return []rpc.Descriptor{m}
		},
		"no row": func(m *rpc.Method[dummyInput, struct{}]) []rpc.Descriptor {
			m.Name = "gizmos.get"
			return []rpc.Descriptor{m}
		},
		"twice":      func(m *rpc.Method[dummyInput, struct{}]) []rpc.Descriptor { return []rpc.Descriptor{m, good()} },
		"no handler": func(m *rpc.Method[dummyInput, struct{}]) []rpc.Descriptor { m.Run = nil; return []rpc.Descriptor{m} },
		"an id field missing": func(*rpc.Method[dummyInput, struct{}]) []rpc.Descriptor {
			return []rpc.Descriptor{&rpc.Method[rpc.TenantInput, struct{}]{Name: "cloudResources.get", Action: "compute:cloud-resources:read",
				DecidedOn: "compute-cloud-resource", Phase: "v1.0", Kind: core.KindRead,
				Run: func(context.Context, *rpc.Call, store.Tx, rpc.TenantInput) (struct{}, error) { return struct{}{}, nil }}}
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, err := api.Served(mutate(good()))
			if !errors.Is(err, core.ErrInvalidConfig) {
				t.Fatalf("err = %v, want INVALID_CONFIG", err)
			}
		})
	}
}

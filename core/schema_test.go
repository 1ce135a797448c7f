package core

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

const (
	okTenant = "acme.prod:eu-1"
	okPool   = "pool_01hzyx0000000000000000000a"
	okCrs    = "crs_01hzyx0000000000000000000a"
)

func schemaOf(t *testing.T, method string) *Schema {
	t.Helper()
	m, ok := mustRegistry(t).Get(method)
	if !ok {
		t.Fatalf("%s is not registered", method)
	}
	return m.Schema
}

func TestValidate(t *testing.T) {
	derivedKey := DerivedID("crs", "acme", "idn_1", "k")
	cases := []struct {
		name, method, input string
		field, reason       string // "" means valid
	}{
		{"whoami with no body", "system.whoami", "", "", ""},
		{"whoami with null", "system.whoami", "null", "", ""},
		{"whoami with {}", "system.whoami", " {} ", "", ""},
		{"whoami with a field", "system.whoami", `{"tenantId":"acme"}`, "tenantId", "unknown"},
		{"not an object", "system.version", `[]`, "", "type"},
		{"broken JSON", "system.version", `{"a":`, "", "type"},
		{"selfCheck needs a tenant", "system.selfCheck", `{}`, "tenantId", "required"},
		{"selfCheck", "system.selfCheck", `{"tenantId":"` + okTenant + `"}`, "", ""},
		{"pool id of 57", "cloudResources.kinds", `{"tenantId":"acme","poolId":"pool_` + strings.Repeat("a", 52) + `"}`, "", ""},
		{"pool id body of 53", "cloudResources.kinds", `{"tenantId":"acme","poolId":"pool_` + strings.Repeat("a", 53) + `"}`, "poolId", "maxLength"},
		{"enum", "cloudResources.catalog", `{"tenantId":"acme","poolId":"` + okPool + `","installsOn":"vm"}`, "installsOn", "enum"},
		{"boolean", "cloudResources.list", `{"tenantId":"acme","includeDeleted":"yes"}`, "includeDeleted", "type"},
		{"list narrowing", "cloudResources.list", `{"tenantId":"acme","family":"data","kind":"do.database.pg","includeDeleted":true}`, "", ""},
		{"create", "cloudResources.create", `{"tenantId":"acme","poolId":"` + okPool + `","kind":"do.database.pg","name":"db-1","spec":{"size":1},"idempotencyKey":"k-1"}`, "", ""},
		{"create without a key", "cloudResources.create", `{"tenantId":"acme","poolId":"` + okPool + `","kind":"do.database.pg","name":"db-1","spec":{}}`, "idempotencyKey", "required"},
		{"create name pattern", "cloudResources.create", `{"tenantId":"acme","poolId":"` + okPool + `","kind":"do.app","name":"Db","spec":{},"idempotencyKey":"k"}`, "name", "pattern"},
		{"create spec type", "cloudResources.create", `{"tenantId":"acme","poolId":"` + okPool + `","kind":"do.app","name":"db","spec":[],"idempotencyKey":"k"}`, "spec", "type"},
		{"create spec over 64 KiB", "cloudResources.create", `{"tenantId":"acme","poolId":"` + okPool + `","kind":"do.app","name":"db","spec":{"x":"` + strings.Repeat("a", 64<<10) + `"},"idempotencyKey":"k"}`, "spec", "maxBytes"},
		{"create parent derived id", "cloudResources.create", `{"tenantId":"acme","poolId":"` + okPool + `","kind":"do.app","name":"db","spec":{},"idempotencyKey":"k","parentId":"` + derivedKey + `"}`, "", ""},
		{"update description null", "cloudResources.update", `{"tenantId":"acme","resourceId":"` + okCrs + `","description":null}`, "", ""},
		{"signals resource id", "cloudResources.signals", `{"tenantId":"acme","poolId":"` + okPool + `","resourceId":"crs_x"}`, "resourceId", "pattern"},
		{"sandboxVolumes.resize size", "sandboxVolumes.resize", `{"tenantId":"acme","volumeId":"vol_01hzyx0000000000000000000a","sizeGiB":"10"}`, "sizeGiB", "type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := schemaOf(t, tc.method).Validate(json.RawMessage(tc.input))
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err == nil || err.Code != CodeInvalidInput || err.Details["field"] != tc.field || err.Details["reason"] != tc.reason {
				t.Fatalf("err = %v %v, want INVALID_INPUT field %q reason %q", err, errDetails(err), tc.field, tc.reason)
			}
		})
	}
}

func errDetails(e *Error) map[string]any {
	if e == nil {
		return nil
	}
	return e.Details
}

func TestValidateValue(t *testing.T) {
	s := schemaOf(t, "cloudResources.get")
	ok := map[string]any{"tenantId": "acme", "resourceId": okCrs}
	if err := s.ValidateValue(ok); err != nil {
		t.Errorf("map: %v", err)
	}
	if err := s.ValidateValue(struct {
		TenantID string `json:"tenantId"`
	}{"acme"}); err == nil || err.Details["field"] != "resourceId" {
		t.Errorf("struct: %v", err)
	}
	if err := s.ValidateValue([]byte(`{"tenantId":"acme"}`)); err == nil || err.Details["reason"] != "required" {
		t.Errorf("bytes: %v", err)
	}
	if err := s.ValidateValue(make(chan int)); err == nil || err.Code != CodeInvalidInput {
		t.Errorf("unmarshalable: %v", err)
	}
}

func TestIntegerField(t *testing.T) {
	s, err := NewSchema(Field{Name: "n", Type: FieldInteger})
	if err != nil {
		t.Fatal(err)
	}
	for in, valid := range map[string]bool{`{"n":3}`: true, `{"n":-3}`: true, `{"n":3.0}`: true, `{"n":3.5}`: false, `{"n":"3"}`: false, `{"n":1e300}`: false} {
		if got := s.Validate(json.RawMessage(in)) == nil; got != valid {
			t.Errorf("%s: valid = %v, want %v", in, got, valid)
		}
	}
}

func TestNewSchemaRejectsDefects(t *testing.T) {
	for name, fields := range map[string][]Field{
		"bad pattern":  {{Name: "a", Type: FieldString, Pattern: "("}},
		"repeated":     {{Name: "a", Type: FieldString}, {Name: "a", Type: FieldString}},
		"unnamed":      {{Type: FieldString}},
		"unknown type": {{Name: "a", Type: "date"}},
	} {
		if _, err := NewSchema(fields...); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

type color string

func (color) Enum() []string { return []string{"red", "green"} }

// A field of an Enumerated type takes its values only, alone or in a list.
func TestEnumeratedTypes(t *testing.T) {
	s, err := SchemaFor(reflect.TypeFor[struct {
		One  color   `json:"one,omitempty"`
		Many []color `json:"many,omitempty"`
	}]())
	if err != nil {
		t.Fatal(err)
	}
	for in, reason := range map[string]string{`{"one":"red","many":["green"]}`: "", `{"one":"blue"}`: "enum", `{"many":["red","blue"]}`: "enum"} {
		err := s.Validate(json.RawMessage(in))
		if got := ""; err != nil {
			got, _ = err.Details["reason"].(string)
			if got != reason {
				t.Errorf("%s: reason %q, want %q", in, got, reason)
			}
		} else if reason != "" {
			t.Errorf("%s: valid, want %s", in, reason)
		}
	}
}

// A seconds field sent in milliseconds is out of range with a hint that
// names the unit and the value meant; epoch-ms and *Seconds fields carry
// their unit in the schema.
func TestUnitHint(t *testing.T) {
	type in struct {
		Start        *int64 `json:"start,omitempty" unit:"epoch-ms"`
		Duration     int64  `json:"duration" jsonschema:"required,minimum=1,maximum=31622400" unit:"s"`
		LeaseSeconds *int64 `json:"leaseSeconds,omitempty" jsonschema:"minimum=1"`
	}
	s, err := SchemaFor(reflect.TypeFor[in]())
	if err != nil {
		t.Fatal(err)
	}
	props := s.Document()["properties"].(map[string]any)
	for field, unit := range map[string]string{"start": UnitEpochMs, "duration": UnitSeconds, "leaseSeconds": UnitSeconds} {
		p := props[field].(map[string]any)
		if p["x-unit"] != unit || p["description"] == nil {
			t.Errorf("%s: x-unit %v description %v, want %s and a description", field, p["x-unit"], p["description"], unit)
		}
	}
	// A week in milliseconds is past the 366 days' maximum.
	e := s.Validate([]byte(`{"duration":604800000}`))
	if e == nil || e.Details["field"] != "duration" || e.Details["reason"] != "range" ||
		e.Details["hint"] != "duration is seconds, not milliseconds; did you mean 604800?" {
		t.Fatalf("duration 604800000: %v, want INVALID_INPUT range with a hint", e)
	}
	if e := s.Validate([]byte(`{"duration":0}`)); e == nil || e.Details["hint"] != nil {
		t.Fatalf("duration 0: %v, want a range error without a hint", e)
	}
}

package core

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Input schemas: a small declarative description of a method's JSON input
// that the envelope validates before any IAM call (spec: "How a call is
// decided", step 3). Unknown fields are refused, so a misspelt optional field
// never silently does nothing.

// FieldType is the JSON type of an input field.
type FieldType string

const (
	FieldString  FieldType = "string"
	FieldNumber  FieldType = "number"
	FieldInteger FieldType = "integer"
	FieldBoolean FieldType = "boolean"
	FieldObject  FieldType = "object"
	FieldArray   FieldType = "array"
)

// Field is one input field and its constraints.
type Field struct {
	Name      string
	Type      FieldType
	Required  bool
	Nullable  bool     // null is accepted ("string,null")
	MinLength int      // strings, in characters
	MaxLength int      // strings, in characters; 0 means no limit
	Pattern   string   // strings: a regular expression the value must match
	Enum      []string // strings: the allowed values
	MaxBytes  int      // the field's compact JSON at most this many bytes; 0 means no limit
}

// Schema is an immutable, compiled input schema.
type Schema struct {
	fields   []Field
	patterns []*regexp.Regexp // by field index; nil when the field has none
}

// NewSchema compiles a schema; a bad pattern, type or repeated field is an error.
func NewSchema(fields ...Field) (*Schema, error) {
	s := &Schema{fields: make([]Field, len(fields)), patterns: make([]*regexp.Regexp, len(fields))}
	seen := map[string]bool{}
	for i, f := range fields {
		if f.Name == "" || seen[f.Name] {
			return nil, fmt.Errorf("schema: field %q is empty or repeated", f.Name)
		}
		seen[f.Name] = true
		switch f.Type {
		case FieldString, FieldNumber, FieldInteger, FieldBoolean, FieldObject, FieldArray:
		default:
			return nil, fmt.Errorf("schema: field %q has unknown type %q", f.Name, f.Type)
		}
		if f.Pattern != "" {
			re, err := regexp.Compile(f.Pattern)
			if err != nil {
				return nil, fmt.Errorf("schema: field %q: %w", f.Name, err)
			}
			s.patterns[i] = re
		}
		f.Enum = slices.Clone(f.Enum)
		s.fields[i] = f
	}
	return s, nil
}

// Fields returns the schema's fields in declaration order.
func (s *Schema) Fields() []Field {
	out := make([]Field, len(s.fields))
	for i, f := range s.fields {
		f.Enum = slices.Clone(f.Enum)
		out[i] = f
	}
	return out
}

// Field returns one field by name.
func (s *Schema) Field(name string) (Field, bool) {
	for _, f := range s.fields {
		if f.Name == name {
			f.Enum = slices.Clone(f.Enum)
			return f, true
		}
	}
	return Field{}, false
}

// ValidateValue validates an input given as JSON (json.RawMessage or
// []byte), nil, or any value that marshals to a JSON object (a map or struct).
func (s *Schema) ValidateValue(v any) *Error {
	switch in := v.(type) {
	case nil:
		return s.Validate(nil)
	case json.RawMessage:
		return s.Validate(in)
	case []byte:
		return s.Validate(in)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return Wrap(CodeInvalidInput, err, "input is not JSON").WithDetails(map[string]any{"field": "", "reason": "type"})
	}
	return s.Validate(raw)
}

// Validate validates a JSON input. Empty input and null are the empty object.
// The first failure is INVALID_INPUT with details.field and details.reason
// (required, unknown, type, minLength, maxLength, pattern, enum, maxBytes).
func (s *Schema) Validate(input json.RawMessage) *Error {
	trimmed := bytes.TrimSpace(input)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		trimmed = []byte("{}")
	}
	if trimmed[0] != '{' {
		return invalidField("", "type", "input must be a JSON object")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &obj); err != nil {
		return Wrap(CodeInvalidInput, err, "input is not a valid JSON object").WithDetails(map[string]any{"field": "", "reason": "type"})
	}
	for _, name := range slices.Sorted(maps.Keys(obj)) {
		if _, ok := s.Field(name); !ok {
			return invalidField(name, "unknown", fmt.Sprintf("%s is not a field of this method", name))
		}
	}
	for i, f := range s.fields {
		raw, present := obj[f.Name]
		if !present {
			if f.Required {
				return invalidField(f.Name, "required", fmt.Sprintf("%s is required", f.Name))
			}
			continue
		}
		if err := s.checkField(i, raw); err != nil {
			return err
		}
	}
	return nil
}

func (s *Schema) checkField(i int, raw json.RawMessage) *Error {
	f := s.fields[i]
	if string(raw) == "null" {
		if f.Nullable {
			return nil
		}
		return invalidField(f.Name, "type", fmt.Sprintf("%s must be a %s, not null", f.Name, f.Type))
	}
	if !hasType(f.Type, raw) {
		return invalidField(f.Name, "type", fmt.Sprintf("%s must be a %s", f.Name, f.Type))
	}
	if f.MaxBytes > 0 {
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err == nil && buf.Len() > f.MaxBytes {
			return invalidField(f.Name, "maxBytes", fmt.Sprintf("%s is %d bytes of JSON, at most %d", f.Name, buf.Len(), f.MaxBytes))
		}
	}
	if f.Type != FieldString {
		return nil
	}
	var str string
	if err := json.Unmarshal(raw, &str); err != nil {
		return invalidField(f.Name, "type", fmt.Sprintf("%s must be a string", f.Name))
	}
	n := utf8.RuneCountInString(str)
	switch {
	case n < f.MinLength:
		return invalidField(f.Name, "minLength", fmt.Sprintf("%s must be at least %d characters", f.Name, f.MinLength))
	case f.MaxLength > 0 && n > f.MaxLength:
		return invalidField(f.Name, "maxLength", fmt.Sprintf("%s must be at most %d characters", f.Name, f.MaxLength))
	case s.patterns[i] != nil && !s.patterns[i].MatchString(str):
		return invalidField(f.Name, "pattern", fmt.Sprintf("%s must match %s", f.Name, f.Pattern))
	case len(f.Enum) > 0 && !slices.Contains(f.Enum, str):
		return invalidField(f.Name, "enum", fmt.Sprintf("%s must be one of %v", f.Name, f.Enum))
	}
	return nil
}

// hasType checks a well-formed JSON value's type by its first byte; numbers
// that must be integers are parsed.
func hasType(t FieldType, raw json.RawMessage) bool {
	c := raw[0]
	switch t {
	case FieldString:
		return c == '"'
	case FieldBoolean:
		return c == 't' || c == 'f'
	case FieldObject:
		return c == '{'
	case FieldArray:
		return c == '['
	case FieldNumber:
		return c == '-' || (c >= '0' && c <= '9')
	case FieldInteger:
		v, err := strconv.ParseFloat(string(raw), 64)
		return err == nil && v == math.Trunc(v) && math.Abs(v) <= 1<<53
	}
	return false
}

func invalidField(field, reason, msg string) *Error {
	return Errorf(CodeInvalidInput, "%s", msg).WithDetails(map[string]any{"field": field, "reason": reason})
}

// Field constructors for the spec's recurring constraints.

// idBodyPattern is an id body: a generated (26) or derived (52) base32 body.
const idBodyPattern = `[0-9a-hjkmnp-tv-z]{26,52}`

// tenantIDPattern is also the grammar of idempotency keys.
const tenantIDPattern = `^[A-Za-z0-9._:-]{1,128}$`

// TenantIDField is the tenantId every tenant-scoped method takes.
func TenantIDField() Field {
	return Field{Name: "tenantId", Type: FieldString, Required: true, MaxLength: 128, Pattern: tenantIDPattern}
}

// IDField is an id field such as poolId: "at most 57 characters; matches
// ^pool_[0-9a-hjkmnp-tv-z]{26,52}$".
func IDField(name, prefix string, required bool) Field {
	return Field{Name: name, Type: FieldString, Required: required,
		MaxLength: len(prefix) + 1 + 52, Pattern: "^" + prefix + "_" + idBodyPattern + "$"}
}

// IdempotencyKeyField is the key a request-derived id is computed from.
func IdempotencyKeyField() Field {
	return Field{Name: "idempotencyKey", Type: FieldString, Required: true, MaxLength: 128, Pattern: tenantIDPattern}
}

package core

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/invopop/jsonschema"
	validator "github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/message"
)

// Input schemas. A method's input is a JSON Schema (draft 2020-12) document,
// validated with santhosh-tekuri/jsonschema before any IAM call (spec: "How
// a call is decided", step 3). A served method's document is derived from
// its Go input type (invopop/jsonschema reads the struct tags); a planned
// method's from the fields its decisions imply. Unknown fields are refused
// at every level, so a misspelt optional field never silently does nothing.
// The same documents feed the OpenAPI description.
//
// Struct tags a Go input type may carry besides invopop's `jsonschema`:
//
//	id:"pool"      an id of that prefix: ^pool_[0-9a-hjkmnp-tv-z]{26,52}$, at most 57 characters
//	id:"tenant"    a tenant id (also the grammar of idempotency keys)
//	maxBytes:"N"   the value's compact JSON is at most N bytes (free-form objects)
//	unit:"epoch-ms" an instant in epoch milliseconds (UTC); unit:"s" a duration in seconds;
//	               unit:"ms" a duration in milliseconds. The unit becomes the field's description
//	               (unless it has one) and x-unit; a seconds field out of range gets a hint.
//	               Integer fields named *At, *Seconds and *Ms take those units without a tag.

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

// Field is one top-level input field and its constraints.
type Field struct {
	Name      string
	Type      FieldType
	Required  bool
	Nullable  bool     // null is accepted
	MinLength int      // strings, in characters
	MaxLength int      // strings, in characters; 0 means no limit
	Pattern   string   // strings: a regular expression the value must match
	Enum      []string // strings: the allowed values
	MaxBytes  int      // the field's compact JSON at most this many bytes; 0 means no limit
}

// Schema is an immutable, compiled input schema.
type Schema struct {
	doc      map[string]any
	order    []string // the top-level properties in declaration order
	fields   map[string]Field
	compiled *validator.Schema
}

// maxSafeInteger bounds integers: JSON numbers beyond it lose precision.
const maxSafeInteger = 1 << 53

// maxBytesKeyword is a keyword of ours: JSON Schema cannot bound a
// free-form object's size.
const maxBytesKeyword = "x-maxBytes"

// unitKeyword names a number's unit (an annotation: validators ignore it),
// so documents and hints say what a bare integer means.
const unitKeyword = "x-unit"

// The units a field may carry.
const (
	UnitEpochMs = "epoch-ms" // an instant, milliseconds since 1970-01-01T00:00:00Z
	UnitSeconds = "s"        // a duration in seconds
	UnitMs      = "ms"       // a duration in milliseconds
)

// unitDescriptions say each unit in words.
var unitDescriptions = map[string]string{
	UnitEpochMs: "An instant in epoch milliseconds (UTC), e.g. 1767225600000 for 2026-01-01T00:00:00Z.",
	UnitSeconds: "A duration in seconds, e.g. 3600 for one hour.",
	UnitMs:      "A duration in milliseconds.",
}

// unitOf is a field's unit: its unit tag, else what its name says.
func unitOf(f reflect.StructField, name string) (string, error) {
	if u := f.Tag.Get("unit"); u != "" {
		if _, ok := unitDescriptions[u]; !ok {
			return "", fmt.Errorf("schema: %s: unit %q is not one of epoch-ms, s, ms", f.Name, u)
		}
		return u, nil
	}
	t := f.Type
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if k := t.Kind(); k < reflect.Int || k > reflect.Uint64 {
		return "", nil
	}
	switch {
	case strings.HasSuffix(name, "At"):
		return UnitEpochMs, nil
	case strings.HasSuffix(name, "Seconds"):
		return UnitSeconds, nil
	case strings.HasSuffix(name, "Ms"):
		return UnitMs, nil
	}
	return "", nil
}

// NewSchema builds the schema of an object with these fields; a bad pattern,
// type or repeated field is an error.
func NewSchema(fields ...Field) (*Schema, error) {
	props := map[string]any{}
	var order, required []string
	for _, f := range fields {
		if f.Name == "" || props[f.Name] != nil {
			return nil, fmt.Errorf("schema: field %q is empty or repeated", f.Name)
		}
		switch f.Type {
		case FieldString, FieldNumber, FieldInteger, FieldBoolean, FieldObject, FieldArray:
		default:
			return nil, fmt.Errorf("schema: field %q has unknown type %q", f.Name, f.Type)
		}
		p := map[string]any{"type": string(f.Type)}
		if f.Type == FieldInteger {
			p["minimum"], p["maximum"] = -maxSafeInteger, maxSafeInteger
		}
		if f.Nullable {
			p["type"] = []any{string(f.Type), "null"}
		}
		if f.MinLength > 0 {
			p["minLength"] = f.MinLength
		}
		if f.MaxLength > 0 {
			p["maxLength"] = f.MaxLength
		}
		if f.Pattern != "" {
			p["pattern"] = f.Pattern
		}
		if len(f.Enum) > 0 {
			enum := make([]any, len(f.Enum))
			for i, e := range f.Enum {
				enum[i] = e
			}
			p["enum"] = enum
		}
		if f.MaxBytes > 0 {
			p[maxBytesKeyword] = f.MaxBytes
		}
		props[f.Name] = p
		order = append(order, f.Name)
		if f.Required {
			required = append(required, f.Name)
		}
	}
	doc := map[string]any{"type": "object", "additionalProperties": false, "properties": props}
	if len(required) > 0 {
		doc["required"] = toAny(required)
	}
	return compileSchema(doc, order)
}

// SchemaFor derives the schema of a Go input type from its struct tags.
func SchemaFor(t reflect.Type) (*Schema, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("schema: input type %s is not a struct", t)
	}
	r := &jsonschema.Reflector{DoNotReference: true, ExpandedStruct: true, RequiredFromJSONSchemaTags: true, Anonymous: true}
	s, doc, err := reflectSchema(r, t)
	if err != nil {
		return nil, fmt.Errorf("schema of %s: %w", t, err)
	}
	if _, ok := doc["properties"]; !ok {
		doc["properties"] = map[string]any{}
	}
	var order []string
	if s.Properties != nil {
		for p := s.Properties.Oldest(); p != nil; p = p.Next() {
			order = append(order, p.Key)
		}
	}
	return compileSchema(doc, order)
}

// OutputSchemaFor describes the answer of type t as a JSON Schema (draft
// 2020-12) document, with the reflector and tags of the input schemas: a
// field without omitempty is always present, other fields are allowed (an
// answer may grow), and a type that marshals itself is any JSON value.
func OutputSchemaFor(t reflect.Type) (map[string]any, error) {
	marshaler := reflect.TypeFor[json.Marshaler]()
	r := &jsonschema.Reflector{DoNotReference: true, ExpandedStruct: true, Anonymous: true, AllowAdditionalProperties: true,
		Mapper: func(t reflect.Type) *jsonschema.Schema {
			if t == reflect.TypeFor[time.Time]() {
				return nil
			}
			if t == reflect.TypeFor[json.RawMessage]() || t.Implements(marshaler) || reflect.PointerTo(t).Implements(marshaler) {
				return &jsonschema.Schema{Description: "Any JSON value."}
			}
			return nil
		}}
	_, doc, err := reflectSchema(r, t)
	if err != nil {
		return nil, fmt.Errorf("output schema of %s: %w", t, err)
	}
	return doc, nil
}

// reflectSchema is t's schema as r reflects it with the project's tags
// applied, and the same schema as a JSON document.
func reflectSchema(r *jsonschema.Reflector, t reflect.Type) (*jsonschema.Schema, map[string]any, error) {
	s := r.ReflectFromType(t)
	s.Version = ""
	if err := applyTags(t, s); err != nil {
		return nil, nil, err
	}
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, nil, err
	}
	return s, doc, nil
}

// Enumerated is a string type whose values are a closed set: a field of it
// takes those values only, so the set is written once, next to its type.
type Enumerated interface{ Enum() []string }

// applyTags adds what our tags say to the reflected schema of t, walking
// nested structs, slices, maps and pointers, and turns invopop's nullable
// oneOf into a type list so a wrong value reports its own reason.
func applyTags(t reflect.Type, s *jsonschema.Schema) error {
	if s == nil {
		return nil
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return nil
		}
		enumerate(t.Elem(), s.Items)
		return applyTags(t.Elem(), s.Items)
	case reflect.Map:
		return applyTags(t.Elem(), s.AdditionalProperties)
	case reflect.Struct:
	default:
		return nil
	}
	if s.Properties == nil {
		return nil
	}
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() || f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		p, ok := s.Properties.Get(name)
		if !ok {
			continue
		}
		if len(p.OneOf) == 2 && p.OneOf[1].Type == "null" {
			inner := p.OneOf[0]
			inner.Extras = map[string]any{"type": []any{inner.Type, "null"}}
			inner.Type = ""
			p = inner
			s.Properties.Set(name, p)
		}
		if id := f.Tag.Get("id"); id != "" {
			pattern, maxLen := idGrammar(id)
			p.Pattern, p.MaxLength = pattern, &maxLen
		}
		if n := f.Tag.Get("maxBytes"); n != "" {
			v, err := strconv.Atoi(n)
			if err != nil || v <= 0 {
				return fmt.Errorf("schema: %s.%s: maxBytes %q is not a positive integer", t, f.Name, n)
			}
			if p.Extras == nil {
				p.Extras = map[string]any{}
			}
			p.Extras[maxBytesKeyword] = v
		}
		unit, err := unitOf(f, name)
		if err != nil {
			return err
		}
		if unit != "" {
			if p.Extras == nil {
				p.Extras = map[string]any{}
			}
			p.Extras[unitKeyword] = unit
			if p.Description == "" {
				p.Description = unitDescriptions[unit]
			}
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		enumerate(ft, p)
		if k := ft.Kind(); k >= reflect.Int && k <= reflect.Uint64 && p.Minimum == "" && p.Maximum == "" {
			p.Minimum, p.Maximum = json.Number(strconv.Itoa(-maxSafeInteger)), json.Number(strconv.Itoa(maxSafeInteger))
		}
		if err := applyTags(f.Type, p); err != nil {
			return err
		}
	}
	return nil
}

// enumerate gives a schema of an Enumerated type its values, unless a tag
// already named them.
func enumerate(t reflect.Type, s *jsonschema.Schema) {
	if s == nil || len(s.Enum) > 0 {
		return
	}
	if e, ok := reflect.Zero(t).Interface().(Enumerated); ok {
		for _, v := range e.Enum() {
			s.Enum = append(s.Enum, v)
		}
	}
}

// idGrammar is the pattern and length of an id of this prefix ("tenant":
// a tenant id, whose grammar idempotency keys share).
func idGrammar(prefix string) (string, uint64) {
	if prefix == "tenant" {
		return tenantIDPattern, 128
	}
	return "^" + prefix + "_" + idBodyPattern + "$", uint64(len(prefix) + 1 + 52)
}

func compileSchema(doc map[string]any, order []string) (*Schema, error) {
	raw, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	// The validator wants numbers as json.Number.
	normalized, err := validator.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := validator.NewCompiler()
	c.DefaultDraft(validator.Draft2020)
	c.RegisterVocabulary(maxBytesVocabulary())
	c.AssertVocabs()
	if err := c.AddResource("input.json", normalized); err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	compiled, err := c.Compile("input.json")
	if err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	s := &Schema{doc: doc, order: order, fields: map[string]Field{}, compiled: compiled}
	props, _ := doc["properties"].(map[string]any)
	required, _ := doc["required"].([]any)
	for _, name := range order {
		p, _ := props[name].(map[string]any)
		s.fields[name] = fieldOf(name, p, slices.Contains(required, any(name)))
	}
	return s, nil
}

// fieldOf is a top-level property's summary.
func fieldOf(name string, p map[string]any, required bool) Field {
	f := Field{Name: name, Required: required}
	switch t := p["type"].(type) {
	case string:
		f.Type = FieldType(t)
	case []any:
		for _, x := range t {
			if x == "null" {
				f.Nullable = true
			} else if s, ok := x.(string); ok {
				f.Type = FieldType(s)
			}
		}
	}
	f.MinLength = intOf(p["minLength"])
	f.MaxLength = intOf(p["maxLength"])
	f.MaxBytes = intOf(p[maxBytesKeyword])
	f.Pattern, _ = p["pattern"].(string)
	if enum, ok := p["enum"].([]any); ok {
		for _, e := range enum {
			if s, ok := e.(string); ok {
				f.Enum = append(f.Enum, s)
			}
		}
	}
	return f
}

func intOf(v any) int {
	switch n := v.(type) {
	case float64:
		return int(n)
	case int:
		return n
	case json.Number:
		i, _ := n.Int64()
		return int(i)
	}
	return 0
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// Fields returns the top-level fields in declaration order.
func (s *Schema) Fields() []Field {
	out := make([]Field, 0, len(s.order))
	for _, name := range s.order {
		f := s.fields[name]
		f.Enum = slices.Clone(f.Enum)
		out = append(out, f)
	}
	return out
}

// Field returns one top-level field by name.
func (s *Schema) Field(name string) (Field, bool) {
	f, ok := s.fields[name]
	f.Enum = slices.Clone(f.Enum)
	return f, ok
}

// Document returns a copy of the JSON Schema document.
func (s *Schema) Document() map[string]any {
	raw, _ := json.Marshal(s.doc)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return out
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
// The first failure is INVALID_INPUT with details.field (dotted for nested
// fields) and details.reason (encoding, required, unknown, type, minLength, maxLength,
// pattern, enum, range, minItems, maxItems, maxProperties, maxBytes, ...).
// Unknown top-level fields are reported first, then the fields in
// declaration order.
func (s *Schema) Validate(input json.RawMessage) *Error {
	_, err := s.ValidateObject(input)
	return err
}

// ValidateObject is Validate answering, when the input is valid, its
// top-level fields as the validator decoded them (strings, json.Number,
// maps, slices), so a caller that reads a few fields need not decode the
// input again.
func (s *Schema) ValidateObject(input json.RawMessage) (map[string]any, *Error) {
	v, e := s.validate(input)
	if e != nil {
		return nil, e
	}
	fields, _ := v.(map[string]any)
	return fields, nil
}

func (s *Schema) validate(input json.RawMessage) (any, *Error) {
	trimmed := bytes.TrimSpace(input)
	if len(trimmed) == 0 || string(trimmed) == "null" {
		trimmed = []byte("{}")
	}
	if trimmed[0] != '{' {
		return nil, invalidField("", "type", "input must be a JSON object")
	}
	if e := checkText(trimmed); e != nil {
		return nil, e
	}
	v, err := validator.UnmarshalJSON(bytes.NewReader(trimmed))
	if err != nil {
		return nil, Wrap(CodeInvalidInput, err, "input is not a valid JSON object").WithDetails(map[string]any{"field": "", "reason": "type"})
	}
	verr := s.compiled.Validate(v)
	if verr == nil {
		return v, nil
	}
	ve, ok := verr.(*validator.ValidationError)
	if !ok {
		return nil, Wrap(CodeInvalidInput, verr, "input is not valid")
	}
	var leaves []failure
	collect(ve, &leaves)
	if len(leaves) == 0 {
		return nil, Wrap(CodeInvalidInput, verr, "input is not valid").WithDetails(map[string]any{"field": "", "reason": "invalid"})
	}
	slices.SortStableFunc(leaves, func(a, b failure) int { return s.rank(a) - s.rank(b) })
	f := leaves[0]
	e := invalidField(strings.Join(f.path, "."), f.reason, f.message)
	if hint := s.unitHint(f, v); hint != "" {
		e = e.WithDetails(map[string]any{"hint": hint})
	}
	return nil, e
}

// unitHint explains a seconds field out of range whose value, read as
// milliseconds, would fit: the usual mistake of sending 3600000 for an hour.
func (s *Schema) unitHint(f failure, input any) string {
	if f.reason != "range" || len(f.path) == 0 {
		return ""
	}
	p, value := s.doc, input
	for _, name := range f.path {
		props, _ := p["properties"].(map[string]any)
		p, _ = props[name].(map[string]any)
		obj, _ := value.(map[string]any)
		value = obj[name]
		if p == nil {
			return ""
		}
	}
	n, ok := value.(json.Number)
	if !ok || p[unitKeyword] != UnitSeconds {
		return ""
	}
	v, err := n.Int64()
	if err != nil || v <= 0 {
		return ""
	}
	if maxV, ok := p["maximum"]; ok && float64(v) > num(maxV) && float64(v/1000) <= num(maxV) && v/1000 > 0 {
		field := f.path[len(f.path)-1]
		return fmt.Sprintf("%s is seconds, not milliseconds; did you mean %d?", field, v/1000)
	}
	return ""
}

// num reads a schema's number however the document holds it.
func num(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case int:
		return float64(n)
	case json.Number:
		f, _ := n.Float64()
		return f
	}
	return 0
}

// failure is one leaf of the validator's error tree.
type failure struct {
	path            []string
	reason, message string
}

var printer = message.NewPrinter(message.MatchLanguage("en"))

// collect flattens the error tree: a required or additionalProperties error
// becomes one failure per field it names.
func collect(e *validator.ValidationError, out *[]failure) {
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			collect(c, out)
		}
		return
	}
	at := slices.Clone(e.InstanceLocation)
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		for _, m := range k.Missing {
			p := append(slices.Clone(at), m)
			*out = append(*out, failure{p, "required", strings.Join(p, ".") + " is required"})
		}
	case *kind.AdditionalProperties:
		for _, name := range k.Properties {
			p := append(slices.Clone(at), name)
			*out = append(*out, failure{p, "unknown", strings.Join(p, ".") + " is not a field of this method"})
		}
	default:
		name := strings.Join(at, ".")
		if name == "" {
			name = "input"
		}
		*out = append(*out, failure{at, reasonOf(e.ErrorKind), name + ": " + e.ErrorKind.LocalizedString(printer)})
	}
}

// reasonOf names a keyword failure the way details.reason does.
func reasonOf(k validator.ErrorKind) string {
	if _, ok := k.(*maxBytesExceeded); ok {
		return "maxBytes"
	}
	return SchemaReason(k)
}

// SchemaReason names a JSON Schema keyword failure the way details.reason
// does: type, enum, range, else the failing keyword.
func SchemaReason(k validator.ErrorKind) string {
	switch k.(type) {
	case *kind.Type:
		return "type"
	case *kind.Enum, *kind.Const:
		return "enum"
	case *kind.Minimum, *kind.Maximum, *kind.ExclusiveMinimum, *kind.ExclusiveMaximum:
		return "range"
	}
	if p := k.KeywordPath(); len(p) > 0 {
		return p[len(p)-1]
	}
	return "invalid"
}

// reasonOrder breaks ties between failures of one field: the kind of value
// first, then its length, then its form.
var reasonOrder = []string{"required", "unknown", "type", "minLength", "maxLength", "pattern", "enum"}

// SchemaReasonRank orders the reasons of one field's failures (lower first).
func SchemaReasonRank(reason string) int {
	if i := slices.Index(reasonOrder, reason); i >= 0 {
		return i
	}
	return len(reasonOrder)
}

// rank orders failures: unknown top-level fields first, then by the field's
// declaration order, then by reason.
func (s *Schema) rank(f failure) int {
	top := len(s.order)
	if len(f.path) > 0 {
		if i := slices.Index(s.order, f.path[0]); i >= 0 {
			top = i
		}
	}
	if len(f.path) == 1 && f.reason == "unknown" {
		top = -1
	}
	return (top+1)*10_000 + len(f.path)*100 + SchemaReasonRank(f.reason)
}

func invalidField(field, reason, msg string) *Error {
	return Errorf(CodeInvalidInput, "%s", msg).WithDetails(map[string]any{"field": field, "reason": reason})
}

// The x-maxBytes keyword, as a vocabulary of the validator.

type maxBytesExceeded struct{ got, max int }

func (*maxBytesExceeded) KeywordPath() []string { return []string{maxBytesKeyword} }

func (k *maxBytesExceeded) LocalizedString(*message.Printer) string {
	return fmt.Sprintf("%d bytes of JSON, at most %d", k.got, k.max)
}

type maxBytes int

func (m maxBytes) Validate(ctx *validator.ValidatorContext, v any) {
	raw, err := json.Marshal(v)
	if err != nil {
		ctx.AddErr(err)
		return
	}
	if len(raw) > int(m) {
		ctx.AddError(&maxBytesExceeded{got: len(raw), max: int(m)})
	}
}

func maxBytesVocabulary() *validator.Vocabulary {
	return &validator.Vocabulary{
		URL: "https://better-compute.dev/schema/max-bytes",
		Compile: func(_ *validator.CompilerContext, obj map[string]any) (validator.SchemaExt, error) {
			v, ok := obj[maxBytesKeyword]
			if !ok {
				return nil, nil
			}
			n, ok := v.(json.Number)
			if !ok {
				return nil, fmt.Errorf("%s must be a number", maxBytesKeyword)
			}
			i, err := n.Int64()
			if err != nil || i <= 0 {
				return nil, fmt.Errorf("%s must be a positive integer", maxBytesKeyword)
			}
			return maxBytes(i), nil
		},
	}
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
	pattern, maxLen := idGrammar(prefix)
	return Field{Name: name, Type: FieldString, Required: required, MaxLength: int(maxLen), Pattern: pattern}
}

// IdempotencyKeyField is the key a request-derived id is computed from.
func IdempotencyKeyField() Field {
	return Field{Name: "idempotencyKey", Type: FieldString, Required: true, MaxLength: 128, Pattern: tenantIDPattern}
}

package cloudresources

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	validator "github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/message"

	"github.com/better-compute/better-compute/core"
)

// Families a kind belongs to (the decision attribute resource.family).
const (
	FamilyData          = "data"
	FamilyPlatform      = "platform"
	FamilyAI            = "ai"
	FamilyStorage       = "storage"
	FamilyNetwork       = "network"
	FamilyEdge          = "edge"
	FamilyObservability = "observability"
)

// Families are every family, in the spec's order.
func Families() []string {
	return []string{FamilyData, FamilyPlatform, FamilyAI, FamilyStorage, FamilyNetwork, FamilyEdge, FamilyObservability}
}

// MaxSpecBytes bounds a spec's JSON.
const MaxSpecBytes = 64 << 10

// kindPattern is the grammar of a kind name (the create input's).
var kindPattern = regexp.MustCompile(`^[a-z0-9]+(?:[.-][a-z0-9]+)*$`)

const maxKindLength = 64

// Manifest describes one kind, as the kinds method answers it. It is data:
// a provider ships one JSON file per kind, loaded by LoadKinds.
type Manifest struct {
	Kind        string `json:"kind"`
	Family      string `json:"family"`
	Description string `json:"description"`
	// Spec is the JSON Schema (draft 2020-12) of the kind's spec.
	Spec json.RawMessage `json:"spec"`
	// Outputs are the plain values the provider reports (a host, a port).
	Outputs []string `json:"outputs"`
	// SecretOutputs are sealed values (a password, a URI embedding it).
	SecretOutputs []string `json:"secretOutputs"`
	// Regional kinds have a required spec.region.
	Regional bool `json:"regional"`
	// Updatable are the top-level spec fields a change applies in place;
	// a change to any other field replaces the resource.
	Updatable []string `json:"updatable"`
	Meters    []Meter  `json:"meters"`
	// Parent is the kind this one lives in ("" for none).
	Parent string `json:"parent,omitempty"`
	// Identity, for a kind with a parent, allows one live resource of it
	// per parent and identity value.
	Identity *Identity `json:"identity,omitempty"`
	// Preview kinds need previews enabled on the account.
	Preview bool `json:"preview"`
	// Releasable is false for a kind the provider owns by its name rather
	// than by labels, which release cannot hand back.
	Releasable bool `json:"releasable"`
	// Books, when set, is the capacity quota a resource of the kind books.
	Books *Books `json:"books,omitempty"`
	// References are the spec fields naming objects outside the resource
	// (AccountWide, Instances, Networks read them).
	References References `json:"references"`

	schema *validator.Schema
}

// Meter is one of a kind's own usage meters, billed only when the
// operator names it in the module's kindMeters.
type Meter struct {
	Name        string `json:"name"`
	Unit        string `json:"unit"`
	Description string `json:"description"`
}

// Identity is a kind's identity within its parent: the value of Field (a
// database user's name), or with no Field one per parent (a cluster's
// single firewall).
type Identity struct {
	Field string `json:"field,omitempty"`
}

// Books is the capacity quota a kind books: PerReplica's count for the
// spec's value of its field, times the largest of the Replicas fields.
type Books struct {
	// Quota is the quota key booked on the pool ("gpu").
	Quota      string     `json:"quota"`
	PerReplica PerReplica `json:"perReplica"`
	Replicas   []string   `json:"replicas"`
}

// PerReplica reads the amount one replica books from a spec field.
type PerReplica struct {
	Field  string         `json:"field"`
	Counts map[string]int `json:"counts"`
}

// Booking is the amount of a quota one spec books.
type Booking struct {
	Quota  string
	Amount int
}

// KindSet is a provider's loaded, checked manifests.
type KindSet struct {
	byKind map[string]*Manifest
	order  []string
}

// Lookup answers the manifest of kind.
func (s *KindSet) Lookup(kind string) (*Manifest, bool) {
	m, ok := s.byKind[kind]
	return m, ok
}

// All answers the manifests in kind order.
func (s *KindSet) All() []*Manifest {
	out := make([]*Manifest, 0, len(s.order))
	for _, k := range s.order {
		out = append(out, s.byKind[k])
	}
	return out
}

// LoadKinds reads every *.json file at the root of fsys as a manifest
// named by its kind (do.database.pg.json), compiles each spec schema and
// checks the set: a defect is an error naming the file.
func LoadKinds(fsys fs.FS) (*KindSet, error) {
	names, err := fs.Glob(fsys, "*.json")
	if err != nil {
		return nil, fmt.Errorf("cloudresources: listing manifests: %w", err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("cloudresources: no manifest")
	}
	set := &KindSet{byKind: map[string]*Manifest{}}
	for _, name := range names {
		raw, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("cloudresources: %s: %w", name, err)
		}
		m, err := parseManifest(raw)
		if err != nil {
			return nil, fmt.Errorf("cloudresources: %s: %w", name, err)
		}
		if want := strings.TrimSuffix(path.Base(name), ".json"); m.Kind != want {
			return nil, fmt.Errorf("cloudresources: %s: kind %q, the file names %q", name, m.Kind, want)
		}
		set.byKind[m.Kind] = m
		set.order = append(set.order, m.Kind)
	}
	sort.Strings(set.order)
	for _, m := range set.byKind {
		if m.Parent == "" {
			continue
		}
		p, ok := set.byKind[m.Parent]
		if !ok {
			return nil, fmt.Errorf("cloudresources: %s: parent kind %q is not in the set", m.Kind, m.Parent)
		}
		if p.Parent != "" {
			return nil, fmt.Errorf("cloudresources: %s: parent kind %q has a parent itself", m.Kind, m.Parent)
		}
	}
	return set, nil
}

// parseManifest decodes one manifest, refusing unknown fields, and checks
// it on its own.
func parseManifest(raw []byte) (*Manifest, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("decoding: %w", err)
	}
	if !kindPattern.MatchString(m.Kind) || len(m.Kind) > maxKindLength {
		return nil, fmt.Errorf("kind %q is not a kind name", m.Kind)
	}
	if !slices.Contains(Families(), m.Family) {
		return nil, fmt.Errorf("family %q is not one of %v", m.Family, Families())
	}
	schema, props, required, err := compileSpec(m.Kind, m.Spec)
	if err != nil {
		return nil, err
	}
	m.schema = schema
	if m.Regional && (props["region"] == nil || !slices.Contains(required, "region")) {
		return nil, fmt.Errorf("a regional kind's spec requires region")
	}
	for _, f := range m.Updatable {
		if props[f] == nil {
			return nil, fmt.Errorf("updatable field %q is not a property of the spec", f)
		}
	}
	if err := distinctNames(m.Outputs, m.SecretOutputs); err != nil {
		return nil, err
	}
	meters := make([]string, 0, len(m.Meters))
	for _, mt := range m.Meters {
		if mt.Name == "" || mt.Unit == "" {
			return nil, fmt.Errorf("a meter needs a name and a unit")
		}
		meters = append(meters, mt.Name)
	}
	if err := distinctNames(meters); err != nil {
		return nil, err
	}
	if m.Identity != nil {
		if m.Parent == "" {
			return nil, fmt.Errorf("an identity within a parent needs a parent kind")
		}
		if f := m.Identity.Field; f != "" && (props[f] == nil || !slices.Contains(required, f)) {
			return nil, fmt.Errorf("identity field %q is not a required property of the spec", f)
		}
	}
	if m.Books != nil {
		if err := checkBooks(m.Books, props, required); err != nil {
			return nil, err
		}
	}
	var doc map[string]any
	if err := json.Unmarshal(m.Spec, &doc); err != nil {
		return nil, fmt.Errorf("spec schema: %w", err)
	}
	if err := checkReferences(m.References, doc); err != nil {
		return nil, err
	}
	return &m, nil
}

// compileSpec compiles a spec schema, which must describe an object, and
// answers its top-level properties and required fields.
func compileSpec(kindName string, raw json.RawMessage) (*validator.Schema, map[string]any, []string, error) {
	doc, err := validator.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("spec schema: %w", err)
	}
	obj, _ := doc.(map[string]any)
	if obj == nil || obj["type"] != "object" {
		return nil, nil, nil, fmt.Errorf("spec schema: not an object's schema")
	}
	if obj["additionalProperties"] != false && obj["unevaluatedProperties"] != false {
		return nil, nil, nil, fmt.Errorf("spec schema: unknown fields must be refused")
	}
	props, _ := obj["properties"].(map[string]any)
	var required []string
	if list, ok := obj["required"].([]any); ok {
		for _, r := range list {
			if s, ok := r.(string); ok {
				required = append(required, s)
			}
		}
	}
	c := validator.NewCompiler()
	c.DefaultDraft(validator.Draft2020)
	c.AssertFormat()
	url := "kinds/" + kindName + ".json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, nil, nil, fmt.Errorf("spec schema: %w", err)
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("spec schema: %w", err)
	}
	return s, props, required, nil
}

func checkBooks(b *Books, props map[string]any, required []string) error {
	if b.Quota == "" || len(b.Replicas) == 0 {
		return fmt.Errorf("books: a quota and replica fields are required")
	}
	for _, f := range append([]string{b.PerReplica.Field}, b.Replicas...) {
		if props[f] == nil {
			return fmt.Errorf("books: field %q is not a property of the spec", f)
		}
	}
	if !slices.Contains(required, b.PerReplica.Field) || !slices.Contains(required, b.Replicas[0]) {
		return fmt.Errorf("books: the per-replica field and the first replicas field must be required")
	}
	// Every value the spec allows must have a count, so a valid spec
	// always books a known amount.
	p, _ := props[b.PerReplica.Field].(map[string]any)
	enum, _ := p["enum"].([]any)
	if len(enum) == 0 || len(enum) != len(b.PerReplica.Counts) {
		return fmt.Errorf("books: field %q must enumerate exactly the values of counts", b.PerReplica.Field)
	}
	for _, v := range enum {
		s, _ := v.(string)
		if n, ok := b.PerReplica.Counts[s]; !ok || n <= 0 {
			return fmt.Errorf("books: value %q of %q has no positive count", s, b.PerReplica.Field)
		}
	}
	return nil
}

func distinctNames(lists ...[]string) error {
	seen := map[string]bool{}
	for _, l := range lists {
		for _, n := range l {
			if n == "" || seen[n] {
				return fmt.Errorf("name %q is empty or repeated", n)
			}
			seen[n] = true
		}
	}
	return nil
}

// specField is how errors name a spec field: under "spec.", as the create
// input's field.
func specField(parts ...string) string {
	return strings.Join(append([]string{"spec"}, parts...), ".")
}

// Validate checks spec against the kind's schema. A refusal is
// INVALID_INPUT with details.field under "spec." (spec.size,
// spec.rules.0.type) and details.reason (required, unknown, type, enum,
// range, pattern, minLength, maxLength, minItems, maxItems, maxBytes...);
// the first failure by field path is reported.
func (m *Manifest) Validate(spec json.RawMessage) error {
	if m.schema == nil {
		return fmt.Errorf("cloudresources: the manifest of %q was not loaded by LoadKinds", m.Kind)
	}
	if len(spec) > MaxSpecBytes {
		return invalid("spec", "maxBytes", fmt.Sprintf("spec: %d bytes of JSON, at most %d", len(spec), MaxSpecBytes))
	}
	trimmed := bytes.TrimSpace(spec)
	if len(trimmed) == 0 {
		return invalid("spec", "required", "spec is required")
	}
	if trimmed[0] != '{' {
		return invalid("spec", "type", "spec must be a JSON object")
	}
	v, err := validator.UnmarshalJSON(bytes.NewReader(trimmed))
	if err != nil {
		return core.Wrap(core.CodeInvalidInput, err, "spec is not a valid JSON object").
			WithDetails(map[string]any{"field": "spec", "reason": "type"})
	}
	verr := m.schema.Validate(v)
	if verr == nil {
		return nil
	}
	ve, ok := verr.(*validator.ValidationError)
	if !ok {
		return core.Wrap(core.CodeInvalidInput, verr, "spec is not valid").
			WithDetails(map[string]any{"field": "spec", "reason": "invalid"})
	}
	var leaves []problem
	collect(ve, &leaves)
	if definite := slices.DeleteFunc(slices.Clone(leaves), func(p problem) bool { return p.unevaluated }); len(definite) > 0 {
		leaves = definite
	}
	if len(leaves) == 0 {
		return invalid("spec", "invalid", "spec is not valid")
	}
	slices.SortStableFunc(leaves, func(a, b problem) int {
		if c := strings.Compare(a.field, b.field); c != 0 {
			return c
		}
		return core.SchemaReasonRank(a.reason) - core.SchemaReasonRank(b.reason)
	})
	return invalid(leaves[0].field, leaves[0].reason, leaves[0].message)
}

func invalid(field, reason, msg string) *core.Error {
	return core.Errorf(core.CodeInvalidInput, "%s", msg).WithDetails(map[string]any{"field": field, "reason": reason})
}

type problem struct {
	field, reason, message string
	unevaluated            bool
}

var printer = message.NewPrinter(message.MatchLanguage("en"))

// collect flattens the validator's error tree; a required or unknown
// fields error becomes one problem per field it names.
func collect(e *validator.ValidationError, out *[]problem) {
	switch e.ErrorKind.(type) {
	case *kind.OneOf, *kind.AnyOf:
		// The branches' own failures (each a missing field) would name a
		// field the caller need not send; the choice itself failed.
		name := specField(e.InstanceLocation...)
		*out = append(*out, problem{field: name, reason: reasonOf(e.ErrorKind), message: name + ": " + e.ErrorKind.LocalizedString(printer)})
		return
	}
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			collect(c, out)
		}
		return
	}
	at := e.InstanceLocation
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		for _, f := range k.Missing {
			name := specField(append(slices.Clone(at), f)...)
			*out = append(*out, problem{field: name, reason: "required", message: name + " is required"})
		}
	case *kind.AdditionalProperties:
		for _, f := range k.Properties {
			name := specField(append(slices.Clone(at), f)...)
			*out = append(*out, problem{field: name, reason: "unknown", message: name + " is not a field of this kind"})
		}
	case *kind.FalseSchema:
		// unevaluatedProperties: false refuses each unknown field this way;
		// a known field also reads as unevaluated when the subschema that
		// declares it failed, so these count only when nothing else failed.
		name := specField(at...)
		*out = append(*out, problem{field: name, reason: "unknown", message: name + " is not a field of this kind", unevaluated: true})
	default:
		name := specField(at...)
		*out = append(*out, problem{field: name, reason: reasonOf(e.ErrorKind), message: name + ": " + e.ErrorKind.LocalizedString(printer)})
	}
}

// reasonOf is core.SchemaReason, with the failures a kind's own schemas
// use: a reserved value (not), a choice of branches (oneOf, anyOf).
func reasonOf(k validator.ErrorKind) string {
	switch k.(type) {
	case *kind.Not:
		return "reserved"
	case *kind.OneOf:
		return "oneOf"
	case *kind.AnyOf:
		return "anyOf"
	}
	return core.SchemaReason(k)
}

// ReplaceRequired names the fields ("spec.engine") that differ between
// oldSpec and newSpec and are not updatable in place, sorted; a field
// present in only one of them differs. A spec that is not a JSON object is
// reported as "spec", so it can never pass for an in-place change.
func (m *Manifest) ReplaceRequired(oldSpec, newSpec json.RawMessage) []string {
	var a, b map[string]any
	if json.Unmarshal(oldSpec, &a) != nil || json.Unmarshal(newSpec, &b) != nil || a == nil || b == nil {
		return []string{"spec"}
	}
	var out []string
	for f := range keys(a, b) {
		if slices.Contains(m.Updatable, f) {
			continue
		}
		va, inA := a[f]
		vb, inB := b[f]
		if inA != inB || !reflect.DeepEqual(va, vb) {
			out = append(out, specField(f))
		}
	}
	slices.Sort(out)
	return out
}

func keys(maps ...map[string]any) map[string]bool {
	out := map[string]bool{}
	for _, m := range maps {
		for k := range m {
			out[k] = true
		}
	}
	return out
}

// Booking answers what a valid spec books: PerReplica's count times the
// largest Replicas value (an absent one counts 0). A kind that books
// nothing answers the zero Booking.
func (m *Manifest) Booking(spec json.RawMessage) (Booking, error) {
	if m.Books == nil {
		return Booking{}, nil
	}
	var fields map[string]any
	if err := json.Unmarshal(spec, &fields); err != nil || fields == nil {
		return Booking{}, fmt.Errorf("cloudresources: %s: the spec is not a JSON object", m.Kind)
	}
	value, _ := fields[m.Books.PerReplica.Field].(string)
	perReplica, ok := m.Books.PerReplica.Counts[value]
	if !ok {
		return Booking{}, fmt.Errorf("cloudresources: %s: %s %q books no known amount", m.Kind, specField(m.Books.PerReplica.Field), value)
	}
	replicas := 0
	for _, f := range m.Books.Replicas {
		v, present := fields[f]
		if !present {
			continue
		}
		n, ok := v.(float64)
		if !ok || n < 0 || n != float64(int(n)) {
			return Booking{}, fmt.Errorf("cloudresources: %s: %s is not a count", m.Kind, specField(f))
		}
		replicas = max(replicas, int(n))
	}
	return Booking{Quota: m.Books.Quota, Amount: perReplica * replicas}, nil
}

// ProviderName is the provider-side name of a resource of this kind: the
// identity field's value for a kind named within its parent (a database
// user), else the spec's own name where the kind has one (a cluster
// adopted or created on the tenant's own account), else ResourceName.
func (m *Manifest) ProviderName(resourceID string, spec json.RawMessage) string {
	var fields map[string]any
	_ = json.Unmarshal(spec, &fields)
	if m.Identity != nil && m.Identity.Field != "" {
		if s, ok := fields[m.Identity.Field].(string); ok && s != "" {
			return s
		}
	}
	if s, ok := fields["name"].(string); ok && s != "" {
		return s
	}
	return ResourceName(resourceID)
}

package core

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// The IAM catalog: the resource types and actions compute contributes to
// Better IAM (spec: actions-and-resources.md "Resource types", "Actions",
// "Adding actions"). The core catalog is data (catalog.json) in the same shape
// as a plugin's fragment, so the core and every plugin merge by one set of rules.

// DefaultTypePrefix is the prefix of every resource type unless configured.
const DefaultTypePrefix = "compute-"

// Better IAM's limits, which the merge enforces.
const (
	MaxTypeAttributes = 64
	MaxTypeRelations  = 32
	MaxTypeNameLength = 64
)

// FleetID is the only id of the fleet scope type.
const FleetID = "global"

var (
	typePrefixPattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)
	actionPattern     = regexp.MustCompile(`^compute:[a-z][a-z0-9-]*(:[a-z][a-z0-9-]*)+$`)
	// Plugin ids become an action segment (compute:<pluginId>:), so they follow its grammar.
	pluginIDPattern = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	// Type names are written after the prefix in policies; same grammar as the prefix.
	typeNamePattern = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
)

// AttrType is the type of a declared attribute.
type AttrType string

const (
	AttrString  AttrType = "string"
	AttrNumber  AttrType = "number"
	AttrBoolean AttrType = "boolean"
)

func (t AttrType) valid() bool {
	return t == AttrString || t == AttrNumber || t == AttrBoolean
}

// TypeFragment is what one fragment says about one resource type. Every
// field is optional: a fragment that only adds actions to a type leaves the
// rest to the others (an empty Parent is no opinion, not "no parent").
type TypeFragment struct {
	Description string              `json:"description,omitempty"`
	Scope       bool                `json:"scope,omitempty"`
	Parent      string              `json:"parent,omitempty"` // without the prefix
	Relations   []string            `json:"relations,omitempty"`
	Attributes  map[string]AttrType `json:"attributes,omitempty"`
	Actions     []string            `json:"actions,omitempty"`
}

// Fragment is a catalog fragment: resource types by name, without the prefix.
type Fragment struct {
	ResourceTypes map[string]TypeFragment `json:"resourceTypes"`
}

// Plugin is a plugin's contribution to the catalog. Its actions must live
// under compute:<ID>:.
type Plugin struct {
	ID      string
	Catalog Fragment
}

// CatalogConfig configures NewCatalog.
type CatalogConfig struct {
	TypePrefix string // empty means DefaultTypePrefix
	Plugins    []Plugin
}

// Attribute is a declared attribute of a resource type.
type Attribute struct {
	Name string
	Type AttrType
}

// ResourceType is one merged resource type.
type ResourceType struct {
	Name        string // without the prefix, e.g. "pool"
	FullName    string // with the prefix, e.g. "compute-pool"
	Description string
	Scope       bool
	Parent      string // without the prefix; "" when the type has none
	Relations   []string
	Attributes  []Attribute // sorted by name
	Actions     []string    // sorted
	Sources     []string    // "core" and the ids of the plugins that contributed
}

// Action is one catalog action and the types that carry it.
type Action struct {
	Name    string
	Types   []string // without the prefix, sorted
	Sources []string
}

// Catalog is the merged, immutable catalog. Accessors return copies.
type Catalog struct {
	prefix  string
	types   map[string]ResourceType
	actions map[string]Action
}

// coreSource names the core fragment in Sources and messages.
const coreSource = "core"

//go:embed catalog.json
var coreCatalogJSON []byte

// coreFragment is decoded once at init; CoreFragment hands out copies.
var coreFragment, coreFragmentErr = decodeFragment(coreCatalogJSON)

func decodeFragment(data []byte) (Fragment, error) {
	var doc struct {
		Comment string `json:"_comment"`
		Fragment
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields() // a misspelt key in our own data is a defect
	if err := dec.Decode(&doc); err != nil {
		return Fragment{}, fmt.Errorf("catalog.json: %w", err)
	}
	return doc.Fragment, nil
}

// NewCatalog merges the core catalog and the plugins' fragments. Any breach
// of the merge rules is INVALID_CONFIG.
func NewCatalog(cfg CatalogConfig) (*Catalog, error) {
	if coreFragmentErr != nil {
		return nil, Wrap(CodeInvalidConfig, coreFragmentErr, "catalog: the core catalog does not decode")
	}
	prefix := cfg.TypePrefix
	if prefix == "" {
		prefix = DefaultTypePrefix
	}
	if !typePrefixPattern.MatchString(prefix) {
		return nil, Errorf(CodeInvalidConfig, "catalog: typePrefix %q must match %s", prefix, typePrefixPattern)
	}
	m := &merger{prefix: prefix, types: map[string]*mergedType{}, actions: map[string]map[string]bool{}}
	if err := m.add(coreSource, coreFragment); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, p := range cfg.Plugins {
		if !pluginIDPattern.MatchString(p.ID) || p.ID == coreSource {
			return nil, Errorf(CodeInvalidConfig, "catalog: plugin id %q must match %s and not be %q", p.ID, pluginIDPattern, coreSource)
		}
		if seen[p.ID] {
			return nil, Errorf(CodeInvalidConfig, "catalog: plugin %q is given twice", p.ID)
		}
		seen[p.ID] = true
		if err := m.add(p.ID, p.Catalog); err != nil {
			return nil, err
		}
	}
	return m.finish()
}

// DefaultCatalog is the core catalog with the default prefix and no plugins.
func DefaultCatalog() (*Catalog, error) { return NewCatalog(CatalogConfig{}) }

type mergedType struct {
	description string
	scope       bool
	parent      string
	parentFrom  string
	relations   map[string]bool
	attributes  map[string]AttrType
	attrFrom    map[string]string
	actions     map[string]bool
	sources     []string
}

type merger struct {
	prefix  string
	types   map[string]*mergedType
	actions map[string]map[string]bool // action -> sources
}

func (m *merger) add(source string, f Fragment) error {
	for _, name := range slices.Sorted(maps.Keys(f.ResourceTypes)) {
		if err := m.addType(source, name, f.ResourceTypes[name]); err != nil {
			return err
		}
	}
	return nil
}

func (m *merger) addType(source, name string, f TypeFragment) error {
	full := m.prefix + name
	if !typeNamePattern.MatchString(name) {
		return Errorf(CodeInvalidConfig, "catalog: %s: type name %q must match %s", source, name, typeNamePattern)
	}
	if len(full) > MaxTypeNameLength {
		return Errorf(CodeInvalidConfig, "catalog: %s: type %q is %d characters long, at most %d", source, full, len(full), MaxTypeNameLength)
	}
	t := m.types[name]
	if t == nil {
		t = &mergedType{relations: map[string]bool{}, attributes: map[string]AttrType{}, attrFrom: map[string]string{}, actions: map[string]bool{}}
		m.types[name] = t
	}
	t.sources = append(t.sources, source)
	if t.description == "" {
		t.description = f.Description
	}
	t.scope = t.scope || f.Scope
	if f.Parent != "" {
		if t.parent != "" && t.parent != f.Parent {
			return Errorf(CodeInvalidConfig, "catalog: %s: type %q has parent %q, but %s says %q",
				source, full, m.prefix+f.Parent, t.parentFrom, m.prefix+t.parent)
		}
		t.parent, t.parentFrom = f.Parent, source
	}
	for _, r := range f.Relations {
		t.relations[r] = true
	}
	for _, a := range slices.Sorted(maps.Keys(f.Attributes)) {
		typ := f.Attributes[a]
		if !typ.valid() {
			return Errorf(CodeInvalidConfig, "catalog: %s: attribute %q of type %q has type %q; want string, number or boolean",
				source, a, full, typ)
		}
		if have, ok := t.attributes[a]; ok && have != typ {
			return Errorf(CodeInvalidConfig, "catalog: %s: attribute %q of type %q is %s, but %s says %s",
				source, a, full, typ, t.attrFrom[a], have)
		}
		t.attributes[a], t.attrFrom[a] = typ, source
	}
	for _, a := range f.Actions {
		if !actionPattern.MatchString(a) {
			return Errorf(CodeInvalidConfig, "catalog: %s: action %q on type %q must match %s", source, a, full, actionPattern)
		}
		if source != coreSource && !strings.HasPrefix(a, "compute:"+source+":") {
			return Errorf(CodeInvalidConfig, "catalog: plugin %s: action %q on type %q must start with %q",
				source, a, full, "compute:"+source+":")
		}
		t.actions[a] = true
		if m.actions[a] == nil {
			m.actions[a] = map[string]bool{}
		}
		m.actions[a][source] = true
	}
	return nil
}

// finish checks what only the merged whole can show, then freezes it.
func (m *merger) finish() (*Catalog, error) {
	c := &Catalog{prefix: m.prefix, types: map[string]ResourceType{}, actions: map[string]Action{}}
	for _, name := range slices.Sorted(maps.Keys(m.types)) {
		t := m.types[name]
		full := m.prefix + name
		if len(t.attributes) > MaxTypeAttributes {
			return nil, Errorf(CodeInvalidConfig, "catalog: type %q has %d attributes, at most %d", full, len(t.attributes), MaxTypeAttributes)
		}
		if len(t.relations) > MaxTypeRelations {
			return nil, Errorf(CodeInvalidConfig, "catalog: type %q has %d relations, at most %d", full, len(t.relations), MaxTypeRelations)
		}
		if t.parent != "" && m.types[t.parent] == nil {
			return nil, Errorf(CodeInvalidConfig, "catalog: %s: the parent %q of type %q is not in the catalog",
				t.parentFrom, m.prefix+t.parent, full)
		}
		// A parent chain must end: Better IAM walks it for parentRelations.
		for p, hops := t.parent, 0; p != ""; p, hops = m.types[p].parent, hops+1 {
			if p == name || hops > len(m.types) {
				return nil, Errorf(CodeInvalidConfig, "catalog: type %q is its own ancestor", full)
			}
		}
		rt := ResourceType{
			Name: name, FullName: full, Description: t.description, Scope: t.scope, Parent: t.parent,
			Relations: slices.Sorted(maps.Keys(t.relations)),
			Actions:   slices.Sorted(maps.Keys(t.actions)),
			Sources:   t.sources,
		}
		for _, a := range slices.Sorted(maps.Keys(t.attributes)) {
			rt.Attributes = append(rt.Attributes, Attribute{Name: a, Type: t.attributes[a]})
		}
		c.types[name] = rt
		for _, a := range rt.Actions {
			act := c.actions[a]
			act.Name = a
			act.Types = append(act.Types, name) // names are visited sorted
			c.actions[a] = act
		}
	}
	for a, sources := range m.actions {
		act := c.actions[a]
		act.Sources = slices.Sorted(maps.Keys(sources))
		c.actions[a] = act
	}
	return c, nil
}

// Prefix is the configured type prefix.
func (c *Catalog) Prefix() string { return c.prefix }

// FullName returns the prefixed name of a type.
func (c *Catalog) FullName(name string) string { return c.prefix + name }

// ShortName strips the prefix from a full type name; false for a type of
// another prefix (those go to the host's fallback resolver).
func (c *Catalog) ShortName(full string) (string, bool) {
	name, ok := strings.CutPrefix(full, c.prefix)
	if !ok {
		return "", false
	}
	_, known := c.types[name]
	return name, known
}

// Type returns a type by its name without the prefix.
func (c *Catalog) Type(name string) (ResourceType, bool) {
	t, ok := c.types[name]
	return t.clone(), ok
}

// Types returns every type, sorted by name.
func (c *Catalog) Types() []ResourceType {
	out := make([]ResourceType, 0, len(c.types))
	for _, name := range slices.Sorted(maps.Keys(c.types)) {
		out = append(out, c.types[name].clone())
	}
	return out
}

// Action returns one action.
func (c *Catalog) Action(name string) (Action, bool) {
	a, ok := c.actions[name]
	return a.clone(), ok
}

// Actions returns every action, sorted by name.
func (c *Catalog) Actions() []Action {
	out := make([]Action, 0, len(c.actions))
	for _, name := range slices.Sorted(maps.Keys(c.actions)) {
		out = append(out, c.actions[name].clone())
	}
	return out
}

// Carries reports whether the type (without the prefix) carries the action.
func (c *Catalog) Carries(action, typeName string) bool {
	return slices.Contains(c.actions[action].Types, typeName)
}

func (t ResourceType) clone() ResourceType {
	t.Relations = slices.Clone(t.Relations)
	t.Attributes = slices.Clone(t.Attributes)
	t.Actions = slices.Clone(t.Actions)
	t.Sources = slices.Clone(t.Sources)
	return t
}

func (a Action) clone() Action {
	a.Types = slices.Clone(a.Types)
	a.Sources = slices.Clone(a.Sources)
	return a
}

package core

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// The method registry: every method of the API, what it is decided with and
// how its input is validated. The rows come from the embedded method table
// (methodtable.tsv, see methodtable.go); this file holds the types, the
// registry and the start-up check against the catalog.

// Kind says how the envelope decides a call (spec: "How a call is decided").
type Kind string

const (
	// KindRead makes one authorize, whose allows are cached.
	KindRead Kind = "read"
	// KindMutation makes one require, never cached, and writes an audit row.
	KindMutation Kind = "mutation"
	// KindAdmission is a mutation that first prepares its draft (or changed
	// row) in a transaction of its own and then requires on it (step 6).
	KindAdmission Kind = "admission"
)

// Mutates reports whether the kind changes state (admissions are mutations).
func (k Kind) Mutates() bool { return k == KindMutation || k == KindAdmission }

// IDSource says where the id of a decided-on resource comes from.
type IDSource string

const (
	IDGlobal IDSource = "global" // compute-fleet: always FleetID
	IDTenant IDSource = "tenant" // compute-tenant: the input's tenantId
	IDInput  IDSource = "input"  // an id field of the input, e.g. poolId
	IDDraft  IDSource = "draft"  // the resource the call would create: derived from tenant, caller and idempotencyKey
	IDItem   IDSource = "item"   // each item the input names (per-item decisions)
)

// ResourceRef is a decided-on resource: its type and where its id comes from.
type ResourceRef struct {
	Type   string // without the prefix, e.g. "pool"
	Source IDSource
	Field  string // the input field holding the id (IDTenant, IDInput)
	Prefix string // the id's prefix (IDInput, IDDraft, IDItem); "" for scopes
	// OwnerTenantOnly: decided only in the resource's owning tenant, never
	// through an offer (metal.discovered).
	OwnerTenantOnly bool
}

// Condition selects one of several alternative decisions by the input.
// The zero Condition on the only alternative means "always".
type Condition struct {
	Field  string   // the input field it reads; "" when the spec names none
	Values []string // the values that select it; empty means "the field is present"
	Text   string   // the spec's words, or "otherwise"
}

// Decision is one IAM decision a method makes.
type Decision struct {
	Action   string
	Resource ResourceRef
	When     Condition
	// RootAlso: in the root tenant the same action is also decided on
	// compute-fleet/global ("plus compute-fleet in the root tenant").
	RootAlso bool
	// InputAttrs are input fields the decision carries as attributes of the
	// resource it would create ("with the requested sizeGiB").
	InputAttrs []string
	// PendingAttrs are input fields carried as pending attributes of an
	// existing resource ("with the new sizeGiB pending").
	PendingAttrs []string
}

// Extra is a further decision some calls make besides the main one.
type Extra struct {
	Name      string     // what it decides about: "secrets", "volumes", "nodes"
	When      string     // the spec's words for when it is made
	Each      bool       // once per item the input names
	Decisions []Decision // alternatives chosen by When; a single one always applies
}

// Method is one registered method.
type Method struct {
	Group   string // "reservations"
	Name    string // "create"
	Section string // the method table's section
	Kind    Kind
	Public  bool   // no credential, no decision
	Phase   string // "v0.1" …; "" when NoPlanRow
	// NoPlanRow: served, but the plan (§9.2) has no row for it, so no phase.
	NoPlanRow bool
	// Decisions is the one decision, or its alternatives chosen by input
	// ("or" in the table). Empty for public methods.
	Decisions []Decision
	// Items marks a list that follows the list recipe ("+ items"): every
	// item is decided with the method's action on ItemType.
	Items    bool
	ItemType string
	// Scopes are the owner scopes of an owner-scoped listing, the default
	// first ("mine", "all").
	Scopes []string
	Extras []Extra
	Host   string   // the module that hosts it when not its own ("tunnels")
	Notes  []string // the spec's remarks kept for the docs
	Plugin string   // the plugin that registers it; "" for compute's own
	Schema *Schema  // the input schema the envelope validates with
	Row    TableRow // the method-table row it came from; zero for plugin methods
}

// FullName is "group.name", the name calls and the table use.
func (m Method) FullName() string { return m.Group + "." + m.Name }

// Actions returns every action the method may decide with, sorted.
func (m Method) Actions() []string {
	set := map[string]bool{}
	m.eachDecision(func(d Decision) { set[d.Action] = true })
	return slices.Sorted(maps.Keys(set))
}

// eachDecision visits the main decisions and the extras' decisions.
func (m Method) eachDecision(f func(Decision)) {
	for _, d := range m.Decisions {
		f(d)
	}
	for _, x := range m.Extras {
		for _, d := range x.Decisions {
			f(d)
		}
	}
}

func (m Method) clone() Method {
	m.Decisions = cloneDecisions(m.Decisions)
	m.Scopes = slices.Clone(m.Scopes)
	m.Notes = slices.Clone(m.Notes)
	x := make([]Extra, len(m.Extras))
	for i, e := range m.Extras {
		e.Decisions = cloneDecisions(e.Decisions)
		x[i] = e
	}
	if m.Extras != nil {
		m.Extras = x
	}
	return m
}

func cloneDecisions(ds []Decision) []Decision {
	if ds == nil {
		return nil
	}
	out := make([]Decision, len(ds))
	for i, d := range ds {
		d.When.Values = slices.Clone(d.When.Values)
		d.InputAttrs = slices.Clone(d.InputAttrs)
		d.PendingAttrs = slices.Clone(d.PendingAttrs)
		out[i] = d
	}
	return out
}

// Registry is an immutable set of methods by full name.
type Registry struct {
	byName map[string]Method
	order  []string
}

// NewRegistry registers methods; a repeated name is INVALID_CONFIG.
func NewRegistry(methods ...Method) (*Registry, error) {
	r := &Registry{byName: make(map[string]Method, len(methods))}
	for _, m := range methods {
		name := m.FullName()
		if !methodNamePattern.MatchString(name) {
			return nil, Errorf(CodeInvalidConfig, "registry: method name %q must match %s", name, methodNamePattern)
		}
		if _, dup := r.byName[name]; dup {
			return nil, Errorf(CodeInvalidConfig, "registry: method %q is registered twice", name)
		}
		r.byName[name] = m.clone()
		r.order = append(r.order, name)
	}
	return r, nil
}

// TableRegistry registers every method of the method table.
func TableRegistry() (*Registry, error) {
	ms, err := TableMethods()
	if err != nil {
		return nil, err
	}
	return NewRegistry(ms...)
}

// Has reports whether a method of that full name is registered, without
// copying it (the envelope's metrics ask on every call).
func (r *Registry) Has(name string) bool {
	_, ok := r.byName[name]
	return ok
}

// Get returns a method by full name ("reservations.create").
func (r *Registry) Get(name string) (Method, bool) {
	m, ok := r.byName[name]
	return m.clone(), ok
}

// Methods returns every method in registration order.
func (r *Registry) Methods() []Method {
	out := make([]Method, 0, len(r.order))
	for _, name := range r.order {
		out = append(out, r.byName[name].clone())
	}
	return out
}

// Len is the number of methods.
func (r *Registry) Len() int { return len(r.order) }

// Warning codes CheckRegistry reports for `better-compute doctor`.
const (
	// WarnUndeclared: a non-plugin method with no method-table row (spec:
	// "Adding actions").
	WarnUndeclared = "catalog.undeclared"
	// WarnUnused: a catalog action that no registered method decides with.
	WarnUnused = "catalog.unused"
)

// Warning is a finding that does not stop start-up.
type Warning struct {
	Code    string
	Subject string // the method or action it is about
	Message string
}

// CheckRegistry checks the registry against the merged catalog and the
// method table, as initialize() does at start-up. A method whose action or
// type is not in the catalog (uncatalogued), or that disagrees with its
// table row (mismatch), is INVALID_CONFIG, with every finding listed under
// details.uncatalogued and details.mismatch.
func CheckRegistry(c *Catalog, r *Registry) ([]Warning, error) {
	rows, err := TableMethods()
	if err != nil {
		return nil, err
	}
	table := make(map[string]Method, len(rows))
	for _, m := range rows {
		table[m.FullName()] = m
	}
	var uncatalogued, mismatch []string
	var warnings []Warning
	used := map[string]bool{}
	for _, m := range r.Methods() {
		name := m.FullName()
		uncatalogued = append(uncatalogued, uncataloguedIn(c, m)...)
		m.eachDecision(func(d Decision) { used[d.Action] = true })
		row, ok := table[name]
		switch {
		case ok:
			if diff := registrationDiff(m, row); len(diff) > 0 {
				mismatch = append(mismatch, fmt.Sprintf("%s disagrees with its method-table row on %s", name, strings.Join(diff, ", ")))
			}
		case m.Plugin == "":
			warnings = append(warnings, Warning{Code: WarnUndeclared, Subject: name,
				Message: fmt.Sprintf("method %s is not a plugin's and has no method-table row", name)})
		}
	}
	for _, a := range c.Actions() {
		if !used[a.Name] {
			warnings = append(warnings, Warning{Code: WarnUnused, Subject: a.Name,
				Message: fmt.Sprintf("catalog action %s is decided by no registered method", a.Name)})
		}
	}
	if len(uncatalogued)+len(mismatch) > 0 {
		all := slices.Concat(uncatalogued, mismatch)
		return warnings, Errorf(CodeInvalidConfig, "registry does not match the catalog: %s", strings.Join(all, "; ")).
			WithDetails(map[string]any{"uncatalogued": uncatalogued, "mismatch": mismatch})
	}
	return warnings, nil
}

// uncataloguedIn lists every action, type or action-on-type pair of m that
// the catalog lacks: Better IAM would answer UNKNOWN_ACTION, a denial.
func uncataloguedIn(c *Catalog, m Method) []string {
	var out []string
	check := func(action, typ string) {
		if _, ok := c.Action(action); !ok {
			out = append(out, fmt.Sprintf("%s: action %s is not in the catalog", m.FullName(), action))
			return
		}
		if _, ok := c.Type(typ); !ok {
			out = append(out, fmt.Sprintf("%s: type %s is not in the catalog", m.FullName(), c.FullName(typ)))
			return
		}
		if !c.Carries(action, typ) {
			out = append(out, fmt.Sprintf("%s: type %s does not carry action %s", m.FullName(), c.FullName(typ), action))
		}
	}
	m.eachDecision(func(d Decision) {
		check(d.Action, d.Resource.Type)
		if d.RootAlso {
			check(d.Action, "fleet")
		}
	})
	if m.Items && len(m.Decisions) > 0 {
		check(m.Decisions[0].Action, m.ItemType)
	}
	return slices.Compact(out)
}

// registrationDiff names the parts of a registration that differ from the
// table's: everything the table decides, not the schema or the notes.
func registrationDiff(got, want Method) []string {
	got, want = normalized(got), normalized(want)
	var diff []string
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"kind", got.Kind, want.Kind},
		{"public", got.Public, want.Public},
		{"phase", [2]any{got.Phase, got.NoPlanRow}, [2]any{want.Phase, want.NoPlanRow}},
		{"decisions", got.Decisions, want.Decisions},
		{"items", [2]any{got.Items, got.ItemType}, [2]any{want.Items, want.ItemType}},
		{"scopes", got.Scopes, want.Scopes},
		{"extras", got.Extras, want.Extras},
		{"host", got.Host, want.Host},
	} {
		if !reflect.DeepEqual(f.got, f.want) {
			diff = append(diff, f.name)
		}
	}
	return diff
}

// normalized treats empty and nil slices alike, so a registration written
// by hand compares equal to the table's.
func normalized(m Method) Method {
	m = m.clone()
	norm := func(ds []Decision) []Decision {
		for i := range ds {
			ds[i].When.Values = nilIfEmpty(ds[i].When.Values)
			ds[i].InputAttrs = nilIfEmpty(ds[i].InputAttrs)
			ds[i].PendingAttrs = nilIfEmpty(ds[i].PendingAttrs)
		}
		return nilIfEmpty(ds)
	}
	m.Decisions = norm(m.Decisions)
	for i := range m.Extras {
		m.Extras[i].Decisions = norm(m.Extras[i].Decisions)
	}
	m.Extras = nilIfEmpty(m.Extras)
	m.Scopes = nilIfEmpty(m.Scopes)
	return m
}

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

// ActionOnType is one (action, resource type) pair a method decides on.
type ActionOnType struct {
	Action string
	Type   string // without the prefix
}

// DecisionPairs lists every distinct (action, type) pair the registry's
// methods decide on, sorted: what the authorization matrix tests.
func (r *Registry) DecisionPairs() []ActionOnType {
	seen := map[ActionOnType]bool{}
	for _, name := range r.order {
		r.byName[name].eachDecision(func(d Decision) { seen[ActionOnType{d.Action, d.Resource.Type}] = true })
	}
	out := slices.Collect(maps.Keys(seen))
	slices.SortFunc(out, func(a, b ActionOnType) int {
		return strings.Compare(a.Action+" "+a.Type, b.Action+" "+b.Type)
	})
	return out
}

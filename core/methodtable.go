package core

import (
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// The method table (methodtable.tsv, a copy of the spec's method-table.tsv)
// is the one source of the registry: every row is parsed at init and
// interpreted by the rules below. Formulaic cells ("compute-pool", "A or B",
// "+ items", "(the draft)", "none (public)") follow a small grammar; every
// prose cell is interpreted by an entry of proseRows keyed by its exact
// words, so a changed sentence fails the tests instead of being guessed at.

//go:embed methodtable.tsv
var methodTableTSV string

const tableHeader = "section\tmethod\taction\tdecided_on\tphase\tnote"

// TableRow is one row of the method table, as written.
type TableRow struct {
	Line      int // 1-based line in methodtable.tsv
	Section   string
	Method    string
	Action    string
	DecidedOn string
	Phase     string
	Note      string
}

// The table is parsed once; the results are never modified afterwards.
var tableRows, tableMethods, tableErr = loadTable(methodTableTSV)

// TableRows returns the rows of the method table.
func TableRows() ([]TableRow, error) {
	return slices.Clone(tableRows), tableErr
}

// TableMethods returns every row of the method table as a Method. The error
// lists every row that cannot be interpreted.
func TableMethods() ([]Method, error) {
	if tableErr != nil {
		return nil, tableErr
	}
	out := make([]Method, len(tableMethods))
	for i, m := range tableMethods {
		out[i] = m.clone()
	}
	return out, nil
}

var (
	methodNamePattern = regexp.MustCompile(`^([a-z][A-Za-z]*)\.([a-z][A-Za-z]*)$`)
	phasePattern      = regexp.MustCompile(`^v[0-9]+\.[0-9]+$`)
	// A decided-on alternative: a type, or "<action> on <type>" when the
	// alternative has its own action.
	altPattern = regexp.MustCompile(`^(?:(compute:[a-z0-9:-]+) on )?compute-([a-z-]+)$`)
)

// noPlanRowPhase is the phase cell of a method served without a plan row.
const noPlanRowPhase = "served, no §9.2 row"

// typeIDs says, per resource type, where a decision's id comes from: the
// spec's "Its id comes from the input: the pool for compute-pool, the tenant
// for compute-tenant, global for compute-fleet". Prefixes are domain-model.md's;
// the three sandbox-side prefixes are not in the spec and are chosen here.
var typeIDs = map[string]ResourceRef{
	"fleet":            {Source: IDGlobal},
	"tenant":           {Source: IDTenant, Field: "tenantId"},
	"project":          {Source: IDInput, Field: "projectId", Prefix: "prj"},
	"site":             {Source: IDInput, Field: "siteId", Prefix: "site"},
	"pool":             {Source: IDInput, Field: "poolId", Prefix: "pool"},
	"node":             {Source: IDInput, Field: "nodeId", Prefix: "node"},
	"reservation":      {Source: IDInput, Field: "reservationId", Prefix: "rsv"},
	"instance":         {Source: IDInput, Field: "instanceId", Prefix: "inst"},
	"image":            {Source: IDInput, Field: "imageId", Prefix: "img"},
	"profile":          {Source: IDInput, Field: "profileId", Prefix: "prof"},
	"provider-account": {Source: IDInput, Field: "providerAccountId", Prefix: "pacct"},
	"sandbox":          {Source: IDInput, Field: "sandboxId", Prefix: "sbx"},
	"sandbox-template": {Source: IDInput, Field: "templateId", Prefix: "tpl"},  // prefix not in the spec
	"sandbox-snapshot": {Source: IDInput, Field: "snapshotId", Prefix: "snap"}, // prefix not in the spec
	"sandbox-volume":   {Source: IDInput, Field: "volumeId", Prefix: "vol"},    // prefix not in the spec
	"cloud-resource":   {Source: IDInput, Field: "resourceId", Prefix: "crs"},
}

// ref is the resource of type t whose id the input names.
func ref(t string) ResourceRef {
	r := typeIDs[t]
	r.Type = t
	return r
}

// draft is the resource of type t the call would create (request-as-resource).
func draft(t string) ResourceRef {
	return ResourceRef{Type: t, Source: IDDraft, Prefix: typeIDs[t].Prefix}
}

// item is each resource of type t that the input names.
func item(t string) ResourceRef {
	return ResourceRef{Type: t, Source: IDItem, Prefix: typeIDs[t].Prefix}
}

// ownerTenantOnly marks a resource decided only in its owning tenant.
func ownerTenantOnly(r ResourceRef) ResourceRef {
	r.OwnerTenantOnly = true
	return r
}

// rowIAM is what a row's action and decided-on cells say.
type rowIAM struct {
	public    bool
	decisions []Decision
	extras    []Extra
	items     bool
	scopes    []string
	notes     []string
}

// The secrets and volume decisions of instances and sandbox templates.
func secretsExtra(when string) Extra {
	return Extra{Name: "secrets", When: when, Decisions: []Decision{
		{Action: "compute:secrets:manage", Resource: ref("tenant"), RootAlso: true},
	}}
}

func volumesExtra(when string) Extra {
	return Extra{Name: "volumes", When: when, Each: true, Decisions: []Decision{
		{Action: "compute:sandboxes:manage", Resource: item("sandbox-volume"), When: Condition{Text: "read-write mount"}},
		{Action: "compute:sandboxes:read", Resource: item("sandbox-volume"), When: Condition{Text: "read-only"}},
	}}
}

// proseRows interprets every row whose action or decided-on cell is prose,
// keyed by the exact (action, decided on) cells. Each entry must be used.
var proseRows = map[[2]string]rowIAM{
	{"compute:batches:approve (on top of the approver signatures, never instead of them)", "compute-tenant"}: {
		decisions: []Decision{{Action: "compute:batches:approve", Resource: ref("tenant")}},
		notes:     []string{"on top of the approver signatures, never instead of them"},
	},
	{"compute:sandboxes:manage, with the requested sizeGiB",
		"compute-sandbox-volume (the volume it would create, under its pool; 6cb30e9, was compute-tenant)"}: {
		decisions: []Decision{{Action: "compute:sandboxes:manage", Resource: draft("sandbox-volume"), InputAttrs: []string{"sizeGiB"}}},
		notes:     []string{"the volume it would create, under its pool", "6cb30e9: was decided on compute-tenant"},
	},
	{"compute:sandboxes:manage, with the new sizeGiB pending", "compute-sandbox-volume"}: {
		decisions: []Decision{{Action: "compute:sandboxes:manage", Resource: ref("sandbox-volume"), PendingAttrs: []string{"sizeGiB"}}},
	},
	{"compute:sandboxes:read", "compute-tenant (scope mine by default, or all)"}: {
		decisions: []Decision{{Action: "compute:sandboxes:read", Resource: ref("tenant")}},
		scopes:    []string{"mine", "all"},
	},
	{"compute:sites:read", "compute-site (the site's owning tenant only)"}: {
		decisions: []Decision{{Action: "compute:sites:read", Resource: ownerTenantOnly(ref("site"))}},
	},
	{"compute:nodes:provision", "compute-pool, then each node"}: {
		decisions: []Decision{{Action: "compute:nodes:provision", Resource: ref("pool")}},
		extras: []Extra{{Name: "nodes", When: "then each node", Each: true, Decisions: []Decision{
			{Action: "compute:nodes:provision", Resource: item("node")},
		}}},
	},
	{"compute:instances:create, and compute:secrets:manage when userData is a secret:// reference",
		"compute-instance (the draft); the secrets decision on compute-tenant, plus compute-fleet in the root tenant"}: {
		decisions: []Decision{{Action: "compute:instances:create", Resource: draft("instance")}},
		extras:    []Extra{secretsExtra("when userData is a secret:// reference")},
	},
	{"compute:sandboxes:manage, and compute:secrets:manage when it names secrets; for each volume it names, compute:sandboxes:manage (read-write mount) or compute:sandboxes:read (read-only)",
		"compute-tenant (the secrets decision also on compute-fleet in the root tenant; the volume decisions on each compute-sandbox-volume, 77bf9f5)"}: {
		decisions: []Decision{{Action: "compute:sandboxes:manage", Resource: ref("tenant")}},
		extras: []Extra{
			secretsExtra("when it names secrets"),
			volumesExtra("for each volume it names"),
		},
		notes: []string{"77bf9f5: the volume decisions"},
	},
	{"compute:sandboxes:manage, and compute:secrets:manage when the resulting template names secrets and the update changes them or what the guest runs; the per-volume decisions for a new volumes list, or for the current one when the update changes what the guest runs",
		"compute-sandbox-template (the secrets decision on compute-tenant, plus compute-fleet in the root tenant; the volume decisions on each compute-sandbox-volume)"}: {
		decisions: []Decision{{Action: "compute:sandboxes:manage", Resource: ref("sandbox-template")}},
		extras: []Extra{
			secretsExtra("when the resulting template names secrets and the update changes them or what the guest runs"),
			volumesExtra("for a new volumes list, or for the current one when the update changes what the guest runs"),
		},
	},
}

// choiceRules are the spec's words on how an "or" row chooses, where the
// choice is not simply "the alternative whose id the input names".
var choiceRules = map[string][]Condition{
	"sites.create": {
		{Field: "kind", Values: []string{"shared", "dedicated"}, Text: "for shared and dedicated sites"},
		{Field: "kind", Values: []string{"custom"}, Text: "for a tenant's custom site"},
	},
}

// ownerScoped lists take scope 'mine' | 'all', 'mine' by default (spec:
// "List methods and item filtering", step 3).
var ownerScoped = map[string]bool{"reservations.list": true, "instances.list": true}

// admissionMethods have an admission without creating anything (step 6).
var admissionMethods = map[string]bool{"reservations.extend": true}

// readVerbs are method names that only read, whatever their action's verb
// (e.g. webhooks.list under compute:webhooks:manage, fleet.plan under
// compute:fleet:admin). A method is a read when its actions are all :read
// or its name is one of these.
var readVerbs = map[string]bool{
	"get": true, "list": true, "status": true, "export": true, "plan": true,
	"deliveries": true, "eventTypes": true, "selfCheck": true,
}

// hostNotes maps a note cell to the module that hosts the method.
var hostNotes = map[string]string{"hosted by the tunnels module": "tunnels"}

// kindNotes maps a note cell to the kind the spec declares for the method.
var kindNotes = map[string]Kind{"kind: read": KindRead, "kind: mutation": KindMutation}

func loadTable(tsv string) ([]TableRow, []Method, error) {
	rows, errs := parseRows(tsv)
	usedProse := map[[2]string]bool{}
	var methods []Method
	byName := map[string]int{}
	for _, row := range rows {
		m, err := interpretRow(row, usedProse)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d (%s): %w", row.Line, row.Method, err))
			continue
		}
		if _, dup := byName[row.Method]; dup {
			errs = append(errs, fmt.Errorf("line %d: method %s is listed twice", row.Line, row.Method))
			continue
		}
		byName[row.Method] = len(methods)
		methods = append(methods, m)
	}
	// A "+ items" list decides each item on the type its group's get decides on.
	for i, m := range methods {
		if !m.Items {
			continue
		}
		get, ok := byName[m.Group+".get"]
		if !ok || len(methods[get].Decisions) != 1 {
			errs = append(errs, fmt.Errorf("line %d (%s): + items, but %s.get does not name the item type", m.Row.Line, m.FullName(), m.Group))
			continue
		}
		methods[i].ItemType = methods[get].Decisions[0].Resource.Type
	}
	for _, key := range slices.SortedFunc(maps.Keys(proseRows), func(a, b [2]string) int { return strings.Compare(a[0]+a[1], b[0]+b[1]) }) {
		if !usedProse[key] {
			errs = append(errs, fmt.Errorf("prose entry (%q, %q) matches no row", key[0], key[1]))
		}
	}
	for name := range explicitSchemas {
		if _, ok := byName[name]; !ok {
			errs = append(errs, fmt.Errorf("schema for %s, which is not in the table", name))
		}
	}
	if len(errs) > 0 {
		problems := make([]string, len(errs))
		for i, e := range errs {
			problems[i] = e.Error()
		}
		return rows, nil, Wrap(CodeInvalidConfig, errors.Join(errs...),
			fmt.Sprintf("method table: %d rows or entries cannot be interpreted", len(errs))).
			WithDetails(map[string]any{"problems": problems})
	}
	return rows, methods, nil
}

// parseRows splits the TSV: comment lines start with #, then the header,
// then rows of exactly six cells.
func parseRows(tsv string) ([]TableRow, []error) {
	var rows []TableRow
	var errs []error
	header := false
	for i, line := range strings.Split(strings.TrimSuffix(tsv, "\n"), "\n") {
		n := i + 1
		if strings.HasPrefix(line, "#") {
			continue
		}
		if !header {
			if line != tableHeader {
				errs = append(errs, fmt.Errorf("line %d: header is %q, want %q", n, line, tableHeader))
			}
			header = true
			continue
		}
		cells := strings.Split(line, "\t")
		if len(cells) != 6 {
			errs = append(errs, fmt.Errorf("line %d: %d cells, want 6: %q", n, len(cells), line))
			continue
		}
		rows = append(rows, TableRow{Line: n, Section: cells[0], Method: cells[1], Action: cells[2],
			DecidedOn: cells[3], Phase: cells[4], Note: cells[5]})
	}
	return rows, errs
}

func interpretRow(row TableRow, usedProse map[[2]string]bool) (Method, error) {
	parts := methodNamePattern.FindStringSubmatch(row.Method)
	if parts == nil {
		return Method{}, fmt.Errorf("method name %q must match %s", row.Method, methodNamePattern)
	}
	if row.Section == "" {
		return Method{}, errors.New("no section")
	}
	m := Method{Group: parts[1], Name: parts[2], Section: row.Section, Row: row}
	switch {
	case phasePattern.MatchString(row.Phase):
		m.Phase = row.Phase
	case row.Phase == noPlanRowPhase:
		m.NoPlanRow = true
	default:
		return Method{}, fmt.Errorf("phase %q is neither vN.N nor %q", row.Phase, noPlanRowPhase)
	}
	_, hasKindNote := kindNotes[row.Note]
	if host, ok := hostNotes[row.Note]; ok {
		m.Host = host
	} else if row.Note != "" && !hasKindNote {
		return Method{}, fmt.Errorf("note %q is not understood", row.Note)
	}

	key := [2]string{row.Action, row.DecidedOn}
	iam, prose := proseRows[key]
	if prose {
		usedProse[key] = true
	} else {
		var err error
		if iam, err = parseIAM(row.Action, row.DecidedOn); err != nil {
			return Method{}, err
		}
	}
	m.Public, m.Decisions, m.Extras, m.Items, m.Notes = iam.public, cloneDecisions(iam.decisions), iam.extras, iam.items, slices.Clone(iam.notes)
	m.Scopes = slices.Clone(iam.scopes)
	if ownerScoped[row.Method] {
		if !m.Items || m.Scopes != nil {
			return Method{}, errors.New("owner-scoped, but not a plain + items list")
		}
		m.Scopes = []string{"mine", "all"}
	}
	if m.Items && (len(m.Decisions) != 1 || (m.Decisions[0].Resource.Type != "tenant" && m.Decisions[0].Resource.Type != "project")) {
		return Method{}, errors.New("+ items must gate on one scope, compute-tenant or compute-project")
	}
	if err := checkRefs(m); err != nil {
		return Method{}, err
	}
	if err := chooseBy(&m); err != nil {
		return Method{}, err
	}

	fields := derivedFields(m)
	if explicit, ok := explicitSchemas[row.Method]; ok {
		fields = explicit
	}
	schema, err := NewSchema(fields...)
	if err != nil {
		return Method{}, err
	}
	return m.WithInput(schema)
}

// WithInput returns the method taking this input: a create whose input
// requires an idempotency key decides on the resource it would create (a
// draft, whose id derives from that key); the kind follows; and the input
// must carry every field the decisions read, at least as required.
func (m Method) WithInput(s *Schema) (Method, error) {
	m = m.clone()
	if len(m.Decisions) == 1 && actionVerb(m.Decisions[0].Action) == "create" && m.Decisions[0].Resource.Source == IDInput {
		if f, ok := s.Field("idempotencyKey"); ok && f.Required {
			m.Decisions[0].Resource = draft(m.Decisions[0].Resource.Type)
		}
	}
	m.Kind = deriveKind(m)
	if declared, ok := kindNotes[m.Row.Note]; ok && (declared == KindRead) != (m.Kind == KindRead) {
		return Method{}, fmt.Errorf("the spec says kind %s, the rules derive %s", declared, m.Kind)
	}
	if err := covers(s.Fields(), derivedFields(m)); err != nil {
		return Method{}, err
	}
	m.Schema = s
	return m, nil
}

// parseIAM reads formulaic action and decided-on cells.
func parseIAM(action, decided string) (rowIAM, error) {
	if action == "none (public)" {
		if decided != "nothing" {
			return rowIAM{}, fmt.Errorf("public, but decided on %q", decided)
		}
		return rowIAM{public: true}, nil
	}
	if !actionPattern.MatchString(action) {
		return rowIAM{}, fmt.Errorf("action cell %q is neither an action nor a known prose cell", action)
	}
	var iam rowIAM
	isDraft := false
	if t, ok := strings.CutSuffix(decided, " + items"); ok {
		decided, iam.items = t, true
	} else if t, ok := strings.CutSuffix(decided, " (the draft)"); ok {
		decided, isDraft = t, true
	}
	for _, alt := range strings.Split(decided, " or ") {
		parts := altPattern.FindStringSubmatch(alt)
		if parts == nil {
			return rowIAM{}, fmt.Errorf("decided-on cell %q is neither formulaic nor a known prose cell", decided)
		}
		d := Decision{Action: action, Resource: ref(parts[2])}
		if parts[1] != "" {
			d.Action = parts[1]
		}
		if isDraft {
			d.Resource = draft(parts[2])
		}
		iam.decisions = append(iam.decisions, d)
	}
	if len(iam.decisions) > 1 && (iam.items || isDraft) {
		return rowIAM{}, fmt.Errorf("decided-on cell %q mixes or with + items or a draft", decided)
	}
	return iam, nil
}

// checkRefs rejects a resource type the table names that typeIDs lacks.
func checkRefs(m Method) error {
	var err error
	m.eachDecision(func(d Decision) {
		if _, ok := typeIDs[d.Resource.Type]; !ok && err == nil {
			err = fmt.Errorf("unknown resource type compute-%s", d.Resource.Type)
		}
		if !actionPattern.MatchString(d.Action) && err == nil {
			err = fmt.Errorf("action %q does not match %s", d.Action, actionPattern)
		}
	})
	return err
}

// chooseBy fills the conditions of "or" alternatives: the spec's rule where
// it states one, else the alternative whose id the input names, the other
// being "otherwise". Where neither applies the handler chooses (Text empty).
func chooseBy(m *Method) error {
	if len(m.Decisions) < 2 {
		return nil
	}
	if rules, ok := choiceRules[m.FullName()]; ok {
		if len(rules) != len(m.Decisions) {
			return fmt.Errorf("choice rule has %d conditions for %d alternatives", len(rules), len(m.Decisions))
		}
		for i := range m.Decisions {
			m.Decisions[i].When = rules[i]
			m.Decisions[i].When.Values = slices.Clone(rules[i].Values)
		}
		return nil
	}
	named := 0
	for i, d := range m.Decisions {
		if d.Resource.Source == IDInput {
			m.Decisions[i].When = Condition{Field: d.Resource.Field}
			named++
		}
	}
	if named > 0 && named < len(m.Decisions) {
		for i, d := range m.Decisions {
			if d.Resource.Source != IDInput {
				m.Decisions[i].When = Condition{Text: "otherwise"}
			}
		}
	}
	return nil
}

func actionVerb(action string) string {
	return action[strings.LastIndex(action, ":")+1:]
}

// deriveKind applies "How a call is decided": admissions are request-as-
// resource creates, reservations.extend and creates with an idempotency key
// (all of which decide on a draft here); reads are methods whose actions
// all read, or whose name only reads.
func deriveKind(m Method) Kind {
	if m.Public {
		return KindRead
	}
	if admissionMethods[m.FullName()] {
		return KindAdmission
	}
	read := true
	for _, d := range m.Decisions {
		if d.Resource.Source == IDDraft {
			return KindAdmission
		}
		read = read && actionVerb(d.Action) == "read"
	}
	if read || readVerbs[m.Name] {
		return KindRead
	}
	return KindMutation
}

// derivedFields is the least schema a method's decisions imply: tenantId, the
// decided-on id (required when every alternative needs it), the idempotency
// key of a draft, the fields a choice or an attribute reads, and scope.
func derivedFields(m Method) []Field {
	if m.Public {
		return nil
	}
	fields := []Field{TenantIDField()}
	add := func(f Field) {
		for i, have := range fields {
			if have.Name == f.Name {
				fields[i].Required = have.Required && f.Required
				fields[i].Enum = append(fields[i].Enum, f.Enum...)
				return
			}
		}
		fields = append(fields, f)
	}
	all := len(m.Decisions) == 1
	for _, d := range m.Decisions {
		switch d.Resource.Source {
		case IDInput:
			add(IDField(d.Resource.Field, d.Resource.Prefix, all))
		case IDDraft:
			add(IdempotencyKeyField())
		}
		if d.When.Field != "" && len(d.When.Values) > 0 {
			add(Field{Name: d.When.Field, Type: FieldString, Required: true, Enum: slices.Clone(d.When.Values)})
		}
		for _, a := range slices.Concat(d.InputAttrs, d.PendingAttrs) {
			add(Field{Name: a, Type: FieldNumber, Required: true})
		}
	}
	if m.Scopes != nil {
		add(Field{Name: "scope", Type: FieldString, Enum: slices.Clone(m.Scopes)})
	}
	return fields
}

// covers checks that an explicit schema has every derived field, at least
// as required, so the spec's input tables and the decisions agree.
func covers(explicit, derived []Field) error {
	for _, d := range derived {
		i := slices.IndexFunc(explicit, func(f Field) bool { return f.Name == d.Name })
		if i < 0 {
			return fmt.Errorf("its schema lacks %s, which its decision reads", d.Name)
		}
		if d.Required && !explicit[i].Required {
			return fmt.Errorf("its schema makes %s optional, which its decision needs", d.Name)
		}
		if d.Pattern != "" && explicit[i].Pattern != d.Pattern {
			return fmt.Errorf("its schema's %s pattern %q is not the decision's %q", d.Name, explicit[i].Pattern, d.Pattern)
		}
	}
	return nil
}

// Cloud-resource fields, as cloud-resources-api.md's input tables give them.
var (
	crsKind        = Field{Name: "kind", Type: FieldString, Required: true, MaxLength: 64, Pattern: `^[a-z0-9]+(?:[.-][a-z0-9]+)*$`}
	crsName        = Field{Name: "name", Type: FieldString, Required: true, MaxLength: 63, Pattern: `^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`}
	crsDescription = Field{Name: "description", Type: FieldString, MaxLength: 256}
	crsFamily      = Field{Name: "family", Type: FieldString, Enum: []string{"storage", "network", "edge", "data", "platform", "ai", "observability"}}
)

func optional(f Field) Field { f.Required = false; return f }

func nullable(f Field) Field { f.Nullable = true; return f }

// explicitSchemas are planned methods whose whole input the spec fixes
// (cloud-resources-api.md): a call with the spec's fields reaches the
// planned answer rather than INVALID_INPUT. A served method's schema comes
// from its descriptor's input type, never from here; every other planned
// method takes the fields its decisions read.
var explicitSchemas = map[string][]Field{
	"cloudResources.kinds":   {TenantIDField(), IDField("poolId", "pool", true)},
	"cloudResources.catalog": {TenantIDField(), IDField("poolId", "pool", true), {Name: "installsOn", Type: FieldString, Enum: []string{"instance", "kubernetes"}}},
	"cloudResources.signals": {TenantIDField(), IDField("poolId", "pool", true), IDField("resourceId", "crs", false)},
	"cloudResources.create": {TenantIDField(), IDField("projectId", "prj", false), IDField("poolId", "pool", true),
		crsKind, crsName, crsDescription, IDField("parentId", "crs", false),
		{Name: "spec", Type: FieldObject, Required: true, MaxBytes: 64 << 10}, IdempotencyKeyField()},
	"cloudResources.list": {TenantIDField(), IDField("poolId", "pool", false), IDField("projectId", "prj", false),
		optional(crsKind), crsFamily, {Name: "includeDeleted", Type: FieldBoolean}},
	"cloudResources.get": {TenantIDField(), IDField("resourceId", "crs", true)},
	"cloudResources.update": {TenantIDField(), IDField("resourceId", "crs", true),
		{Name: "spec", Type: FieldObject}, nullable(crsDescription)},
	"cloudResources.delete":   {TenantIDField(), IDField("resourceId", "crs", true)},
	"cloudResources.discover": {TenantIDField(), IDField("poolId", "pool", true), crsKind},
	"cloudResources.adopt": {TenantIDField(), IDField("projectId", "prj", false), IDField("poolId", "pool", true),
		crsKind, {Name: "providerId", Type: FieldString, Required: true, MaxLength: 200}, crsName, crsDescription, IdempotencyKeyField()},
	"cloudResources.release": {TenantIDField(), IDField("resourceId", "crs", true)},
}

// ActionOf is the action of a method in the method table (its first
// decision's, for a method decided on alternatives).
func ActionOf(method string) (string, error) {
	if tableErr != nil {
		return "", tableErr
	}
	for _, m := range tableMethods {
		if m.FullName() == method && len(m.Decisions) > 0 {
			return m.Decisions[0].Action, nil
		}
	}
	return "", fmt.Errorf("method %s is not in the method table", method)
}

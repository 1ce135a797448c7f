package core

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func mustTable(t *testing.T) []Method {
	t.Helper()
	ms, err := TableMethods()
	if err != nil {
		// The error lists every row that cannot be interpreted.
		t.Fatalf("method table: %v", err)
	}
	return ms
}

func mustRegistry(t *testing.T) *Registry {
	t.Helper()
	r, err := TableRegistry()
	if err != nil {
		t.Fatalf("TableRegistry: %v", err)
	}
	return r
}

func TestTableRowsAndSections(t *testing.T) {
	ms := mustTable(t)
	rows, _ := TableRows()
	if len(rows) != 177 || len(ms) != 177 {
		t.Fatalf("%d rows, %d methods; the table holds 177", len(rows), len(ms))
	}
	want := []struct {
		section string
		n       int
	}{
		{"Platform and tenancy", 17},
		{"Nodes and access", 34},
		{"Capacity", 21},
		{"Usage and events", 13},
		{"Provisioning and bare metal", 32},
		{"VPS", 37},
		{"Fleet and rollouts", 12},
		{"Cloud resources", 11},
	}
	var order []string
	count := map[string]int{}
	for _, m := range ms {
		if !slices.Contains(order, m.Section) {
			order = append(order, m.Section)
		}
		count[m.Section]++
	}
	if len(order) != len(want) {
		t.Errorf("sections %v", order)
	}
	for i, w := range want {
		if i >= len(order) || order[i] != w.section || count[w.section] != w.n {
			t.Errorf("section %d: want %q with %d methods; have %v %v", i, w.section, w.n, order, count)
		}
	}
	// The 11 cloudResources methods of cloud-resources-api.md are all there.
	var cloud []string
	for _, m := range ms {
		if m.Group == "cloudResources" {
			cloud = append(cloud, m.Name)
		}
	}
	if !slices.Equal(cloud, []string{"kinds", "catalog", "signals", "create", "list", "get", "update", "delete", "discover", "adopt", "release"}) {
		t.Errorf("cloudResources methods %v", cloud)
	}
}

func TestCountsByKindAndPhase(t *testing.T) {
	kinds := map[Kind]int{}
	phases := map[string]int{}
	var admissions, public []string
	for _, m := range mustTable(t) {
		kinds[m.Kind]++
		phase := m.Phase
		if m.NoPlanRow {
			phase = "none"
		}
		phases[phase]++
		if m.Kind == KindAdmission {
			admissions = append(admissions, m.FullName())
		}
		if m.Public {
			public = append(public, m.FullName())
		}
	}
	if want := map[Kind]int{KindRead: 74, KindMutation: 96, KindAdmission: 7}; !reflect.DeepEqual(kinds, want) {
		t.Errorf("kinds %v, want %v", kinds, want)
	}
	if want := map[string]int{"v0.1": 42, "v0.2": 56, "v0.3": 30, "v0.4": 8, "v0.5": 15, "v1.0": 25, "none": 1}; !reflect.DeepEqual(phases, want) {
		t.Errorf("phases %v, want %v", phases, want)
	}
	// Step 6: request-as-resource creates, reservations.extend, and creates
	// that take an idempotency key.
	wantAdmissions := []string{"reservations.create", "reservations.extend", "instances.create", "sandboxes.create",
		"sandboxVolumes.create", "cloudResources.create", "cloudResources.adopt"}
	if !slices.Equal(admissions, wantAdmissions) {
		t.Errorf("admissions %v, want %v", admissions, wantAdmissions)
	}
	if !slices.Equal(public, []string{"system.whoami", "system.version"}) {
		t.Errorf("public %v", public)
	}
}

// A sample of rows, asserted whole.
func TestSampleRows(t *testing.T) {
	tenant := ref("tenant")
	cases := []Method{
		{Group: "system", Name: "whoami", Kind: KindRead, Public: true, Phase: "v0.1"},
		{Group: "system", Name: "selfCheck", Kind: KindRead, Phase: "v0.1",
			Decisions: []Decision{{Action: "compute:fleet:admin", Resource: ResourceRef{Type: "fleet", Source: IDGlobal}}}},
		{Group: "projects", Name: "list", Kind: KindRead, Phase: "v0.1", Items: true, ItemType: "project",
			Decisions: []Decision{{Action: "compute:projects:read", Resource: ResourceRef{Type: "tenant", Source: IDTenant, Field: "tenantId"}}}},
		{Group: "reservations", Name: "create", Kind: KindAdmission, Phase: "v0.1",
			Decisions: []Decision{{Action: "compute:reservations:create", Resource: ResourceRef{Type: "reservation", Source: IDDraft, Prefix: "rsv"}}}},
		{Group: "reservations", Name: "extend", Kind: KindAdmission, Phase: "v0.1",
			Decisions: []Decision{{Action: "compute:reservations:extend", Resource: ResourceRef{Type: "reservation", Source: IDInput, Field: "reservationId", Prefix: "rsv"}}}},
		{Group: "reservations", Name: "list", Kind: KindRead, Phase: "v0.1", Items: true, ItemType: "reservation", Scopes: []string{"mine", "all"},
			Decisions: []Decision{{Action: "compute:reservations:read", Resource: tenant}}},
		{Group: "sites", Name: "create", Kind: KindMutation, Phase: "v0.1", Decisions: []Decision{
			{Action: "compute:sites:manage", Resource: ResourceRef{Type: "fleet", Source: IDGlobal},
				When: Condition{Field: "kind", Values: []string{"shared", "dedicated"}, Text: "for shared and dedicated sites"}},
			{Action: "compute:sites:manage", Resource: tenant,
				When: Condition{Field: "kind", Values: []string{"custom"}, Text: "for a tenant's custom site"}},
		}},
		{Group: "usage", Name: "list", Kind: KindRead, Phase: "v0.1", Decisions: []Decision{
			{Action: "compute:usage:read", Resource: tenant, When: Condition{Text: "otherwise"}},
			{Action: "compute:usage:read", Resource: ref("project"), When: Condition{Field: "projectId"}},
		}},
		{Group: "tunnels", Name: "open", Kind: KindMutation, Phase: "v0.3", Decisions: []Decision{
			{Action: "compute:instances:exec", Resource: ref("instance"), When: Condition{Field: "instanceId"}},
			{Action: "compute:nodes:console", Resource: ref("node"), When: Condition{Field: "nodeId"}},
		}},
		{Group: "webhooks", Name: "list", Kind: KindRead, Phase: "v0.3",
			Decisions: []Decision{{Action: "compute:webhooks:manage", Resource: tenant}}},
		{Group: "webhooks", Name: "eventTypes", Kind: KindRead, NoPlanRow: true,
			Decisions: []Decision{{Action: "compute:webhooks:manage", Resource: tenant}}},
		{Group: "sandboxes", Name: "exec", Kind: KindMutation, Phase: "v0.5", Host: "tunnels",
			Decisions: []Decision{{Action: "compute:sandboxes:exec", Resource: ref("sandbox")}}},
		{Group: "metal", Name: "bulk", Kind: KindMutation, Phase: "v1.0",
			Decisions: []Decision{{Action: "compute:nodes:provision", Resource: ref("pool")}},
			Extras: []Extra{{Name: "nodes", When: "then each node", Each: true, Decisions: []Decision{
				{Action: "compute:nodes:provision", Resource: ResourceRef{Type: "node", Source: IDItem, Prefix: "node"}}}}}},
		{Group: "metal", Name: "discovered", Kind: KindRead, Phase: "v1.0", Decisions: []Decision{{Action: "compute:sites:read",
			Resource: ResourceRef{Type: "site", Source: IDInput, Field: "siteId", Prefix: "site", OwnerTenantOnly: true}}}},
		{Group: "instances", Name: "create", Kind: KindAdmission, Phase: "v0.3",
			Decisions: []Decision{{Action: "compute:instances:create", Resource: ResourceRef{Type: "instance", Source: IDDraft, Prefix: "inst"}}},
			Extras: []Extra{{Name: "secrets", When: "when userData is a secret:// reference",
				Decisions: []Decision{{Action: "compute:secrets:manage", Resource: tenant, RootAlso: true}}}}},
		{Group: "sandboxTemplates", Name: "create", Kind: KindMutation, Phase: "v0.5",
			Decisions: []Decision{{Action: "compute:sandboxes:manage", Resource: tenant}},
			Extras: []Extra{
				{Name: "secrets", When: "when it names secrets", Decisions: []Decision{{Action: "compute:secrets:manage", Resource: tenant, RootAlso: true}}},
				{Name: "volumes", When: "for each volume it names", Each: true, Decisions: []Decision{
					{Action: "compute:sandboxes:manage", Resource: ResourceRef{Type: "sandbox-volume", Source: IDItem, Prefix: "vol"}, When: Condition{Text: "read-write mount"}},
					{Action: "compute:sandboxes:read", Resource: ResourceRef{Type: "sandbox-volume", Source: IDItem, Prefix: "vol"}, When: Condition{Text: "read-only"}},
				}},
			}},
		{Group: "sandboxVolumes", Name: "create", Kind: KindAdmission, Phase: "v1.0", Decisions: []Decision{{Action: "compute:sandboxes:manage",
			Resource: ResourceRef{Type: "sandbox-volume", Source: IDDraft, Prefix: "vol"}, InputAttrs: []string{"sizeGiB"}}}},
		{Group: "sandboxVolumes", Name: "resize", Kind: KindMutation, Phase: "v1.0", Decisions: []Decision{{Action: "compute:sandboxes:manage",
			Resource: ref("sandbox-volume"), PendingAttrs: []string{"sizeGiB"}}}},
		{Group: "sandboxVolumes", Name: "list", Kind: KindRead, Phase: "v1.0", Scopes: []string{"mine", "all"},
			Decisions: []Decision{{Action: "compute:sandboxes:read", Resource: tenant}}},
		{Group: "commandBatches", Name: "cancel", Kind: KindMutation, Phase: "v1.0",
			Decisions: []Decision{{Action: "compute:batches:approve", Resource: tenant}}},
		{Group: "cloudResources", Name: "create", Kind: KindAdmission, Phase: "v1.0", Decisions: []Decision{{Action: "compute:cloud-resources:create",
			Resource: ResourceRef{Type: "cloud-resource", Source: IDDraft, Prefix: "crs"}}}},
		{Group: "cloudResources", Name: "list", Kind: KindRead, Phase: "v1.0", Items: true, ItemType: "cloud-resource",
			Decisions: []Decision{{Action: "compute:cloud-resources:read", Resource: tenant}}},
		{Group: "cloudResources", Name: "release", Kind: KindMutation, Phase: "v1.0", Decisions: []Decision{{Action: "compute:cloud-resources:delete",
			Resource: ResourceRef{Type: "cloud-resource", Source: IDInput, Field: "resourceId", Prefix: "crs"}}}},
	}
	r := mustRegistry(t)
	for _, want := range cases {
		t.Run(want.FullName(), func(t *testing.T) {
			got, ok := r.Get(want.FullName())
			if !ok {
				t.Fatal("not registered")
			}
			if diff := registrationDiff(want, got); len(diff) > 0 {
				t.Errorf("%s differ:\n got %+v\nwant %+v", strings.Join(diff, ", "), got, want)
			}
		})
	}
}

// Every method's schema has tenantId (unless public) and its decided-on id,
// with the spec's patterns; and the registry holds together with the catalog.
func TestSchemasCoverDecisions(t *testing.T) {
	for _, m := range mustTable(t) {
		if m.Public {
			if len(m.Schema.Fields()) != 0 {
				t.Errorf("%s: public and takes fields", m.FullName())
			}
			continue
		}
		tid, ok := m.Schema.Field("tenantId")
		if !ok || !tid.Required || tid.Pattern != `^[A-Za-z0-9._:-]{1,128}$` || tid.MaxLength != 128 {
			t.Errorf("%s: tenantId %+v", m.FullName(), tid)
		}
		for _, d := range m.Decisions {
			switch d.Resource.Source {
			case IDInput:
				f, ok := m.Schema.Field(d.Resource.Field)
				want := "^" + d.Resource.Prefix + "_[0-9a-hjkmnp-tv-z]{26,52}$"
				if !ok || f.Pattern != want || f.MaxLength != len(d.Resource.Prefix)+53 || f.Required != (len(m.Decisions) == 1) {
					t.Errorf("%s: %s = %+v, want pattern %s", m.FullName(), d.Resource.Field, f, want)
				}
			case IDDraft:
				if f, ok := m.Schema.Field("idempotencyKey"); !ok || !f.Required {
					t.Errorf("%s: a draft without a required idempotencyKey", m.FullName())
				}
			}
		}
	}
	pool, _ := mustRegistry(t).Get("cloudResources.kinds")
	if f, _ := pool.Schema.Field("poolId"); f.MaxLength != 57 || f.Pattern != `^pool_[0-9a-hjkmnp-tv-z]{26,52}$` {
		t.Errorf("poolId = %+v, the spec says at most 57 characters", f)
	}
	crs, _ := mustRegistry(t).Get("cloudResources.get")
	if f, _ := crs.Schema.Field("resourceId"); f.MaxLength != 56 {
		t.Errorf("resourceId = %+v, the spec says at most 56 characters", f)
	}
}

func TestTableRegistryChecksClean(t *testing.T) {
	c := mustCatalog(t, CatalogConfig{})
	warnings, err := CheckRegistry(c, mustRegistry(t))
	if err != nil {
		t.Fatalf("CheckRegistry: %v", err)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings %v", warnings)
	}
	// Every action a method names is in the catalog and carried by its type.
	for _, m := range mustTable(t) {
		for _, a := range m.Actions() {
			if _, ok := c.Action(a); !ok {
				t.Errorf("%s: %s is not in the catalog", m.FullName(), a)
			}
		}
	}
}

// The "or" rows whose choice the spec does not state: the handler chooses.
func TestUnstatedChoices(t *testing.T) {
	var got []string
	for _, m := range mustTable(t) {
		if len(m.Decisions) > 1 && reflect.DeepEqual(normalized(m).Decisions[0].When, Condition{}) {
			got = append(got, m.FullName())
		}
	}
	want := []string{"secrets.put", "secrets.delete", "pools.create", "images.register", "providerAccounts.create"}
	if !slices.Equal(got, want) {
		t.Errorf("unstated choices %v, want %v", got, want)
	}
}

func TestUninterpretableRowsAreListed(t *testing.T) {
	const head = "# comment\n" + tableHeader + "\n"
	cases := []struct {
		name, tsv string
		want      []string
	}{
		{"unknown prose action", head + "S\tpools.get\tcompute:pools:read, unless it rains\tcompute-pool\tv0.1\t\n",
			[]string{"line 3 (pools.get)", "neither an action nor a known prose cell"}},
		{"unknown prose decided-on", head + "S\tpools.get\tcompute:pools:read\tcompute-pool (on Tuesdays)\tv0.1\t\n",
			[]string{"line 3 (pools.get)", "neither formulaic nor a known prose cell"}},
		{"unknown type", head + "S\tgizmos.get\tcompute:gizmos:read\tcompute-gizmo\tv0.1\t\n",
			[]string{"line 3 (gizmos.get)", "unknown resource type compute-gizmo"}},
		{"phase", head + "S\tpools.get\tcompute:pools:read\tcompute-pool\tsoon\t\n",
			[]string{"line 3 (pools.get)", `phase "soon"`}},
		{"note", head + "S\tpools.get\tcompute:pools:read\tcompute-pool\tv0.1\tsee elsewhere\n",
			[]string{"line 3 (pools.get)", `note "see elsewhere"`}},
		{"declared kind disagrees", head + "S\tpools.offer\tcompute:pools:share\tcompute-pool\tv0.1\tkind: read\n",
			[]string{"line 3 (pools.offer)", "the spec says kind read, the rules derive mutation"}},
		{"cells", head + "S\tpools.get\tcompute:pools:read\n", []string{"line 3: 3 cells, want 6"}},
		{"header", "section\tmethod\n", []string{"line 1: header"}},
		{"method name", head + "S\tpools-get\tcompute:pools:read\tcompute-pool\tv0.1\t\n", []string{"line 3 (pools-get)", "method name"}},
		{"twice", head + "S\tpools.get\tcompute:pools:read\tcompute-pool\tv0.1\t\nS\tpools.get\tcompute:pools:read\tcompute-pool\tv0.1\t\n",
			[]string{"line 4: method pools.get is listed twice"}},
		{"items without get", head + "S\tgizmos.list\tcompute:pools:read\tcompute-tenant + items\tv0.1\t\n",
			[]string{"line 3 (gizmos.list)", "gizmos.get does not name the item type"}},
		{"public decided on something", head + "S\tsystem.whoami\tnone (public)\tcompute-fleet\tv0.1\t\n",
			[]string{"line 3 (system.whoami)", "public, but decided on"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := loadTable(tc.tsv)
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("err = %v, want INVALID_CONFIG", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			// Prose entries and explicit schemas that match no row are listed too.
			if !strings.Contains(err.Error(), "matches no row") || !strings.Contains(err.Error(), "schema for cloudResources.get") {
				t.Errorf("error %q does not list unused entries", err)
			}
		})
	}
}

func TestCheckRegistryFindings(t *testing.T) {
	table := mustTable(t)
	get := func(name string) Method {
		i := slices.IndexFunc(table, func(m Method) bool { return m.FullName() == name })
		return table[i].clone()
	}
	without := func(name string) []Method {
		return slices.DeleteFunc(slices.Clone(table), func(m Method) bool { return m.FullName() == name })
	}
	pluginMethod := Method{Group: "acmeAutoinstall", Name: "render", Kind: KindRead, Plugin: "acme-autoinstall",
		Decisions: []Decision{{Action: "compute:acme-autoinstall:render", Resource: ref("node")}}}
	acme := plugin("acme-autoinstall", "node", TypeFragment{Actions: []string{"compute:acme-autoinstall:render", "compute:acme-autoinstall:unused"}})

	cases := []struct {
		name         string
		plugins      []Plugin
		methods      func() []Method
		uncatalogued []string
		mismatch     []string
		warnings     []string // code subject
	}{
		{name: "clean", methods: func() []Method { return table }},
		{name: "action not in the catalog", methods: func() []Method {
			m := get("pools.get")
			m.Decisions[0].Action = "compute:pools:peek"
			return append(without("pools.get"), m)
		}, uncatalogued: []string{"pools.get: action compute:pools:peek is not in the catalog"},
			mismatch: []string{"pools.get disagrees with its method-table row on decisions"}},
		{name: "type not in the catalog", methods: func() []Method {
			return append(slices.Clone(table), Method{Group: "gizmos", Name: "get", Plugin: "acme", Kind: KindRead,
				Decisions: []Decision{{Action: "compute:pools:read", Resource: ResourceRef{Type: "gizmo", Source: IDInput, Field: "gizmoId"}}}})
		}, uncatalogued: []string{"gizmos.get: type compute-gizmo is not in the catalog"}},
		{name: "type does not carry the action", methods: func() []Method {
			m := get("pools.get")
			m.Decisions[0].Action = "compute:nodes:read"
			return append(without("pools.get"), m)
		}, uncatalogued: []string{"pools.get: type compute-pool does not carry action compute:nodes:read"},
			mismatch: []string{"pools.get disagrees with its method-table row on decisions"}},
		{name: "items type does not carry the action", methods: func() []Method {
			m := get("pools.list")
			m.ItemType = "site"
			return append(without("pools.list"), m)
		}, uncatalogued: []string{"pools.list: type compute-site does not carry action compute:pools:read"},
			mismatch: []string{"pools.list disagrees with its method-table row on items"}},
		{name: "kind mismatch", methods: func() []Method {
			m := get("reservations.create")
			m.Kind = KindMutation
			return append(without("reservations.create"), m)
		}, mismatch: []string{"reservations.create disagrees with its method-table row on kind"}},
		{name: "phase and public mismatch", methods: func() []Method {
			m := get("system.version")
			m.Phase, m.Public = "v0.2", false
			return append(without("system.version"), m)
		}, mismatch: []string{"system.version disagrees with its method-table row on public, phase"}},
		{name: "a plugin cannot redefine a row", methods: func() []Method {
			m := get("nodes.get")
			m.Plugin, m.Decisions[0].Action = "acme", "compute:nodes:update"
			return append(without("nodes.get"), m)
		}, mismatch: []string{"nodes.get disagrees with its method-table row on decisions"}},
		{name: "hand-written registration with empty slices matches", methods: func() []Method {
			m := get("pools.get")
			m.Scopes, m.Extras, m.Decisions[0].InputAttrs = []string{}, []Extra{}, []string{}
			return append(without("pools.get"), m)
		}},
		{name: "undeclared non-plugin method", methods: func() []Method {
			return append(slices.Clone(table), Method{Group: "pools", Name: "peek", Kind: KindRead,
				Decisions: []Decision{{Action: "compute:pools:read", Resource: ref("pool")}}})
		}, warnings: []string{"catalog.undeclared pools.peek"}},
		{name: "plugin method and its unused action", plugins: []Plugin{acme},
			methods:  func() []Method { return append(slices.Clone(table), pluginMethod) },
			warnings: []string{"catalog.unused compute:acme-autoinstall:unused"}},
		{name: "plugin method without its plugin", methods: func() []Method { return append(slices.Clone(table), pluginMethod) },
			uncatalogued: []string{"acmeAutoinstall.render: action compute:acme-autoinstall:render is not in the catalog"}},
		{name: "no method uses an action", methods: func() []Method { return without("joinTokens.revoke") },
			warnings: []string{"catalog.unused compute:join-tokens:revoke"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustCatalog(t, CatalogConfig{Plugins: tc.plugins})
			r, err := NewRegistry(tc.methods()...)
			if err != nil {
				t.Fatal(err)
			}
			warnings, err := CheckRegistry(c, r)
			var got []string
			for _, w := range warnings {
				got = append(got, w.Code+" "+w.Subject)
			}
			if !slices.Equal(got, tc.warnings) {
				t.Errorf("warnings %v, want %v", got, tc.warnings)
			}
			if tc.uncatalogued == nil && tc.mismatch == nil {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || e.Code != CodeInvalidConfig {
				t.Fatalf("err = %v, want INVALID_CONFIG", err)
			}
			if u := e.Details["uncatalogued"].([]string); !slices.Equal(u, tc.uncatalogued) {
				t.Errorf("uncatalogued %q, want %q", u, tc.uncatalogued)
			}
			if mism := e.Details["mismatch"].([]string); !slices.Equal(mism, tc.mismatch) {
				t.Errorf("mismatch %q, want %q", mism, tc.mismatch)
			}
		})
	}
}

func TestRegistry(t *testing.T) {
	m := Method{Group: "pools", Name: "get"}
	if _, err := NewRegistry(m, m); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a repeated method: err = %v", err)
	}
	if _, err := NewRegistry(Method{Group: "pools", Name: "get-it"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a bad name: err = %v", err)
	}
	r := mustRegistry(t)
	if r.Len() != 177 || r.Methods()[0].FullName() != "system.whoami" {
		t.Errorf("len %d, first %s", r.Len(), r.Methods()[0].FullName())
	}
	got, _ := r.Get("sites.create")
	got.Decisions[0].When.Values[0] = "evil"
	again, _ := r.Get("sites.create")
	if again.Decisions[0].When.Values[0] != "shared" {
		t.Error("a caller changed the registry")
	}
}

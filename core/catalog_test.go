package core

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// specActionRows is the spec's "Actions" table as written (actions that
// share a row, then the types that carry them), plus the cloud-resources
// actions of cloud-resources-api.md. It is the oracle catalog.json is held to.
var specActionRows = []struct{ actions, types []string }{
	{[]string{"compute:fleet:admin"}, []string{"fleet"}},
	{[]string{"compute:sites:read"}, []string{"tenant", "site"}},
	{[]string{"compute:sites:manage"}, []string{"fleet", "tenant", "site"}},
	{[]string{"compute:pools:read"}, []string{"tenant", "pool"}},
	{[]string{"compute:pools:create"}, []string{"fleet", "tenant"}},
	{[]string{"compute:pools:manage"}, []string{"pool"}},
	{[]string{"compute:pools:share"}, []string{"pool"}},
	{[]string{"compute:capacity:read"}, []string{"tenant", "pool"}},
	{[]string{"compute:quotas:read"}, []string{"tenant"}},
	{[]string{"compute:quotas:manage"}, []string{"fleet"}},
	{[]string{"compute:join-tokens:create", "compute:join-tokens:read", "compute:join-tokens:revoke"}, []string{"pool"}},
	{[]string{"compute:flavors:read", "compute:flavors:manage"}, []string{"pool"}},
	{[]string{"compute:nodes:read"}, []string{"tenant", "node"}},
	{[]string{"compute:nodes:provision"}, []string{"pool", "node"}},
	{[]string{"compute:nodes:update", "compute:nodes:cordon", "compute:nodes:drain", "compute:nodes:power", "compute:nodes:exec",
		"compute:nodes:console", "compute:nodes:ssh-root", "compute:nodes:delete", "compute:nodes:revoke-identity"}, []string{"node"}},
	{[]string{"compute:workflows:read", "compute:workflows:manage"}, []string{"node"}},
	{[]string{"compute:reservations:read"}, []string{"tenant", "reservation"}},
	{[]string{"compute:reservations:create", "compute:reservations:extend", "compute:reservations:release"}, []string{"reservation"}},
	{[]string{"compute:instances:read"}, []string{"tenant", "instance"}},
	{[]string{"compute:instances:create", "compute:instances:update", "compute:instances:exec", "compute:instances:delete"}, []string{"instance"}},
	{[]string{"compute:projects:read", "compute:projects:manage"}, []string{"tenant", "project"}},
	{[]string{"compute:usage:read"}, []string{"tenant", "project"}},
	{[]string{"compute:events:read", "compute:webhooks:manage"}, []string{"tenant"}},
	{[]string{"compute:secrets:manage"}, []string{"fleet", "tenant"}},
	{[]string{"compute:drivers:read"}, []string{"fleet", "tenant"}},
	{[]string{"compute:profiles:read", "compute:profiles:manage"}, []string{"tenant", "profile"}},
	{[]string{"compute:images:read"}, []string{"tenant", "image"}},
	{[]string{"compute:images:publish"}, []string{"fleet", "tenant", "image"}},
	{[]string{"compute:providers:read"}, []string{"tenant", "provider-account"}},
	{[]string{"compute:providers:manage"}, []string{"fleet", "tenant", "provider-account"}},
	// "(read also on compute-sandbox and compute-sandbox-snapshot)"
	{[]string{"compute:sandboxes:read"}, []string{"tenant", "sandbox-template", "sandbox-volume", "sandbox", "sandbox-snapshot"}},
	{[]string{"compute:sandboxes:manage"}, []string{"tenant", "sandbox-template", "sandbox-volume"}},
	// "(delete also on compute-sandbox-snapshot)"
	{[]string{"compute:sandboxes:create", "compute:sandboxes:update", "compute:sandboxes:exec"}, []string{"sandbox"}},
	{[]string{"compute:sandboxes:delete"}, []string{"sandbox", "sandbox-snapshot"}},
	{[]string{"compute:batches:read", "compute:batches:create", "compute:batches:approve"}, []string{"tenant"}},
	// cloud-resources-api.md: decided on compute-cloud-resource, or the tenant for listings.
	{[]string{"compute:cloud-resources:read"}, []string{"tenant", "cloud-resource"}},
	{[]string{"compute:cloud-resources:create", "compute:cloud-resources:update", "compute:cloud-resources:delete"}, []string{"cloud-resource"}},
}

func mustCatalog(t *testing.T, cfg CatalogConfig) *Catalog {
	t.Helper()
	c, err := NewCatalog(cfg)
	if err != nil {
		t.Fatalf("NewCatalog: %v", err)
	}
	return c
}

func TestCoreCatalogActionsMatchSpec(t *testing.T) {
	c := mustCatalog(t, CatalogConfig{})
	want := map[string][]string{}
	for _, row := range specActionRows {
		for _, a := range row.actions {
			want[a] = slices.Sorted(slices.Values(row.types))
		}
	}
	got := map[string][]string{}
	for _, a := range c.Actions() {
		got[a.Name] = a.Types
		if !actionPattern.MatchString(a.Name) {
			t.Errorf("action %s does not match %s", a.Name, actionPattern)
		}
	}
	for _, a := range slices.Sorted(maps.Keys(want)) {
		if !slices.Equal(got[a], want[a]) {
			t.Errorf("%s is carried by %v, the spec says %v", a, got[a], want[a])
		}
	}
	for a := range got {
		if _, ok := want[a]; !ok {
			t.Errorf("%s is not in the spec", a)
		}
	}
	// The spec's prose says 56; its table lists 59 (the three batches actions
	// came with v1.0), plus the four cloud-resources actions.
	if len(got) != 63 {
		t.Errorf("%d actions, want 63", len(got))
	}
	cloud := 0
	for a := range got {
		if strings.HasPrefix(a, "compute:cloud-resources:") {
			cloud++
		}
	}
	if len(got)-cloud != 59 || cloud != 4 {
		t.Errorf("%d actions of the Actions table and %d cloud-resources actions, want 59 and 4", len(got)-cloud, cloud)
	}
}

func TestCoreCatalogTypes(t *testing.T) {
	c := mustCatalog(t, CatalogConfig{})
	type want struct {
		scope     bool
		parent    string
		relations string
		attrs     string
	}
	wants := map[string]want{
		"fleet":            {scope: true},
		"tenant":           {scope: true},
		"project":          {scope: true, relations: "admin member"},
		"site":             {attrs: "iamRegion:string kind:string region:string"},
		"pool":             {relations: "admin operator user viewer", attrs: "class:string gpuMemoryGb:number gpuModel:string region:string sharing:string"},
		"node":             {parent: "pool", relations: "operator", attrs: "dedicatedTo:string gpuCount:number gpuModel:string lifecycle:string region:string trust:string"},
		"reservation":      {parent: "pool", attrs: "binding:string durationHours:number gpuCount:number gpuModel:string projectId:string region:string spot:boolean"},
		"instance":         {parent: "pool", attrs: "gpus:number imageId:string imageVerified:boolean memoryGiB:number projectId:string vcpu:number"},
		"image":            {attrs: "verified:boolean visibility:string"},
		"profile":          {},
		"provider-account": {},
		"sandbox":          {parent: "pool", attrs: "fromSnapshot:string gpus:number memoryGiB:number templateId:string ttlSeconds:number vcpu:number warm:boolean"},
		"sandbox-template": {},
		"sandbox-snapshot": {attrs: "includeMemory:boolean sandboxId:string templateId:string"},
		"sandbox-volume":   {parent: "pool", attrs: "sizeGiB:number"},
		"cloud-resource":   {attrs: "family:string kind:string poolId:string projectId:string provider:string providerAccountId:string region:string"},
	}
	types := c.Types()
	if len(types) != len(wants) {
		t.Errorf("%d types, want %d", len(types), len(wants))
	}
	for _, rt := range types {
		w, ok := wants[rt.Name]
		if !ok {
			t.Errorf("unexpected type %s", rt.FullName)
			continue
		}
		var attrs []string
		for _, a := range rt.Attributes {
			attrs = append(attrs, a.Name+":"+string(a.Type))
		}
		got := want{scope: rt.Scope, parent: rt.Parent, relations: strings.Join(rt.Relations, " "), attrs: strings.Join(attrs, " ")}
		if got != w {
			t.Errorf("%s = %+v, want %+v", rt.FullName, got, w)
		}
		if rt.FullName != "compute-"+rt.Name || rt.Description == "" {
			t.Errorf("%s: full name %q, description %q", rt.Name, rt.FullName, rt.Description)
		}
	}
}

func TestTypePrefix(t *testing.T) {
	c := mustCatalog(t, CatalogConfig{TypePrefix: "acme-gpu-"})
	if c.Prefix() != "acme-gpu-" || c.FullName("pool") != "acme-gpu-pool" {
		t.Errorf("prefix %q, pool %q", c.Prefix(), c.FullName("pool"))
	}
	if name, ok := c.ShortName("acme-gpu-node"); !ok || name != "node" {
		t.Errorf("ShortName(acme-gpu-node) = %q, %v", name, ok)
	}
	if _, ok := c.ShortName("compute-node"); ok {
		t.Error("a type of another prefix resolved")
	}
	if got := mustCatalog(t, CatalogConfig{}).Prefix(); got != DefaultTypePrefix {
		t.Errorf("default prefix %q", got)
	}
	for _, bad := range []string{"Compute-", "1compute-", "-compute", "compute_", strings.Repeat("a", 33)} {
		if _, err := NewCatalog(CatalogConfig{TypePrefix: bad}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("typePrefix %q: err = %v, want INVALID_CONFIG", bad, err)
		}
	}
	if _, err := NewCatalog(CatalogConfig{TypePrefix: strings.Repeat("a", 32)}); err != nil {
		t.Errorf("a 32-character prefix is refused: %v", err)
	}
}

// plugin builds a one-type plugin fragment.
func plugin(id, typ string, f TypeFragment) Plugin {
	return Plugin{ID: id, Catalog: Fragment{ResourceTypes: map[string]TypeFragment{typ: f}}}
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

func attrs(n int) map[string]AttrType {
	out := map[string]AttrType{}
	for _, name := range names("a", n) {
		out[name] = AttrString
	}
	return out
}

// One case per merge rule of "Adding actions", each refused with INVALID_CONFIG.
func TestMergeRules(t *testing.T) {
	cases := []struct {
		name    string
		plugins []Plugin
		prefix  string
		wantErr string // "" means the merge succeeds
	}{
		{name: "the spec's example", plugins: []Plugin{plugin("acme-autoinstall", "node", TypeFragment{Actions: []string{"compute:acme-autoinstall:render"}})}},
		{name: "action grammar: one segment", wantErr: "must match",
			plugins: []Plugin{plugin("acme", "node", TypeFragment{Actions: []string{"compute:acme"}})}},
		{name: "action grammar: upper case", wantErr: "must match",
			plugins: []Plugin{plugin("acme", "node", TypeFragment{Actions: []string{"compute:acme:Render"}})}},
		{name: "action grammar: not compute", wantErr: "must match",
			plugins: []Plugin{plugin("acme", "node", TypeFragment{Actions: []string{"iam:acme:render"}})}},
		{name: "plugin action outside its namespace", wantErr: `must start with "compute:acme:"`,
			plugins: []Plugin{plugin("acme", "node", TypeFragment{Actions: []string{"compute:nodes:read"}})}},
		{name: "plugin action under a prefix of its id", wantErr: `must start with "compute:acme:"`,
			plugins: []Plugin{plugin("acme", "node", TypeFragment{Actions: []string{"compute:acme-other:render"}})}},
		{name: "64 attributes", plugins: []Plugin{plugin("acme", "widget", TypeFragment{Attributes: attrs(64)})}},
		{name: "65 attributes", wantErr: "65 attributes, at most 64",
			plugins: []Plugin{plugin("acme", "widget", TypeFragment{Attributes: attrs(65)})}},
		{name: "attributes count after the merge", wantErr: "70 attributes, at most 64",
			plugins: []Plugin{plugin("acme", "node", TypeFragment{Attributes: attrs(64)})}},
		{name: "32 relations", plugins: []Plugin{plugin("acme", "widget", TypeFragment{Relations: names("r", 32)})}},
		{name: "33 relations", wantErr: "33 relations, at most 32",
			plugins: []Plugin{plugin("acme", "widget", TypeFragment{Relations: names("r", 33)})}},
		{name: "relations count after the merge", wantErr: "33 relations, at most 32",
			plugins: []Plugin{plugin("acme", "node", TypeFragment{Relations: names("r", 32)})}},
		{name: "type name of 64 characters", plugins: []Plugin{plugin("acme", strings.Repeat("w", 64-len("compute-")), TypeFragment{})}},
		{name: "type name over 64 characters", wantErr: "at most 64",
			plugins: []Plugin{plugin("acme", strings.Repeat("w", 65-len("compute-")), TypeFragment{})}},
		{name: "type name length counts the prefix", prefix: "acme-", wantErr: "at most 64",
			plugins: []Plugin{plugin("acme", strings.Repeat("w", 60), TypeFragment{})}},
		{name: "attribute type", wantErr: "want string, number or boolean",
			plugins: []Plugin{plugin("acme", "node", TypeFragment{Attributes: map[string]AttrType{"rack": "integer"}})}},
		{name: "parent disagreement", wantErr: `has parent "compute-site", but core says "compute-pool"`,
			plugins: []Plugin{plugin("acme", "node", TypeFragment{Parent: "site"})}},
		{name: "parent agreement", plugins: []Plugin{plugin("acme", "node", TypeFragment{Parent: "pool"})}},
		{name: "attribute type disagreement", wantErr: `attribute "region" of type "compute-node" is number, but core says string`,
			plugins: []Plugin{plugin("acme", "node", TypeFragment{Attributes: map[string]AttrType{"region": AttrNumber}})}},
		{name: "disagreement between two plugins", wantErr: `attribute "rack" of type "compute-node" is boolean, but acme says string`,
			plugins: []Plugin{
				plugin("acme", "node", TypeFragment{Attributes: map[string]AttrType{"rack": AttrString}}),
				plugin("zeta", "node", TypeFragment{Attributes: map[string]AttrType{"rack": AttrBoolean}}),
			}},
		{name: "parent not in the catalog", wantErr: `the parent "compute-gizmo" of type "compute-widget" is not in the catalog`,
			plugins: []Plugin{plugin("acme", "widget", TypeFragment{Parent: "gizmo"})}},
		{name: "parent added by the same plugin", plugins: []Plugin{{ID: "acme", Catalog: Fragment{ResourceTypes: map[string]TypeFragment{
			"gizmo": {}, "widget": {Parent: "gizmo", Actions: []string{"compute:acme:spin"}},
		}}}}},
		{name: "parent cycle", wantErr: "its own ancestor", plugins: []Plugin{{ID: "acme", Catalog: Fragment{ResourceTypes: map[string]TypeFragment{
			"gizmo": {Parent: "widget"}, "widget": {Parent: "gizmo"},
		}}}}},
		{name: "plugin id grammar", wantErr: "plugin id",
			plugins: []Plugin{plugin("Acme", "node", TypeFragment{})}},
		{name: "plugin id core", wantErr: "plugin id",
			plugins: []Plugin{plugin("core", "node", TypeFragment{})}},
		{name: "plugin given twice", wantErr: "given twice",
			plugins: []Plugin{plugin("acme", "node", TypeFragment{}), plugin("acme", "pool", TypeFragment{})}},
		{name: "type name grammar", wantErr: "type name",
			plugins: []Plugin{plugin("acme", "Widget", TypeFragment{})}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewCatalog(CatalogConfig{TypePrefix: tc.prefix, Plugins: tc.plugins})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("err = %v, want none", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want INVALID_CONFIG containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestPluginMerge(t *testing.T) {
	c := mustCatalog(t, CatalogConfig{Plugins: []Plugin{
		plugin("acme-autoinstall", "node", TypeFragment{Actions: []string{"compute:acme-autoinstall:render"},
			Attributes: map[string]AttrType{"region": AttrString, "rack": AttrString}, Relations: []string{"operator", "installer"}}),
	}})
	node, _ := c.Type("node")
	if !c.Carries("compute:acme-autoinstall:render", "node") || !c.Carries("compute:nodes:read", "node") {
		t.Errorf("node actions %v", node.Actions)
	}
	if node.Parent != "pool" || !slices.Equal(node.Relations, []string{"installer", "operator"}) || len(node.Attributes) != 7 {
		t.Errorf("merged node = %+v", node)
	}
	if !slices.Equal(node.Sources, []string{"core", "acme-autoinstall"}) {
		t.Errorf("sources %v", node.Sources)
	}
	a, _ := c.Action("compute:acme-autoinstall:render")
	if !slices.Equal(a.Sources, []string{"acme-autoinstall"}) || !slices.Equal(a.Types, []string{"node"}) {
		t.Errorf("action %+v", a)
	}
}

func TestCatalogIsImmutable(t *testing.T) {
	c := mustCatalog(t, CatalogConfig{})
	pool, _ := c.Type("pool")
	pool.Actions[0] = "compute:evil:x"
	pool.Attributes[0].Type = AttrBoolean
	c.Actions()[0].Types[0] = "evil"
	frag := CoreFragment()
	frag.ResourceTypes["pool"].Actions[0] = "compute:evil:x"
	again, _ := c.Type("pool")
	if again.Actions[0] == "compute:evil:x" || again.Attributes[0].Type == AttrBoolean || c.Actions()[0].Types[0] == "evil" {
		t.Error("a caller changed the catalog")
	}
	if CoreFragment().ResourceTypes["pool"].Actions[0] == "compute:evil:x" {
		t.Error("a caller changed the core fragment")
	}
}

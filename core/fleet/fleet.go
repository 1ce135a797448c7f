// Package fleet is the fleet document (better-compute/fleet/v1): the root
// tenant's sites, pools with their offers and flavors, and nodes' labels
// and taints, declared by name; its schema, and the diff of a document
// against the live state (docs/fleet-as-code.md). No I/O.
package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"

	"sigs.k8s.io/yaml"

	"github.com/better-compute/better-compute/core"
	nodestate "github.com/better-compute/better-compute/core/nodes"
	policy "github.com/better-compute/better-compute/core/pools"
)

// APIVersion is the document's version.
const APIVersion = "better-compute/fleet/v1"

// Document is the declared fleet. Keys are names, unique in the tenant.
type Document struct {
	APIVersion string `json:"apiVersion" jsonschema:"required,enum=better-compute/fleet/v1"`
	Sites      []Site `json:"sites" jsonschema:"maxItems=1000"`
	Pools      []Pool `json:"pools" jsonschema:"maxItems=5000"`
	// Nodes holds the nodes whose labels and taints the document manages;
	// a node left out is left alone (nodes are enrolled, never declared).
	Nodes []Node `json:"nodes,omitempty" jsonschema:"maxItems=100000"`
}

// Site is a site of the document; its kind never changes.
type Site struct {
	Name      string `json:"name" jsonschema:"required,maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	Kind      string `json:"kind" jsonschema:"required,enum=shared,enum=dedicated,enum=custom"`
	Region    string `json:"region" jsonschema:"required,maxLength=64,pattern=^[a-z0-9]+(-[a-z0-9]+)*$"`
	IAMRegion string `json:"iamRegion" jsonschema:"required,maxLength=64,pattern=^[a-z]{2\\,4}(-[a-z0-9]+){1\\,3}$"`
}

// Pool is a pool of the document, on a site named by its name. Its site,
// class and gpuModel never change; a policy left out keeps the live one.
type Pool struct {
	Name        string         `json:"name" jsonschema:"required,maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	Site        string         `json:"site" jsonschema:"required,maxLength=63"`
	Class       string         `json:"class" jsonschema:"required,enum=metal-host,enum=metal-dedicated,enum=vps-host"`
	GPUModel    string         `json:"gpuModel" jsonschema:"required,maxLength=16,pattern=^[A-Z][A-Z0-9]{1\\,15}$"`
	GPUMemoryGb int            `json:"gpuMemoryGb" jsonschema:"required,minimum=1,maximum=4096"`
	Sharing     string         `json:"sharing" jsonschema:"required,enum=exclusive,enum=mig,enum=timeslice,enum=mps"`
	Agent       string         `json:"agent" jsonschema:"required,enum=bcd,enum=none"`
	BillingMode string         `json:"billingMode" jsonschema:"required,enum=metered,enum=platform-fee,enum=none"`
	Policy      *policy.Policy `json:"policy,omitempty"`
	// Offers are the pool's offers to other tenants, each with its quota;
	// Flavors its instance shapes (vps-host pools). Both are the whole set:
	// one left out is withdrawn or deleted.
	Offers  []Offer  `json:"offers,omitempty" jsonschema:"maxItems=1000"`
	Flavors []Flavor `json:"flavors,omitempty" jsonschema:"maxItems=256"`
}

// Offer is an offer of its pool to a tenant, keyed by the tenant's id.
type Offer struct {
	Tenant             string       `json:"tenant" jsonschema:"required,maxLength=128,pattern=^[A-Za-z0-9._:-]{1\\,128}$"`
	Quota              policy.Quota `json:"quota,omitempty"`
	Priority           *int         `json:"priority,omitempty" jsonschema:"minimum=-1000000,maximum=1000000"`
	IncludeDescendants bool         `json:"includeDescendants,omitempty"`
	Suspended          bool         `json:"suspended,omitempty"`
	ExcludedRegions    []string     `json:"excludedRegions,omitempty" jsonschema:"maxItems=64,uniqueItems=true"`
}

// Flavor is an instance shape of its vps-host pool, keyed by its name;
// its runtime never changes.
type Flavor struct {
	Name      string  `json:"name" jsonschema:"required,maxLength=63,pattern=^[a-z0-9]([-a-z0-9]{0\\,61}[a-z0-9])?$"`
	VCPU      int     `json:"vcpu" jsonschema:"required,minimum=1,maximum=256"`
	MemoryGiB float64 `json:"memoryGiB" jsonschema:"required,minimum=0.0625,maximum=4096"`
	DiskGiB   int     `json:"diskGiB,omitempty" jsonschema:"minimum=0,maximum=65536"`
	GPUs      int     `json:"gpus,omitempty" jsonschema:"minimum=0,maximum=16"`
	Runtime   string  `json:"runtime" jsonschema:"required,enum=container,enum=vm"`
}

// Node is an enrolled node's labels and taints, keyed by its name.
type Node struct {
	Name   string            `json:"name" jsonschema:"required,maxLength=63"`
	Labels map[string]string `json:"labels,omitempty"`
	Taints []Taint           `json:"taints,omitempty" jsonschema:"maxItems=32"`
}

// Taint is a node's taint; one per key and effect.
type Taint struct {
	Key    string `json:"key" jsonschema:"required,maxLength=317"`
	Value  string `json:"value,omitempty" jsonschema:"maxLength=63"`
	Effect string `json:"effect" jsonschema:"required,enum=NoSchedule,enum=PreferNoSchedule,enum=NoExecute"`
}

// Kinds of a change, in the order creates and updates run.
const (
	KindSite   = "site"
	KindPool   = "pool"
	KindFlavor = "flavor"
	KindOffer  = "offer"
	KindNode   = "node"
)

// Ops of a change.
const (
	OpCreate = "create"
	OpUpdate = "update"
	OpDelete = "delete"
)

// Change is one step of a plan. Site, Pool, Offer, Flavor or Node is the
// declared object (create, update); ID is the live object's (update,
// delete). A flavor's or offer's Name is "pool/flavor" or "pool/tenant",
// PoolName its pool's. Refused says why the change cannot be applied.
type Change struct {
	Op       string        `json:"op"`
	Kind     string        `json:"kind"`
	Name     string        `json:"name"`
	ID       string        `json:"id,omitempty"`
	PoolName string        `json:"poolName,omitempty"`
	Fields   []FieldChange `json:"fields,omitempty"`
	Site     *Site         `json:"site,omitempty"`
	// Pool is the declared pool without its offers and flavors (their own
	// changes carry them).
	Pool    *Pool   `json:"pool,omitempty"`
	Offer   *Offer  `json:"offer,omitempty"`
	Flavor  *Flavor `json:"flavor,omitempty"`
	Node    *Node   `json:"node,omitempty"`
	Refused string  `json:"refused,omitempty"`
}

// FieldChange is one field of an update.
type FieldChange struct {
	Field  string `json:"field"`
	Before any    `json:"before"`
	After  any    `json:"after"`
}

// Live is the live state a document is diffed against: the document
// export answers, with each object's id and whether a pool may go.
type Live struct {
	// TenantID is the fleet's tenant: its pools are not offered to it.
	TenantID string
	Document Document
	SiteIDs  map[string]string
	PoolIDs  map[string]string
	// FlavorIDs is by "pool/flavor". NodeIDs holds every live node's id by
	// its name; the document holds only the nodes with labels or taints.
	FlavorIDs map[string]string
	NodeIDs   map[string]string
	// Busy names pools that hold live reservations: they cannot be deleted.
	Busy map[string]bool
	// Kept names sites with live pools the document does not hold
	// (provider pools): they cannot be deleted.
	Kept map[string]bool
}

// Schema is the document's JSON Schema, derived from its tags.
func Schema() (*core.Schema, error) { return core.SchemaFor(reflect.TypeOf(Document{})) }

// Parse reads a YAML or JSON document and checks it against schema: an
// invalid one is INVALID_INPUT naming the field by its path under the
// input's document field (document.pools.0.gpuMemoryGb).
func Parse(schema *core.Schema, text string) (Document, error) {
	raw, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		return Document{}, core.Errorf(core.CodeInvalidInput, "document: %v", err).
			WithDetails(map[string]any{"field": "document", "reason": "syntax"})
	}
	if e := schema.Validate(raw); e != nil {
		// The document is the input's field: its paths are under it.
		if f, ok := e.Details["field"].(string); ok {
			return Document{}, e.WithDetails(map[string]any{"field": "document." + f})
		}
		return Document{}, e
	}
	var d Document
	if err := json.Unmarshal(raw, &d); err != nil {
		return Document{}, core.Errorf(core.CodeInvalidInput, "document: %v", err).
			WithDetails(map[string]any{"field": "document", "reason": "type"})
	}
	return d, check(d)
}

// check says what the schema cannot: unique names, pools on declared
// sites, policies valid for their sharing.
func check(d Document) error {
	sites := map[string]bool{}
	for i, s := range d.Sites {
		if sites[s.Name] {
			return invalid(fmt.Sprintf("document.sites.%d.name", i), "unique", "site %s is declared twice", s.Name)
		}
		sites[s.Name] = true
	}
	pools := map[string]bool{}
	for i, p := range d.Pools {
		if pools[p.Name] {
			return invalid(fmt.Sprintf("document.pools.%d.name", i), "unique", "pool %s is declared twice", p.Name)
		}
		pools[p.Name] = true
		if !sites[p.Site] {
			return invalid(fmt.Sprintf("document.pools.%d.site", i), "unknown", "pool %s: site %s is not declared", p.Name, p.Site)
		}
		if err := policy.CheckGPUModel(p.GPUModel); err != nil {
			return invalid(fmt.Sprintf("document.pools.%d.gpuModel", i), "unknown", "pool %s: %v", p.Name, err)
		}
		if p.Policy != nil {
			if _, err := policy.Validate(p.Policy, p.Sharing); err != nil {
				return invalid(fmt.Sprintf("document.pools.%d.policy", i), "invalid", "pool %s: %v", p.Name, err)
			}
		}
		if err := checkOffers(i, p); err != nil {
			return err
		}
		if err := checkFlavors(i, p); err != nil {
			return err
		}
	}
	return checkNodes(d.Nodes)
}

func checkOffers(i int, p Pool) error {
	tenants := map[string]bool{}
	for j, o := range p.Offers {
		at := fmt.Sprintf("document.pools.%d.offers.%d", i, j)
		if tenants[o.Tenant] {
			return invalid(at+".tenant", "unique", "pool %s is offered to %s twice", p.Name, o.Tenant)
		}
		tenants[o.Tenant] = true
		if err := o.Quota.Check(); err != nil {
			return invalid(at+".quota", "invalid", "pool %s, offer to %s: %v", p.Name, o.Tenant, err)
		}
	}
	return nil
}

func checkFlavors(i int, p Pool) error {
	if len(p.Flavors) > 0 && p.Class != "vps-host" {
		return invalid(fmt.Sprintf("document.pools.%d.flavors", i), "poolClass", "pool %s is a %s pool; flavors are for vps-host pools", p.Name, p.Class)
	}
	names := map[string]bool{}
	for j, f := range p.Flavors {
		at := fmt.Sprintf("document.pools.%d.flavors.%d", i, j)
		if names[f.Name] {
			return invalid(at+".name", "unique", "pool %s: flavor %s is declared twice", p.Name, f.Name)
		}
		names[f.Name] = true
		if mib := f.MemoryGiB * 1024; mib != math.Trunc(mib) {
			return invalid(at+".memoryGiB", "multipleOf", "pool %s, flavor %s: memoryGiB must be a whole number of MiB", p.Name, f.Name)
		}
	}
	return nil
}

// checkNodes applies the rules nodes.label and nodes.taint apply.
func checkNodes(nodes []Node) error {
	names := map[string]bool{}
	for i, n := range nodes {
		at := fmt.Sprintf("document.nodes.%d", i)
		if names[n.Name] {
			return invalid(at+".name", "unique", "node %s is declared twice", n.Name)
		}
		names[n.Name] = true
		if len(n.Labels) > nodestate.MaxLabels {
			return invalid(at+".labels", "maxItems", "node %s: a node has at most %d labels", n.Name, nodestate.MaxLabels)
		}
		for k, v := range n.Labels {
			if err := nodestate.CheckLabelKey(at+".labels", k); err != nil {
				return err
			}
			if err := nodestate.CheckLabelValue(at+".labels", k, v); err != nil {
				return err
			}
		}
		seen := map[[2]string]bool{}
		for j, t := range n.Taints {
			tat := fmt.Sprintf("%s.taints.%d", at, j)
			if err := nodestate.CheckLabelKey(tat+".key", t.Key); err != nil {
				return err
			}
			if err := nodestate.CheckLabelValue(tat+".value", t.Key, t.Value); err != nil {
				return err
			}
			if seen[[2]string{t.Key, t.Effect}] {
				return invalid(tat, "unique", "node %s: taint %s:%s is declared twice", n.Name, t.Key, t.Effect)
			}
			seen[[2]string{t.Key, t.Effect}] = true
		}
	}
	return nil
}

func invalid(field, reason, format string, args ...any) error {
	return core.Errorf(core.CodeInvalidInput, format, args...).WithDetails(map[string]any{"field": field, "reason": reason})
}

// Normalize sorts a document by name, so equal fleets export equal bytes.
func Normalize(d *Document) {
	d.APIVersion = APIVersion
	if d.Sites == nil {
		d.Sites = []Site{}
	}
	if d.Pools == nil {
		d.Pools = []Pool{}
	}
	sort.Slice(d.Sites, func(i, j int) bool { return d.Sites[i].Name < d.Sites[j].Name })
	sort.Slice(d.Pools, func(i, j int) bool { return d.Pools[i].Name < d.Pools[j].Name })
	for i := range d.Pools {
		p := &d.Pools[i]
		sort.Slice(p.Offers, func(i, j int) bool { return p.Offers[i].Tenant < p.Offers[j].Tenant })
		sort.Slice(p.Flavors, func(i, j int) bool { return p.Flavors[i].Name < p.Flavors[j].Name })
		for j := range p.Offers {
			o := &p.Offers[j]
			if len(o.Quota) == 0 {
				o.Quota = nil
			}
			if len(o.ExcludedRegions) == 0 {
				o.ExcludedRegions = nil
			}
			sort.Strings(o.ExcludedRegions)
		}
		if len(p.Offers) == 0 {
			p.Offers = nil
		}
		if len(p.Flavors) == 0 {
			p.Flavors = nil
		}
	}
	sort.Slice(d.Nodes, func(i, j int) bool { return d.Nodes[i].Name < d.Nodes[j].Name })
	for i := range d.Nodes {
		n := &d.Nodes[i]
		if len(n.Labels) == 0 {
			n.Labels = nil
		}
		if len(n.Taints) == 0 {
			n.Taints = nil
		}
		sort.Slice(n.Taints, func(i, j int) bool {
			a, b := n.Taints[i], n.Taints[j]
			return a.Key < b.Key || (a.Key == b.Key && a.Effect < b.Effect)
		})
	}
	if len(d.Nodes) == 0 {
		d.Nodes = nil
	}
}

// Digest is the SHA-256 of a document's normalized JSON.
func Digest(d Document) string {
	Normalize(&d)
	b, _ := json.Marshal(d) // a Document always marshals
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Diff is the ordered changes that bring live to want: sites created and
// updated, pools created and updated, pools deleted, sites deleted.
func Diff(live Live, want Document) []Change {
	Normalize(&want)
	liveSites := map[string]Site{}
	for _, s := range live.Document.Sites {
		liveSites[s.Name] = s
	}
	livePools := map[string]Pool{}
	for _, p := range live.Document.Pools {
		livePools[p.Name] = p
	}
	var out []Change
	wantSites := map[string]bool{}
	for _, s := range want.Sites {
		wantSites[s.Name] = true
		s := s
		cur, ok := liveSites[s.Name]
		if !ok {
			out = append(out, Change{Op: OpCreate, Kind: KindSite, Name: s.Name, Site: &s})
			continue
		}
		f := fields([]FieldChange{{"kind", cur.Kind, s.Kind}, {"region", cur.Region, s.Region}, {"iamRegion", cur.IAMRegion, s.IAMRegion}})
		if len(f) > 0 {
			c := Change{Op: OpUpdate, Kind: KindSite, Name: s.Name, ID: live.SiteIDs[s.Name], Fields: f, Site: &s}
			if cur.Kind != s.Kind {
				c.Refused = "a site's kind never changes"
			}
			out = append(out, c)
		}
	}
	wantPools := map[string]bool{}
	for _, p := range want.Pools {
		wantPools[p.Name] = true
		p := p
		cur, ok := livePools[p.Name]
		if !ok {
			out = append(out, Change{Op: OpCreate, Kind: KindPool, Name: p.Name, Pool: bare(p)})
			continue
		}
		if p.Policy == nil {
			p.Policy = cur.Policy
		}
		f := fields([]FieldChange{{"site", cur.Site, p.Site}, {"class", cur.Class, p.Class}, {"gpuModel", cur.GPUModel, p.GPUModel},
			{"gpuMemoryGb", cur.GPUMemoryGb, p.GPUMemoryGb}, {"sharing", cur.Sharing, p.Sharing}, {"agent", cur.Agent, p.Agent},
			{"billingMode", cur.BillingMode, p.BillingMode}, {"policy", policyValue(cur.Policy, cur.Sharing), policyValue(p.Policy, p.Sharing)}})
		if len(f) > 0 {
			c := Change{Op: OpUpdate, Kind: KindPool, Name: p.Name, ID: live.PoolIDs[p.Name], Fields: f, Pool: bare(p)}
			if cur.Site != p.Site || cur.Class != p.Class || cur.GPUModel != p.GPUModel {
				c.Refused = "a pool's site, class and gpuModel never change"
			}
			out = append(out, c)
		}
	}
	// Each declared pool's flavors and offers, once the pools exist.
	for _, p := range want.Pools {
		cur := livePools[p.Name]
		out = append(out, diffFlavors(live, p.Name, cur.Flavors, p.Flavors)...)
		out = append(out, diffOffers(live, p.Name, cur.Offers, p.Offers)...)
	}
	out = append(out, diffNodes(live, want.Nodes)...)
	for _, p := range live.Document.Pools {
		if !wantPools[p.Name] {
			c := Change{Op: OpDelete, Kind: KindPool, Name: p.Name, ID: live.PoolIDs[p.Name]}
			if live.Busy[p.Name] {
				c.Refused = "the pool holds live reservations"
			}
			out = append(out, c)
		}
	}
	for _, s := range live.Document.Sites {
		if !wantSites[s.Name] {
			c := Change{Op: OpDelete, Kind: KindSite, Name: s.Name, ID: live.SiteIDs[s.Name]}
			if live.Kept[s.Name] {
				c.Refused = "the site has pools the document does not hold (provider pools)"
			}
			out = append(out, c)
		}
	}
	return out
}

// bare is a pool without its offers and flavors, as its own change
// carries it.
func bare(p Pool) *Pool {
	p.Offers, p.Flavors = nil, nil
	return &p
}

func diffFlavors(live Live, pool string, cur, want []Flavor) []Change {
	have := map[string]Flavor{}
	for _, f := range cur {
		have[f.Name] = f
	}
	var out []Change
	declared := map[string]bool{}
	for _, f := range want {
		f := f
		declared[f.Name] = true
		key := pool + "/" + f.Name
		c, ok := have[f.Name]
		if !ok {
			out = append(out, Change{Op: OpCreate, Kind: KindFlavor, Name: key, PoolName: pool, Flavor: &f})
			continue
		}
		fs := fields([]FieldChange{{"vcpu", c.VCPU, f.VCPU}, {"memoryGiB", c.MemoryGiB, f.MemoryGiB}, {"diskGiB", c.DiskGiB, f.DiskGiB},
			{"gpus", c.GPUs, f.GPUs}, {"runtime", c.Runtime, f.Runtime}})
		if len(fs) > 0 {
			ch := Change{Op: OpUpdate, Kind: KindFlavor, Name: key, PoolName: pool, ID: live.FlavorIDs[key], Fields: fs, Flavor: &f}
			if c.Runtime != f.Runtime {
				ch.Refused = "a flavor's runtime never changes"
			}
			out = append(out, ch)
		}
	}
	for _, f := range cur {
		if key := pool + "/" + f.Name; !declared[f.Name] {
			out = append(out, Change{Op: OpDelete, Kind: KindFlavor, Name: key, PoolName: pool, ID: live.FlavorIDs[key]})
		}
	}
	return out
}

func diffOffers(live Live, pool string, cur, want []Offer) []Change {
	have := map[string]Offer{}
	for _, o := range cur {
		have[o.Tenant] = o
	}
	var out []Change
	declared := map[string]bool{}
	for _, o := range want {
		o := o
		declared[o.Tenant] = true
		key := pool + "/" + o.Tenant
		c, ok := have[o.Tenant]
		if !ok {
			ch := Change{Op: OpCreate, Kind: KindOffer, Name: key, PoolName: pool, Offer: &o}
			if o.Tenant == live.TenantID {
				ch.Refused = "a pool is not offered to its own tenant"
			}
			out = append(out, ch)
			continue
		}
		fs := fields([]FieldChange{{"quota", jsonOf(c.Quota), jsonOf(o.Quota)}, {"priority", c.Priority, o.Priority},
			{"includeDescendants", c.IncludeDescendants, o.IncludeDescendants}, {"suspended", c.Suspended, o.Suspended},
			{"excludedRegions", c.ExcludedRegions, o.ExcludedRegions}})
		if len(fs) > 0 {
			out = append(out, Change{Op: OpUpdate, Kind: KindOffer, Name: key, PoolName: pool, Fields: fs, Offer: &o})
		}
	}
	for _, o := range cur {
		if !declared[o.Tenant] {
			o := o
			out = append(out, Change{Op: OpDelete, Kind: KindOffer, Name: pool + "/" + o.Tenant, PoolName: pool, Offer: &o})
		}
	}
	return out
}

// diffNodes compares the declared nodes' labels and taints with the live
// ones; a node left out of the document is left alone.
func diffNodes(live Live, want []Node) []Change {
	have := map[string]Node{}
	for _, n := range live.Document.Nodes {
		have[n.Name] = n
	}
	var out []Change
	for _, n := range want {
		n := n
		id, ok := live.NodeIDs[n.Name]
		if !ok {
			out = append(out, Change{Op: OpUpdate, Kind: KindNode, Name: n.Name, Node: &n,
				Refused: "no such node: nodes are enrolled or joined, never created by the document"})
			continue
		}
		c := have[n.Name]
		fs := fields([]FieldChange{{"labels", jsonOf(c.Labels), jsonOf(n.Labels)}, {"taints", jsonOf(c.Taints), jsonOf(n.Taints)}})
		if len(fs) > 0 {
			out = append(out, Change{Op: OpUpdate, Kind: KindNode, Name: n.Name, ID: id, Fields: fs, Node: &n})
		}
	}
	return out
}

// jsonOf is v as JSON values, an empty map or list as nothing.
func jsonOf(v any) any {
	b, _ := json.Marshal(v) // the document's values always marshal
	var out any
	_ = json.Unmarshal(b, &out)
	switch x := out.(type) {
	case map[string]any:
		if len(x) == 0 {
			return nil
		}
	case []any:
		if len(x) == 0 {
			return nil
		}
	}
	return out
}

// Refused is the changes that cannot be applied.
func Refused(changes []Change) []Change {
	var out []Change
	for _, c := range changes {
		if c.Refused != "" {
			out = append(out, c)
		}
	}
	return out
}

// policyValue is a policy as compared: validated (defaulted) for its
// sharing, as JSON values.
func policyValue(p *policy.Policy, sharing string) any {
	if v, err := policy.Validate(p, sharing); err == nil {
		p = &v
	}
	return jsonOf(p)
}

// fields keeps the fields whose values differ.
func fields(all []FieldChange) []FieldChange {
	var out []FieldChange
	for _, f := range all {
		if !reflect.DeepEqual(f.Before, f.After) {
			out = append(out, f)
		}
	}
	return out
}

// Package fleet is the fleet document (better-compute/fleet/v1): the root
// tenant's sites and pools declared by name, its schema, and the diff of a
// document against the live state (docs/fleet-as-code.md). No I/O.
package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"

	"sigs.k8s.io/yaml"

	"github.com/better-compute/better-compute/core"
	policy "github.com/better-compute/better-compute/core/pools"
)

// APIVersion is the document's version.
const APIVersion = "better-compute/fleet/v1"

// Document is the declared fleet. Keys are names, unique in the tenant.
type Document struct {
	APIVersion string `json:"apiVersion" jsonschema:"required,enum=better-compute/fleet/v1"`
	Sites      []Site `json:"sites" jsonschema:"maxItems=1000"`
	Pools      []Pool `json:"pools" jsonschema:"maxItems=5000"`
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
}

// Kinds of a change, in the order creates and updates run.
const (
	KindSite = "site"
	KindPool = "pool"
)

// Ops of a change.
const (
	OpCreate = "create"
	OpUpdate = "update"
	OpDelete = "delete"
)

// Change is one step of a plan. Site or Pool is the declared object
// (create, update); ID is the live object's (update, delete). Refused says
// why the change cannot be applied.
type Change struct {
	Op      string        `json:"op"`
	Kind    string        `json:"kind"`
	Name    string        `json:"name"`
	ID      string        `json:"id,omitempty"`
	Fields  []FieldChange `json:"fields,omitempty"`
	Site    *Site         `json:"site,omitempty"`
	Pool    *Pool         `json:"pool,omitempty"`
	Refused string        `json:"refused,omitempty"`
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
	Document Document
	SiteIDs  map[string]string
	PoolIDs  map[string]string
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
			out = append(out, Change{Op: OpCreate, Kind: KindPool, Name: p.Name, Pool: &p})
			continue
		}
		if p.Policy == nil {
			p.Policy = cur.Policy
		}
		f := fields([]FieldChange{{"site", cur.Site, p.Site}, {"class", cur.Class, p.Class}, {"gpuModel", cur.GPUModel, p.GPUModel},
			{"gpuMemoryGb", cur.GPUMemoryGb, p.GPUMemoryGb}, {"sharing", cur.Sharing, p.Sharing}, {"agent", cur.Agent, p.Agent},
			{"billingMode", cur.BillingMode, p.BillingMode}, {"policy", policyValue(cur.Policy, cur.Sharing), policyValue(p.Policy, p.Sharing)}})
		if len(f) > 0 {
			c := Change{Op: OpUpdate, Kind: KindPool, Name: p.Name, ID: live.PoolIDs[p.Name], Fields: f, Pool: &p}
			if cur.Site != p.Site || cur.Class != p.Class || cur.GPUModel != p.GPUModel {
				c.Refused = "a pool's site, class and gpuModel never change"
			}
			out = append(out, c)
		}
	}
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
	b, _ := json.Marshal(p) // a Policy always marshals
	var out any
	_ = json.Unmarshal(b, &out)
	return out
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

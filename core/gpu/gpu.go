// Package gpu normalizes GPU names into the two names Better Compute uses: the
// gpuProduct (the normalized NVML or AMD SMI name, for example H100-SXM5-80GB)
// and the gpuModel family (H100) that pools, policies and meters use. The
// mapping lives in the versioned gpu-models.json embedded in this package,
// which also lists each product's memory, form factor and MIG profiles.
package gpu

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/better-compute/better-compute/core"
)

// Other is the gpuModel (and vendor) of a GPU whose name the catalog does not know.
const Other = "other"

// SchemaName is the value of the catalog's "schema" field.
const SchemaName = "better-compute/gpu-models"

//go:embed gpu-models.json
var embedded []byte

// MigProfile is one MIG GPU-instance profile of a product, such as 3g.40gb.
type MigProfile struct {
	Name          string `json:"name"`
	ComputeSlices int    `json:"computeSlices"`
	MemorySlices  int    `json:"memorySlices"`
	MemoryGiB     int    `json:"memoryGiB"`
	MaxInstances  int    `json:"maxInstances"`
}

// MigProfileSet is the MIG geometry shared by products of the same memory size.
type MigProfileSet struct {
	ComputeSlices int          `json:"computeSlices"`
	MemorySlices  int          `json:"memorySlices"`
	Profiles      []MigProfile `json:"profiles"`
}

// Product is one normalized GPU product.
type Product struct {
	Product       string   `json:"product"`
	FormFactor    string   `json:"formFactor"`
	MemoryGiB     int      `json:"memoryGiB"`
	MigProfileSet string   `json:"migProfileSet,omitempty"`
	Match         []string `json:"match"`

	// Filled in by Parse.
	Family  string         `json:"-"`
	Vendor  string         `json:"-"`
	Mig     *MigProfileSet `json:"-"`
	matches []*regexp.Regexp
}

// Model is a GPU family and its products.
type Model struct {
	Family   string    `json:"family"`
	Vendor   string    `json:"vendor"`
	Products []Product `json:"products"`
}

// Catalog is a parsed gpu-models.json.
type Catalog struct {
	Schema         string                   `json:"schema"`
	Version        int                      `json:"version"`
	MigProfileSets map[string]MigProfileSet `json:"migProfileSets"`
	Models         []Model                  `json:"models"`

	byProduct map[string]*Product
}

// Info is what Normalize makes of a GPU name.
type Info struct {
	// Name is the name as reported (NVML, AMD SMI).
	Name string `json:"name"`
	// Product is the gpuProduct; for an unknown name, a sanitized form of it.
	Product string `json:"gpuProduct"`
	// Model is the gpuModel family, Other when unknown.
	Model      string `json:"gpuModel"`
	Vendor     string `json:"vendor"`
	FormFactor string `json:"formFactor,omitempty"`
	// MemoryGiB is the product's nominal memory, 0 when unknown.
	MemoryGiB int `json:"memoryGiB,omitempty"`
	// Known is false when the name matched no product (gpuModel "other").
	Known bool `json:"known"`
	// CatalogVersion is the version of the gpu-models.json that decided.
	CatalogVersion int `json:"catalogVersion"`
}

// Parse reads and validates a gpu-models.json document.
func Parse(data []byte) (*Catalog, error) {
	var c Catalog
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, core.Wrap(core.CodeInvalidConfig, err, "gpu-models.json: cannot parse")
	}
	bad := func(format string, args ...any) error {
		return core.Errorf(core.CodeInvalidConfig, "gpu-models.json: "+format, args...)
	}
	if c.Schema != SchemaName {
		return nil, bad("schema is %q, want %q", c.Schema, SchemaName)
	}
	if c.Version < 1 {
		return nil, bad("version must be at least 1")
	}
	for name, set := range c.MigProfileSets {
		if set.ComputeSlices < 1 || set.MemorySlices < 1 || len(set.Profiles) == 0 {
			return nil, bad("MIG profile set %q is empty", name)
		}
		seen := map[string]bool{}
		for _, p := range set.Profiles {
			if p.Name == "" || seen[p.Name] || p.ComputeSlices < 1 || p.ComputeSlices > set.ComputeSlices ||
				p.MemorySlices < 1 || p.MemorySlices > set.MemorySlices || p.MemoryGiB < 1 || p.MaxInstances < 1 {
				return nil, bad("MIG profile set %q: invalid profile %q", name, p.Name)
			}
			seen[p.Name] = true
		}
	}
	c.byProduct = map[string]*Product{}
	families := map[string]bool{}
	for mi := range c.Models {
		m := &c.Models[mi]
		if m.Family == "" || m.Family == Other || families[m.Family] {
			return nil, bad("family %q is empty, reserved or repeated", m.Family)
		}
		families[m.Family] = true
		if m.Vendor == "" || len(m.Products) == 0 {
			return nil, bad("family %q needs a vendor and products", m.Family)
		}
		for pi := range m.Products {
			p := &m.Products[pi]
			if p.Product == "" || c.byProduct[p.Product] != nil {
				return nil, bad("product %q is empty or repeated", p.Product)
			}
			if p.MemoryGiB < 1 || p.FormFactor == "" || len(p.Match) == 0 {
				return nil, bad("product %q needs memoryGiB, formFactor and match", p.Product)
			}
			p.Family, p.Vendor = m.Family, m.Vendor
			if p.MigProfileSet != "" {
				set, ok := c.MigProfileSets[p.MigProfileSet]
				if !ok {
					return nil, bad("product %q: unknown MIG profile set %q", p.Product, p.MigProfileSet)
				}
				p.Mig = &set
			}
			for _, expr := range p.Match {
				re, err := regexp.Compile(expr)
				if err != nil {
					return nil, bad("product %q: bad match %q: %v", p.Product, expr, err)
				}
				p.matches = append(p.matches, re)
			}
			c.byProduct[p.Product] = p
		}
	}
	return &c, nil
}

var (
	defaultOnce    sync.Once
	defaultCatalog *Catalog
)

// Default returns the catalog embedded in this package. It panics if the
// embedded file is invalid, which the package's tests rule out.
func Default() *Catalog {
	defaultOnce.Do(func() {
		c, err := Parse(embedded)
		if err != nil {
			panic(err)
		}
		defaultCatalog = c
	})
	return defaultCatalog
}

// Normalize maps a GPU name through the embedded catalog.
func Normalize(name string) Info { return Default().Normalize(name) }

var (
	spaces = regexp.MustCompile(`[\s_]+`)
	// vendorPrefix strips brand words NVML and AMD SMI put before the product.
	vendorPrefix = regexp.MustCompile(`^(NVIDIA |TESLA |AMD |ADVANCED MICRO DEVICES,? (INC\.? )?|RADEON |INSTINCT )+`)
	unsafeChars  = regexp.MustCompile(`[^A-Z0-9.+]+`)
)

// MatchKey is the form of a name the catalog's match expressions see: upper
// case, runs of white space and underscores as one space, brand prefixes
// (NVIDIA, Tesla, AMD, Instinct) removed.
func MatchKey(name string) string {
	s := strings.TrimSpace(spaces.ReplaceAllString(strings.ToUpper(name), " "))
	return strings.TrimSpace(vendorPrefix.ReplaceAllString(s, ""))
}

// Normalize maps a GPU name to its product and family. A name no product
// matches yields Model Other, Known false and a sanitized Product (upper case,
// brand prefix removed, other characters as dashes).
func (c *Catalog) Normalize(name string) Info {
	key := MatchKey(name)
	if key != "" {
		for mi := range c.Models {
			for pi := range c.Models[mi].Products {
				p := &c.Models[mi].Products[pi]
				for _, re := range p.matches {
					if re.MatchString(key) {
						return Info{Name: name, Product: p.Product, Model: p.Family, Vendor: p.Vendor,
							FormFactor: p.FormFactor, MemoryGiB: p.MemoryGiB, Known: true, CatalogVersion: c.Version}
					}
				}
			}
		}
	}
	product := strings.Trim(unsafeChars.ReplaceAllString(key, "-"), "-")
	if product == "" {
		product = Other
	}
	return Info{Name: name, Product: product, Model: Other, Vendor: vendorOf(name), CatalogVersion: c.Version}
}

func vendorOf(name string) string {
	u := strings.ToUpper(name)
	switch {
	case strings.Contains(u, "NVIDIA") || strings.HasPrefix(u, "TESLA"):
		return "nvidia"
	case strings.Contains(u, "AMD") || strings.Contains(u, "ADVANCED MICRO DEVICES") || strings.Contains(u, "INSTINCT"):
		return "amd"
	}
	return Other
}

// Product returns a product by its normalized name.
func (c *Catalog) Product(product string) (*Product, bool) {
	p, ok := c.byProduct[product]
	return p, ok
}

// Families lists the gpuModel families, sorted.
func (c *Catalog) Families() []string {
	out := make([]string, 0, len(c.Models))
	for _, m := range c.Models {
		out = append(out, m.Family)
	}
	sort.Strings(out)
	return out
}

// MigProfiles returns the MIG profiles of a product; nil when it has no MIG.
func (c *Catalog) MigProfiles(product string) []MigProfile {
	p, ok := c.byProduct[product]
	if !ok || p.Mig == nil {
		return nil
	}
	return append([]MigProfile(nil), p.Mig.Profiles...)
}

// MigProfile returns one MIG profile of a product.
func (c *Catalog) MigProfile(product, profile string) (MigProfile, bool) {
	for _, p := range c.MigProfiles(product) {
		if p.Name == profile {
			return p, true
		}
	}
	return MigProfile{}, false
}

// MigLayout is the MIG layout applied to each GPU: profile name → instances.
type MigLayout map[string]int

// Expand lists the layout's instances in canonical order: largest compute
// slices first, then memory, then name, so the same layout always yields the
// same sequence whatever the map order.
func (c *Catalog) Expand(product string, layout MigLayout) ([]MigProfile, error) {
	if err := c.ValidateMigLayout(product, layout); err != nil {
		return nil, err
	}
	var out []MigProfile
	for name, n := range layout {
		p, _ := c.MigProfile(product, name)
		for range n {
			out = append(out, p)
		}
	}
	SortProfiles(out)
	return out, nil
}

// SortProfiles sorts profiles in canonical layout order.
func SortProfiles(ps []MigProfile) {
	sort.SliceStable(ps, func(i, j int) bool {
		a, b := ps[i], ps[j]
		if a.ComputeSlices != b.ComputeSlices {
			return a.ComputeSlices > b.ComputeSlices
		}
		if a.MemorySlices != b.MemorySlices {
			return a.MemorySlices > b.MemorySlices
		}
		return a.Name < b.Name
	})
}

// ValidateMigLayout checks a layout against a product: every profile exists,
// no profile exceeds its instance limit and the instances fit the GPU's
// compute and memory slices. Placement rules finer than slice counts are the
// driver's to enforce.
func (c *Catalog) ValidateMigLayout(product string, layout MigLayout) error {
	p, ok := c.byProduct[product]
	if !ok || p.Mig == nil {
		return core.Errorf(core.CodeUnsupported, "GPU product %q does not support MIG", product)
	}
	if len(layout) == 0 {
		return core.Errorf(core.CodeInvalidInput, "MIG layout is empty")
	}
	var compute, memory int
	names := make([]string, 0, len(layout))
	for name := range layout {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		n := layout[name]
		prof, ok := c.MigProfile(product, name)
		if !ok {
			return core.Errorf(core.CodeInvalidInput, "MIG profile %q does not exist on %s", name, product)
		}
		if n < 1 || n > prof.MaxInstances {
			return core.Errorf(core.CodeInvalidInput, "MIG profile %q: %d instances, allowed 1 to %d", name, n, prof.MaxInstances)
		}
		compute += n * prof.ComputeSlices
		memory += n * prof.MemorySlices
	}
	if compute > p.Mig.ComputeSlices || memory > p.Mig.MemorySlices {
		return core.Errorf(core.CodeInvalidInput,
			"MIG layout needs %d compute and %d memory slices, %s has %d and %d",
			compute, memory, product, p.Mig.ComputeSlices, p.Mig.MemorySlices)
	}
	return nil
}

// String renders a layout canonically, for example "3g.40gb:2,1g.10gb:1".
func (l MigLayout) String() string {
	names := make([]string, 0, len(l))
	for n := range l {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s:%d", n, l[n])
	}
	return strings.Join(parts, ",")
}

package gpu

import (
	"errors"
	"testing"

	"github.com/better-compute/better-compute/core"
)

func TestEmbeddedCatalog(t *testing.T) {
	c := Default()
	if c.Version < 1 || c.Schema != SchemaName {
		t.Fatalf("version %d schema %q", c.Version, c.Schema)
	}
	for _, fam := range []string{"A100", "H100", "H200", "B200", "GB200", "L40S", "L4", "A10", "MI300X"} {
		found := false
		for _, f := range c.Families() {
			found = found || f == fam
		}
		if !found {
			t.Errorf("family %s missing from gpu-models.json", fam)
		}
	}
}

func TestNormalize(t *testing.T) {
	tests := []struct {
		name, product, model, vendor, form string
		mem                                int
	}{
		// A100: SXM4 and PCIe, 40 and 80 GB, with and without the NVIDIA prefix.
		{"NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB", "A100", "nvidia", "SXM4", 40},
		{"A100-SXM4-40GB", "A100-SXM4-40GB", "A100", "nvidia", "SXM4", 40},
		{"NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", "A100", "nvidia", "SXM4", 80},
		{"NVIDIA A100-SXM-80GB", "A100-SXM4-80GB", "A100", "nvidia", "SXM4", 80},
		{"NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB", "A100", "nvidia", "PCIe", 40},
		{"NVIDIA A100 80GB PCIe", "A100-PCIE-80GB", "A100", "nvidia", "PCIe", 80},
		{"  nvidia   a100 80gb pcie ", "A100-PCIE-80GB", "A100", "nvidia", "PCIe", 80},
		// A30
		{"NVIDIA A30", "A30-PCIE-24GB", "A30", "nvidia", "PCIe", 24},
		// A10 and AWS A10G
		{"NVIDIA A10", "A10-PCIE-24GB", "A10", "nvidia", "PCIe", 24},
		{"NVIDIA A10G", "A10G-PCIE-24GB", "A10", "nvidia", "PCIe", 24},
		// H100: SXM5, PCIe, NVL
		{"NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", "H100", "nvidia", "SXM5", 80},
		{"NVIDIA H100 SXM5 80GB", "H100-SXM5-80GB", "H100", "nvidia", "SXM5", 80},
		{"NVIDIA H100-SXM5-80GB", "H100-SXM5-80GB", "H100", "nvidia", "SXM5", 80},
		{"NVIDIA H100 PCIe", "H100-PCIE-80GB", "H100", "nvidia", "PCIe", 80},
		{"NVIDIA H100 80GB HBM2e", "H100-PCIE-80GB", "H100", "nvidia", "PCIe", 80},
		{"NVIDIA H100 NVL", "H100-NVL-94GB", "H100", "nvidia", "NVL", 94},
		// H200: SXM and NVL
		{"NVIDIA H200", "H200-SXM5-141GB", "H200", "nvidia", "SXM5", 141},
		{"NVIDIA H200 141GB HBM3e", "H200-SXM5-141GB", "H200", "nvidia", "SXM5", 141},
		{"NVIDIA H200 NVL", "H200-NVL-141GB", "H200", "nvidia", "NVL", 141},
		// GH200
		{"NVIDIA GH200 480GB", "GH200-96GB", "GH200", "nvidia", "Superchip", 96},
		{"NVIDIA GH200 144G HBM3e", "GH200-144GB", "GH200", "nvidia", "Superchip", 144},
		// B200
		{"NVIDIA B200", "B200-SXM6-180GB", "B200", "nvidia", "SXM6", 180},
		{"NVIDIA HGX B200", "B200-SXM6-180GB", "B200", "nvidia", "SXM6", 180},
		// GB200
		{"NVIDIA GB200", "GB200-186GB", "GB200", "nvidia", "Superchip", 186},
		{"NVIDIA GB200 NVL72", "GB200-186GB", "GB200", "nvidia", "Superchip", 186},
		// L40S, L40, L4 — none may swallow another
		{"NVIDIA L40S", "L40S-PCIE-48GB", "L40S", "nvidia", "PCIe", 48},
		{"NVIDIA L40", "L40-PCIE-48GB", "L40", "nvidia", "PCIe", 48},
		{"NVIDIA L4", "L4-PCIE-24GB", "L4", "nvidia", "PCIe", 24},
		// T4
		{"Tesla T4", "T4-PCIE-16GB", "T4", "nvidia", "PCIe", 16},
		// AMD SMI, rocm-smi and lspci spellings of MI300X
		{"AMD Instinct MI300X", "MI300X-OAM-192GB", "MI300X", "amd", "OAM", 192},
		{"AMD Instinct MI300X OAM", "MI300X-OAM-192GB", "MI300X", "amd", "OAM", 192},
		{"MI300X-O", "MI300X-OAM-192GB", "MI300X", "amd", "OAM", 192},
		{"AMD Instinct MI300X VF", "MI300X-OAM-192GB", "MI300X", "amd", "OAM", 192},
		{"Aqua Vanjaram [Instinct MI300X OAM]", "MI300X-OAM-192GB", "MI300X", "amd", "OAM", 192},
		{"AMD Instinct MI325X", "MI325X-OAM-256GB", "MI325X", "amd", "OAM", 256},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Normalize(tt.name)
			if !got.Known || got.Product != tt.product || got.Model != tt.model || got.Vendor != tt.vendor ||
				got.FormFactor != tt.form || got.MemoryGiB != tt.mem || got.Name != tt.name {
				t.Fatalf("Normalize(%q) = %+v, want %s/%s/%s/%s/%d", tt.name, got, tt.product, tt.model, tt.vendor, tt.form, tt.mem)
			}
		})
	}
}

func TestNormalizeUnknown(t *testing.T) {
	tests := []struct{ name, product, vendor string }{
		{"NVIDIA RTX 6000 Ada Generation", "RTX-6000-ADA-GENERATION", "nvidia"},
		{"NVIDIA GeForce RTX 4090", "GEFORCE-RTX-4090", "nvidia"},
		{"NVIDIA A1000", "A1000", "nvidia"},        // not an A100 or A10
		{"NVIDIA H1000", "H1000", "nvidia"},        // not an H100
		{"NVIDIA L4000", "L4000", "nvidia"},        // not an L4
		{"AMD Instinct MI3000X", "MI3000X", "amd"}, // not an MI300X
		{"Intel Data Center GPU Max 1550", "INTEL-DATA-CENTER-GPU-MAX-1550", Other},
		{"", Other, Other},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Normalize(tt.name)
			if got.Known || got.Model != Other || got.Product != tt.product || got.Vendor != tt.vendor || got.MemoryGiB != 0 {
				t.Fatalf("Normalize(%q) = %+v, want unknown %s/%s", tt.name, got, tt.product, tt.vendor)
			}
		})
	}
}

func TestEveryProductMatchesItsOwnName(t *testing.T) {
	// A product's normalized name must map back to itself, so gpuProduct is a
	// fixed point and selectors may use either name.
	c := Default()
	for _, m := range c.Models {
		for _, p := range m.Products {
			if got := c.Normalize(p.Product); got.Product != p.Product {
				t.Errorf("Normalize(%q) = %q", p.Product, got.Product)
			}
		}
	}
}

func TestMigProfiles(t *testing.T) {
	c := Default()
	tests := []struct {
		product string
		want    []string
	}{
		{"A100-PCIE-40GB", []string{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}},
		{"A100-PCIE-80GB", []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}},
		{"H100-SXM5-80GB", []string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}},
		{"H200-SXM5-141GB", []string{"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}},
		{"B200-SXM6-180GB", []string{"1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"}},
		{"A30-PCIE-24GB", []string{"1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"}},
		{"L40S-PCIE-48GB", nil},
		{"MI300X-OAM-192GB", nil},
		{"no-such-product", nil},
	}
	for _, tt := range tests {
		got := c.MigProfiles(tt.product)
		if len(got) != len(tt.want) {
			t.Errorf("%s: %d profiles, want %d", tt.product, len(got), len(tt.want))
			continue
		}
		for i := range got {
			if got[i].Name != tt.want[i] {
				t.Errorf("%s[%d] = %s, want %s", tt.product, i, got[i].Name, tt.want[i])
			}
		}
	}
}

func TestValidateMigLayout(t *testing.T) {
	c := Default()
	tests := []struct {
		product string
		layout  MigLayout
		code    core.Code // "" = valid
	}{
		{"A100-PCIE-40GB", MigLayout{"1g.5gb": 7}, ""},
		{"A100-PCIE-40GB", MigLayout{"3g.20gb": 2}, ""},
		{"A100-PCIE-40GB", MigLayout{"4g.20gb": 1, "3g.20gb": 1}, ""},
		{"A100-PCIE-40GB", MigLayout{"7g.40gb": 1}, ""},
		{"A100-PCIE-40GB", MigLayout{"3g.20gb": 2, "1g.5gb": 1}, core.CodeInvalidInput}, // 9 memory slices
		{"A100-PCIE-40GB", MigLayout{"1g.5gb": 8}, core.CodeInvalidInput},
		{"A100-PCIE-40GB", MigLayout{"1g.10gb": 1}, ""},
		{"A100-PCIE-40GB", MigLayout{"3g.40gb": 1}, core.CodeInvalidInput}, // an 80 GB profile
		{"A100-PCIE-40GB", MigLayout{"1g.5gb": 0}, core.CodeInvalidInput},
		{"A100-PCIE-40GB", MigLayout{}, core.CodeInvalidInput},
		{"H100-SXM5-80GB", MigLayout{"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, ""},
		{"H100-SXM5-80GB", MigLayout{"4g.40gb": 2}, core.CodeInvalidInput},
		{"L40S-PCIE-48GB", MigLayout{"1g.10gb": 1}, core.CodeUnsupported},
	}
	for _, tt := range tests {
		err := c.ValidateMigLayout(tt.product, tt.layout)
		if tt.code == "" {
			if err != nil {
				t.Errorf("%s %s: %v", tt.product, tt.layout, err)
			}
			continue
		}
		var ce *core.Error
		if !errors.As(err, &ce) || ce.Code != tt.code {
			t.Errorf("%s %s: err %v, want %s", tt.product, tt.layout, err, tt.code)
		}
	}
}

func TestExpandIsCanonical(t *testing.T) {
	c := Default()
	for range 20 { // map iteration order varies between runs
		got, err := c.Expand("H100-SXM5-80GB", MigLayout{"1g.10gb": 2, "3g.40gb": 1, "2g.20gb": 1})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"}
		for i := range want {
			if got[i].Name != want[i] {
				t.Fatalf("Expand = %v, want %v", got, want)
			}
		}
	}
}

func TestParseRejects(t *testing.T) {
	bad := []string{
		`{`,
		`{"schema":"x","version":1,"models":[]}`,
		`{"schema":"better-compute/gpu-models","version":0,"models":[]}`,
		`{"schema":"better-compute/gpu-models","version":1,"unknown":1,"models":[]}`,
		`{"schema":"better-compute/gpu-models","version":1,"models":[{"family":"other","vendor":"x","products":[{"product":"p","formFactor":"f","memoryGiB":1,"match":["^P$"]}]}]}`,
		`{"schema":"better-compute/gpu-models","version":1,"models":[{"family":"F","vendor":"x","products":[{"product":"p","formFactor":"f","memoryGiB":1,"match":["("]}]}]}`,
		`{"schema":"better-compute/gpu-models","version":1,"models":[{"family":"F","vendor":"x","products":[{"product":"p","formFactor":"f","memoryGiB":1,"match":["^P$"],"migProfileSet":"nope"}]}]}`,
		`{"schema":"better-compute/gpu-models","version":1,"models":[{"family":"F","vendor":"x","products":[{"product":"p","formFactor":"f","memoryGiB":1,"match":["^P$"]},{"product":"p","formFactor":"f","memoryGiB":1,"match":["^Q$"]}]}]}`,
	}
	for _, doc := range bad {
		if _, err := Parse([]byte(doc)); err == nil {
			t.Errorf("Parse(%s) succeeded", doc)
		}
	}
}

package inventory

import (
	"encoding/json"
	"testing"
)

// Copies of a sample are distinct machines: their own trusted hardware key
// and device ids, and the same shape (GPU count and products).
func TestSampleCopiesAreDistinctMachines(t *testing.T) {
	for _, name := range []string{"h100-8x-sxm.json", "h200-8x.json", "a100-4x-pcie-mig.json", "cpu-only.json"} {
		t.Run(name, func(t *testing.T) {
			inv, err := Sample(name)
			if err != nil {
				t.Fatal(err)
			}
			orig := ComputeHardwareKey(inv)
			a, b := inv.Copy(1), inv.Copy(2)
			ka, kb := ComputeHardwareKey(a), ComputeHardwareKey(b)
			if ka.Key == kb.Key || ka.Key == orig.Key {
				t.Fatal("copies share a hardware key")
			}
			if ka.Trusted != orig.Trusted || kb.Trusted != orig.Trusted {
				t.Fatalf("a copy's key trust changed: %v/%v, original %v", ka.Trusted, kb.Trusted, orig.Trusted)
			}
			if again := ComputeHardwareKey(inv.Copy(1)); again.Key != ka.Key {
				t.Fatal("copies are not deterministic")
			}
			if len(a.GPUs.Devices) != len(inv.GPUs.Devices) {
				t.Fatal("a copy changed the GPU count")
			}
			for i := range a.GPUs.Devices {
				if a.GPUs.Devices[i].UUID == inv.GPUs.Devices[i].UUID || a.GPUs.Devices[i].Name != inv.GPUs.Devices[i].Name {
					t.Fatalf("GPU %d: %q/%q", i, a.GPUs.Devices[i].UUID, a.GPUs.Devices[i].Name)
				}
			}
			if _, err := Parse(mustJSON(t, a)); err != nil {
				t.Fatalf("a copy is not a valid inventory: %v", err)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

package flavors_test

import (
	"testing"

	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store/flavors"
)

func TestGPUClassOf(t *testing.T) {
	for sharing, want := range map[string]string{
		"exclusive": "gpu", "mig": "gpu.mig", "timeslice": "gpu.slot", "mps": "gpu.slot",
	} {
		if got := flavors.GPUClassOf(sharing); got != want {
			t.Errorf("GPUClassOf(%s) = %s, want %s", sharing, got, want)
		}
	}
}

func TestMemoryMiBOf(t *testing.T) {
	for _, tc := range []struct {
		gib  float64
		mib  int64
		fail bool
	}{
		{0.0625, 64, false}, {1, 1024, false}, {1.5, 1536, false}, {4096, 4 << 20, false},
		{1.0001, 0, true}, {0.1, 0, true},
	} {
		got, err := flavors.MemoryMiBOf(tc.gib)
		if tc.fail {
			if ce := core.AsError(err); ce == nil || ce.Code != core.CodeInvalidInput || ce.Details["reason"] != "multipleOf" {
				t.Errorf("MemoryMiBOf(%v) = %d, %v; want INVALID_INPUT multipleOf", tc.gib, got, err)
			}
			continue
		}
		if err != nil || got != tc.mib {
			t.Errorf("MemoryMiBOf(%v) = %d, %v; want %d", tc.gib, got, err, tc.mib)
		}
	}
}

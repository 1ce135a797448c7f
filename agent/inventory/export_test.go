package inventory

import (
	"context"
	"slices"

	"github.com/better-compute/better-compute/core/inventory"
)

// Static is a fixed gpus section: a GPU source for tests that need no NVML
// and no simulation spec.
type Static struct {
	Section inventory.GPUs
}

// GPUs returns a copy of the section.
func (s Static) GPUs(context.Context) (inventory.GPUs, error) {
	out := s.Section
	out.Devices = slices.Clone(s.Section.Devices)
	out.NVSwitches = slices.Clone(s.Section.NVSwitches)
	return out, nil
}

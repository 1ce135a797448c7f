//go:build !linux || !cgo

package inventory

import (
	"context"

	"github.com/better-compute/better-compute/core/inventory"
)

// NVML is unavailable in this build: go-nvml needs cgo on Linux.
type NVML struct {
	LibraryPath string
}

// GPUs always fails in this build: reporting no GPUs instead would make a
// GPU node look GPU-less.
func (NVML) GPUs(context.Context) (inventory.GPUs, error) {
	return inventory.GPUs{Devices: []inventory.GPU{}}, ErrNVMLUnavailable
}

//go:build linux && cgo

package inventory

import (
	"context"
	"testing"
)

func TestNVMLWithoutLibrary(t *testing.T) {
	// A machine without the NVIDIA driver has no GPUs; that is not an error.
	section, err := NVML{LibraryPath: "/nonexistent/libnvidia-ml.so.1"}.GPUs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(section.Devices) != 0 || section.Devices == nil {
		t.Errorf("devices = %#v, want an empty list", section.Devices)
	}
}

package lifecycle

import (
	"context"

	"github.com/better-compute/better-compute/workflows/metal"
)

// StageImage stages nothing: the fake site answers where its boot server
// would serve the image, as the request describes it.
func (f *fakeSite) StageImage(_ context.Context, r metal.StageImageRequest) (metal.StageImageResult, error) {
	f.record("StageImage")
	return metal.StageImageResult{URL: "http://boot.invalid/images/" + r.Machine.NodeID + "/" + r.SHA256,
		SHA256: r.SHA256, SizeBytes: r.SizeBytes}, nil
}

// SetBootDevice records the device set.
func (f *fakeSite) SetBootDevice(_ context.Context, r metal.BootDeviceRequest) (metal.BootDeviceResult, error) {
	f.record("SetBootDevice " + r.Device)
	return metal.BootDeviceResult{Device: r.Device, Persistent: r.Persistent, Driver: "redfish/v1"}, nil
}

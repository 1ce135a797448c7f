package api_test

import (
	"context"

	"go.temporal.io/sdk/temporal"

	sitewf "github.com/better-compute/better-compute/workflows/metal"
)

// The metal lifecycle tests of this package run no provisioning step: the
// HTTP site serves neither staging nor a boot device, and says so.
func (s *httpSite) StageImage(context.Context, sitewf.StageImageRequest) (sitewf.StageImageResult, error) {
	return sitewf.StageImageResult{}, temporal.NewNonRetryableApplicationError("this test's site stages no image",
		sitewf.ErrTypeUnsupported, nil)
}

func (s *httpSite) SetBootDevice(context.Context, sitewf.BootDeviceRequest) (sitewf.BootDeviceResult, error) {
	return sitewf.BootDeviceResult{}, temporal.NewNonRetryableApplicationError("this test's site sets no boot device",
		sitewf.ErrTypeUnsupported, nil)
}

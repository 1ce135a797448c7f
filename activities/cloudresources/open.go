package cloudresources

import (
	"context"
	"fmt"

	drivers "github.com/better-compute/better-compute/drivers/cloudresources"
	"github.com/better-compute/better-compute/drivers/cloudresources/digitalocean"
	"github.com/better-compute/better-compute/drivers/providers"
	doprovider "github.com/better-compute/better-compute/drivers/providers/digitalocean"
)

// KindsOf are the kinds a provider serves (nil: it serves none).
func KindsOf(provider string) *drivers.KindSet {
	switch provider {
	case "digitalocean":
		return digitalocean.Kinds()
	}
	return nil
}

// Open opens the cloud resources of the account of credential c through
// factory, whose limiter every call shares (one per credential).
func Open(ctx context.Context, factory providers.Factory, c providers.Credential) (drivers.ProviderResources, error) {
	switch c.Kind {
	case "digitalocean":
		f, ok := factory.(*doprovider.Factory)
		if !ok {
			return nil, fmt.Errorf("cloud resources: the provider factory %T cannot open DigitalOcean's resources", factory)
		}
		return digitalocean.Open(ctx, f, c)
	}
	return nil, fmt.Errorf("cloud resources: provider %q serves none", c.Kind)
}

package controlplane

import (
	"log/slog"

	"github.com/better-compute/better-compute/drivers/providers"
	"github.com/better-compute/better-compute/drivers/providers/digitalocean"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/ratelimits"
)

// ProviderFactory opens capacity providers for accounts' credentials, every
// call of every process that uses one token waiting on that token's buckets
// in PostgreSQL (DigitalOcean's 250 a minute and 5,000 an hour): the API's
// providerAccounts.offers and the workers' instance activities share them.
func ProviderFactory(st *store.Store, log *slog.Logger) (providers.Factory, error) {
	var windows []ratelimits.Window
	for _, w := range providers.DigitalOceanWindows() {
		windows = append(windows, ratelimits.Window(w))
	}
	limiter, err := ratelimits.New(st.Pool, log, windows...)
	if err != nil {
		return nil, err
	}
	return digitalocean.NewFactory(limiter, nil), nil
}

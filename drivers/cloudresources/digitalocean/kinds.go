// Package digitalocean holds DigitalOcean's cloud-resource kinds: one
// embedded JSON manifest per kind under kinds/, named by DigitalOcean's
// API fields and limits (godo's request types), and Resources, the
// ProviderResources implementation over godo (with the optional Catalog
// and Signals).
package digitalocean

import (
	"embed"
	"fmt"
	"io/fs"

	"github.com/better-compute/better-compute/drivers/cloudresources"
)

//go:embed kinds/*.json
var kindFiles embed.FS

// kinds is loaded and checked once, when the package is initialised: a
// defective manifest stops the process at startup, never at a call.
var kinds = func() *cloudresources.KindSet {
	dir, err := fs.Sub(kindFiles, "kinds")
	if err != nil {
		panic(fmt.Sprintf("digitalocean: the kind manifests: %v", err))
	}
	set, err := cloudresources.LoadKinds(dir)
	if err != nil {
		panic(fmt.Sprintf("digitalocean: the kind manifests: %v", err))
	}
	return set
}()

// Kinds are DigitalOcean's cloud-resource kinds.
func Kinds() *cloudresources.KindSet { return kinds }

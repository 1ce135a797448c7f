// Package buildinfo says which build is running. Version and Commit are set
// by the linker (-X) in `make build`; a plain `go build` reports "dev".
package buildinfo

import "runtime"

var (
	Version = "dev"
	Commit  = "unknown"
)

// Info is what `version` commands and system.version report.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
}

// Get returns this binary's build information.
func Get() Info {
	return Info{Version: Version, Commit: Commit, GoVersion: runtime.Version()}
}

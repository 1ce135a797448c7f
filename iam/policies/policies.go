// Package policies holds the example Cedar policies shipped with Better
// Compute, embedded in the binary. They are written against the embedded
// IAM's entity model (see iam/cedar.go) with the default type prefix
// "compute-"; WithTypePrefix rewrites them for another prefix. Install one
// in a tenant with iam.Admin.PutPolicy.
//
//   - pool-users-reserve-h100: pool users may reserve at most 8 H100 for at
//     most 72 hours
//   - bounded-extend: reservations may be extended only while the resulting
//     duration stays within 72 hours
//   - data-cloud-resources: cloud resources of the data family only
//   - read-only-auditor: identities in group "auditors" may read, nothing else
package policies

import (
	"embed"
	"io/fs"
	"path"
	"sort"
	"strings"
)

//go:embed *.cedar
var files embed.FS

// Example is one shipped policy document.
type Example struct {
	Name  string // the file name without .cedar, a valid policy name
	Cedar string
}

// Names of the shipped examples.
const (
	PoolUsersReserveH100 = "pool-users-reserve-h100"
	BoundedExtend        = "bounded-extend"
	DataCloudResources   = "data-cloud-resources"
	ReadOnlyAuditor      = "read-only-auditor"
)

// All returns every shipped example, sorted by name.
func All() []Example {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil // cannot happen: the files are embedded
	}
	out := make([]Example, 0, len(entries))
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".cedar")
		if !ok {
			continue
		}
		text, err := files.ReadFile(e.Name())
		if err != nil {
			continue
		}
		out = append(out, Example{Name: name, Cedar: string(text)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Get returns one example by name.
func Get(name string) (string, bool) {
	if path.Base(name) != name {
		return "", false
	}
	text, err := files.ReadFile(name + ".cedar")
	if err != nil {
		return "", false
	}
	return string(text), true
}

// WithTypePrefix rewrites the resource types of a policy written for the
// default prefix ("compute-…" string literals) for another prefix. Actions
// (compute:…) are not types and keep their names.
func WithTypePrefix(cedar, prefix string) string {
	if prefix == "" || prefix == "compute-" {
		return cedar
	}
	return strings.ReplaceAll(cedar, `"compute-`, `"`+prefix)
}

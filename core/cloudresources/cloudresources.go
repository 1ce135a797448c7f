// Package cloudresources holds the cloud-resources module's rules that
// need no database: the defaults of its configuration.
package cloudresources

// DefaultMaxPerKind is how many resources of one kind a tenant may hold
// when the module names no quota of its own (cloud-resources-api.md,
// create: "the module's maxPerKind, default 20").
const DefaultMaxPerKind = 20

// Quotas is the module's per-tenant cap of each kind: MaxPerKind for
// every kind (DefaultMaxPerKind when zero), PerKind overriding it.
type Quotas struct {
	MaxPerKind int
	PerKind    map[string]int
}

// Of is the cap of kind.
func (q Quotas) Of(kind string) int {
	if n, ok := q.PerKind[kind]; ok {
		return n
	}
	if q.MaxPerKind > 0 {
		return q.MaxPerKind
	}
	return DefaultMaxPerKind
}

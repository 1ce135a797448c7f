package core

import (
	"maps"
	"slices"
)

// CoreFragment returns a copy of the core catalog as a fragment.
func CoreFragment() Fragment {
	out := Fragment{ResourceTypes: make(map[string]TypeFragment, len(coreFragment.ResourceTypes))}
	for name, t := range coreFragment.ResourceTypes {
		t.Relations = slices.Clone(t.Relations)
		t.Attributes = maps.Clone(t.Attributes)
		t.Actions = slices.Clone(t.Actions)
		out.ResourceTypes[name] = t
	}
	return out
}

package iam

import (
	"context"
	"maps"
	"slices"

	"github.com/better-compute/better-compute/core"
)

// CallAdmin runs one admin method by name with a JSON input, exactly as
// POST /api/iam/<method> does after its authentication; `better-compute iam`
// uses it with the operator's own database access.
func CallAdmin(ctx context.Context, a *Admin, method string, input []byte) (any, error) {
	m, ok := adminMethods()[method]
	if !ok {
		return nil, core.Errorf(core.CodeNotFound, "no IAM admin method %q", method)
	}
	return m(ctx, a, input)
}

// AdminMethods lists the admin methods' names, sorted.
func AdminMethods() []string {
	return slices.Sorted(maps.Keys(adminMethods()))
}

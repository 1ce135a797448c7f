package api

import (
	"context"

	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// ServeTestAdmission lets a test serve an admission method with its own
// draft: the envelope's admission steps are what is under test.
func ServeTestAdmission(s *Server, name string,
	prepare func(ctx context.Context, c *Call, tx store.Tx, draftID string) (iam.Resource, error),
	complete func(ctx context.Context, c *Call, tx store.Tx) (any, error)) {
	s.handlers[name] = handler{admission: &admission{prepare: prepare, complete: complete}}
}

// TestItem is one item a test list handler read.
type TestItem struct {
	Resource iam.Resource
	Value    any
}

// ServeTestList lets a test serve a "+ items" list with its own rows.
func ServeTestList(s *Server, name string, read func(ctx context.Context, c *Call, tx store.Tx) ([]TestItem, error)) {
	s.handlers[name] = handler{list: func(ctx context.Context, c *Call, tx store.Tx) (page, error) {
		items, err := read(ctx, c, tx)
		p := page{answer: func(kept []any) any { return kept }}
		for _, it := range items {
			p.items = append(p.items, item{resource: it.Resource, value: it.Value})
		}
		return p, err
	}}
}

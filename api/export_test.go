package api

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/store"
)

// ServeTestAdmission lets a test serve an admission method with its own
// draft: the envelope's admission steps are what is under test.
func ServeTestAdmission(s *Server, name string,
	prepare func(ctx context.Context, c *Call, tx store.Tx, draftID string) (iam.Resource, error),
	complete func(ctx context.Context, c *Call, tx store.Tx) (any, error)) {
	s.handlers[name] = &rpc.Handler{Admission: &rpc.ErasedAdmission{Prepare: prepare, Complete: complete}}
}

// TestItem is one item a test list handler read.
type TestItem = rpc.Item

// ServeTestList lets a test serve a "+ items" list with its own rows.
func ServeTestList(s *Server, name string, read func(ctx context.Context, c *Call, tx store.Tx) ([]TestItem, error)) {
	s.handlers[name] = &rpc.Handler{List: func(ctx context.Context, c *Call, tx store.Tx) (rpc.Page, error) {
		items, err := read(ctx, c, tx)
		return rpc.Page{Items: items, Answer: func(kept []any) any { return kept }}, err
	}}
}

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

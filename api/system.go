package api

import (
	"context"
	"encoding/json"

	"github.com/better-compute/better-compute/internal/buildinfo"
)

// registerMethods is the table of methods this server serves.
func (s *Server) registerMethods() map[string]method {
	return map[string]method{
		"system.version": {public: true, handle: s.systemVersion},
		"system.whoami":  {public: true, handle: s.systemWhoami},
	}
}

// VersionOutput is system.version's answer.
type VersionOutput struct {
	buildinfo.Info
	API string `json:"api"`
}

// APIVersion is the version of the call contract this server speaks.
const APIVersion = "v0.1"

func (s *Server) systemVersion(_ context.Context, _ *call, input json.RawMessage) (any, error) {
	if err := decodeStrict(input, &struct{}{}); err != nil {
		return nil, err
	}
	return VersionOutput{Info: buildinfo.Get(), API: APIVersion}, nil
}

// WhoamiOutput is system.whoami's answer: who the credential belongs to, or
// authenticated false when none was presented.
type WhoamiOutput struct {
	Authenticated bool `json:"authenticated"`
	*Principal
}

func (s *Server) systemWhoami(ctx context.Context, c *call, input json.RawMessage) (any, error) {
	if err := decodeStrict(input, &struct{}{}); err != nil {
		return nil, err
	}
	if !c.cred.Present() {
		return WhoamiOutput{}, nil
	}
	p, err := s.authenticate(ctx, c.cred)
	if err != nil {
		return nil, err
	}
	return WhoamiOutput{Authenticated: true, Principal: p}, nil
}

package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/better-compute/better-compute/core"
)

// iamCookie is the session cookie a browser presents instead of a bearer.
const iamCookie = "bc_session"

// Credential is what a caller presented. SourceIP is the verified socket
// peer, set by the server, never by the caller.
type Credential struct {
	Authorization string
	Cookie        string
	SourceIP      string
	RequestID     string
}

// Present reports whether the caller presented any credential at all.
func (c Credential) Present() bool {
	return strings.TrimSpace(c.Authorization) != "" || c.Cookie != ""
}

// Principal is an authenticated caller.
type Principal struct {
	TenantID    string `json:"tenantId"`
	IdentityID  string `json:"identityId"`
	Kind        string `json:"kind"`
	SessionID   string `json:"sessionId"`
	SessionKind string `json:"sessionKind"`
}

// Authenticator identifies the caller behind a credential (the IAM port).
type Authenticator interface {
	Authenticate(ctx context.Context, cred Credential) (*Principal, error)
}

// method is one registered API method.
type method struct {
	// public methods run without a credential (system.version, system.whoami).
	public bool
	// input is the method's input type; the body is decoded into a new one
	// strictly (unknown fields are INVALID_INPUT) before anything else runs.
	handle func(ctx context.Context, call *call, input json.RawMessage) (any, error)
}

// call is one method call in flight.
type call struct {
	cred      Credential
	principal *Principal // nil for an unauthenticated public call
}

// Call runs method name ("group.method") with a JSON input, as HTTP does,
// in-process.
func (s *Server) Call(ctx context.Context, cred Credential, name string, input json.RawMessage) (out any, err error) {
	defer func() { s.metrics.calls.WithLabelValues(s.metricName(name), resultCode(err)).Inc() }()
	m, ok := s.methods[name]
	if !ok {
		return nil, core.Errorf(core.CodeNotFound, "no method %q", name)
	}
	if len(bytes.TrimSpace(input)) == 0 {
		input = json.RawMessage("{}")
	}
	c := &call{cred: cred}
	if !m.public {
		if !cred.Present() {
			return nil, core.Errorf(core.CodeUnauthn, "a credential is required")
		}
		if c.principal, err = s.authenticate(ctx, cred); err != nil {
			return nil, err
		}
	}
	return m.handle(ctx, c, input)
}

func (s *Server) authenticate(ctx context.Context, cred Credential) (*Principal, error) {
	if s.deps.Authenticator == nil {
		return nil, core.Errorf(core.CodeUnauthn, "the credential is not valid")
	}
	return s.deps.Authenticator.Authenticate(ctx, cred)
}

// metricName keeps the metric's label set bounded: unknown names share one.
func (s *Server) metricName(name string) string {
	if _, ok := s.methods[name]; ok {
		return name
	}
	return "unknown"
}

func resultCode(err error) string {
	if err == nil {
		return "OK"
	}
	return string(core.AsError(err).Code)
}

// decodeStrict decodes a JSON object into v, refusing unknown fields and
// trailing data, with INVALID_INPUT naming what is wrong.
func decodeStrict(input json.RawMessage, v any) error {
	if trimmed := bytes.TrimSpace(input); len(trimmed) == 0 || trimmed[0] != '{' {
		return core.Errorf(core.CodeInvalidInput, "input must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			field := strings.Trim(f, `"`)
			return core.Errorf(core.CodeInvalidInput, "unknown field %q", field).WithDetails(map[string]any{"field": field})
		}
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return core.Errorf(core.CodeInvalidInput, "field %q must be %s", typeErr.Field, typeErr.Type.String()).
				WithDetails(map[string]any{"field": typeErr.Field})
		}
		return core.Errorf(core.CodeInvalidInput, "input must be a JSON object")
	}
	if dec.More() {
		return core.Errorf(core.CodeInvalidInput, "input must be one JSON object")
	}
	return nil
}

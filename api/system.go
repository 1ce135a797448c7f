package api

import (
	"context"

	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/iam"
	"github.com/better-compute/better-compute/internal/buildinfo"
)

// APIVersion is the version of the call contract this server speaks.
const APIVersion = "v0.1"

// The system methods callers name.
const (
	SystemVersion rpc.Ref[rpc.NoInput, VersionOutput] = "system.version"
	SystemWhoami  rpc.Ref[rpc.NoInput, WhoamiOutput]  = "system.whoami"
)

// systemMethods are the API's own methods: who is calling, what runs, and
// whether it is healthy.
func (s *Server) systemMethods() []rpc.Descriptor {
	return []rpc.Descriptor{
		&rpc.Method[rpc.NoInput, VersionOutput]{Name: SystemVersion, Action: "none (public)", DecidedOn: "nothing",
			Phase: "v0.1", Kind: core.KindRead, Direct: s.systemVersion},
		&rpc.Method[rpc.NoInput, WhoamiOutput]{Name: SystemWhoami, Action: "none (public)", DecidedOn: "nothing",
			Phase: "v0.1", Kind: core.KindRead, Direct: s.systemWhoami},
		&rpc.Method[rpc.TenantInput, SelfCheckOutput]{Name: "system.selfCheck", Action: "compute:fleet:admin",
			DecidedOn: "compute-fleet", Phase: "v0.1", Kind: core.KindRead, Direct: s.systemSelfCheck},
	}
}

// VersionOutput is system.version's answer.
type VersionOutput struct {
	buildinfo.Info
	API     string       `json:"api"`
	Methods MethodCounts `json:"methods"`
}

// MethodCounts are how many methods of the method table this server
// serves, and how many are planned (answered UNSUPPORTED).
type MethodCounts struct {
	Served  int `json:"served"`
	Planned int `json:"planned"`
}

func (s *Server) systemVersion(context.Context, *Call, rpc.NoInput) (VersionOutput, error) {
	counts := MethodCounts{Served: len(s.handlers)}
	if s.registry != nil {
		counts.Planned = s.registry.Len() - counts.Served
	}
	return VersionOutput{Info: buildinfo.Get(), API: APIVersion, Methods: counts}, nil
}

// WhoamiOutput is system.whoami's answer: who the credential belongs to, or
// authenticated false when none was presented.
type WhoamiOutput struct {
	Authenticated bool `json:"authenticated"`
	*iam.Caller
}

func (s *Server) systemWhoami(ctx context.Context, c *Call, _ rpc.NoInput) (WhoamiOutput, error) {
	if !c.Cred.Present() {
		return WhoamiOutput{}, nil
	}
	caller, err := s.authenticate(ctx, c.Cred)
	if err != nil {
		return WhoamiOutput{}, err
	}
	return WhoamiOutput{Authenticated: true, Caller: caller}, nil
}

// SelfCheckOutput is system.selfCheck's answer.
type SelfCheckOutput struct {
	Health
	Projection ProjectionCheck `json:"projection"`
}

// ProjectionCheck is the authorization projection's state.
type ProjectionCheck struct {
	Loaded bool    `json:"loaded"`
	LagMs  float64 `json:"lagMs"`
}

// systemSelfCheck runs the health checks (database, Temporal round trip),
// and reports IAM (it just decided this call) and the projection's lag.
func (s *Server) systemSelfCheck(ctx context.Context, _ *Call, _ rpc.TenantInput) (SelfCheckOutput, error) {
	out := SelfCheckOutput{Health: s.CheckHealth(ctx)}
	out.Checks["iam"] = Check{OK: true}
	if p := s.deps.Projection; p != nil {
		out.Projection = ProjectionCheck{Loaded: p.Loaded(), LagMs: float64(p.Lag().Microseconds()) / 1000}
		if !p.Loaded() {
			out.Status = "degraded"
		}
	}
	return out, nil
}

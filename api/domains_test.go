package api_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// eventTypes is the dummy group's answer.
type eventTypes struct {
	Types []string `json:"types"`
}

// dummyEventTypes is a method of a dummy group, written the way a new
// domain is: a typed reference, the input's type and a descriptor in the
// domain's own package (this file stands in for it).
const dummyEventTypes rpc.Ref[rpc.TenantInput, eventTypes] = "webhooks.eventTypes"

func dummyDomain(rpc.Deps) []rpc.Descriptor {
	return []rpc.Descriptor{&rpc.Method[rpc.TenantInput, eventTypes]{Name: dummyEventTypes,
		Action: "compute:webhooks:manage", DecidedOn: "compute-tenant", Phase: "served, no §9.2 row", Kind: core.KindRead,
		Run: func(context.Context, *rpc.Call, store.Tx, rpc.TenantInput) (eventTypes, error) {
			return eventTypes{Types: []string{"reservation.state_changed"}}, nil
		}}}
}

// Adding a method group is adding its domain to the list of domains: the
// same planned method is served once the dummy domain is listed, through
// the whole envelope (schema, authentication, decision), with nothing else
// changed.
func TestAddingAMethodGroupIsOneLine(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	admin := e.client(e.boot.AdminToken)
	in := rpc.TenantInput{TenantID: api.DefaultRootTenant}
	if _, err := dummyEventTypes.Call(ctx, admin, in); codeOf(err) != core.CodeUnsupported {
		t.Fatalf("before: err = %v, want UNSUPPORTED (planned)", err)
	}

	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Domains: append(slices.Clone(api.Domains), dummyDomain)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	c := api.NewClient(hs.URL, e.boot.AdminToken)
	out, err := dummyEventTypes.Call(ctx, c, in)
	if err != nil || !slices.Equal(out.Types, []string{"reservation.state_changed"}) {
		t.Fatalf("after: %+v, %v", out, err)
	}
	if _, err := dummyEventTypes.Call(ctx, api.NewClient(hs.URL, e.stranger), rpc.TenantInput{TenantID: "acme"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("a caller with no policy: err = %v, want ACCESS_DENIED", err)
	}
	if _, err := dummyEventTypes.Call(ctx, c, rpc.TenantInput{TenantID: "bad/tenant"}); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("bad input: err = %v, want INVALID_INPUT", err)
	}
}

package api_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/store"
)

// dummyAnswer is the dummy group's answer.
type dummyAnswer struct {
	Types []string `json:"types"`
}

// dummyBatches is a method of a dummy group, written the way a new
// domain is: a typed reference, the input's type and a descriptor in the
// domain's own package (this file stands in for it).
const dummyBatches rpc.Ref[rpc.TenantInput, dummyAnswer] = "commandBatches.list"

func dummyDomain(rpc.Deps) []rpc.Descriptor {
	return []rpc.Descriptor{&rpc.Method[rpc.TenantInput, dummyAnswer]{Name: dummyBatches,
		Action: "compute:batches:read", DecidedOn: "compute-tenant", Phase: "v1.0", Kind: core.KindRead,
		Run: func(context.Context, *rpc.Call, store.Tx, rpc.TenantInput) (dummyAnswer, error) {
			return dummyAnswer{Types: []string{"batch_1"}}, nil
		}}}
}

// withoutBatches are the API's domains less commandBatches.*: every method
// of the table is served, so the tests of planned methods plan that group
// again.
func withoutBatches() []rpc.Domain {
	var out []rpc.Domain
	for _, d := range api.Domains {
		if ds := d(rpc.Deps{}); len(ds) > 0 && strings.HasPrefix(ds[0].Info().Name, "commandBatches.") {
			continue
		}
		out = append(out, d)
	}
	return out
}

// serveDomains serves e's store and IAM with only domains, and answers its URL.
func (e *env) serveDomains(domains []rpc.Domain) string {
	e.t.Helper()
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Domains: domains})
	if err != nil {
		e.t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	e.t.Cleanup(hs.Close)
	return hs.URL
}

// Adding a method group is adding its domain to the list of domains: the
// same planned method is served once the dummy domain is listed, through
// the whole envelope (schema, authentication, decision), with nothing else
// changed.
func TestAddingAMethodGroupIsOneLine(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	in := rpc.TenantInput{TenantID: api.DefaultRootTenant}
	before := api.NewClient(e.serveDomains(withoutBatches()), e.boot.AdminToken)
	if _, err := dummyBatches.Call(ctx, before, in); codeOf(err) != core.CodeUnsupported {
		t.Fatalf("before: err = %v, want UNSUPPORTED (planned)", err)
	}
	url := e.serveDomains(append(withoutBatches(), dummyDomain))
	c := api.NewClient(url, e.boot.AdminToken)
	out, err := dummyBatches.Call(ctx, c, in)
	if err != nil || !slices.Equal(out.Types, []string{"batch_1"}) {
		t.Fatalf("after: %+v, %v", out, err)
	}
	if _, err := dummyBatches.Call(ctx, api.NewClient(url, e.stranger), rpc.TenantInput{TenantID: "acme"}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("a caller with no policy: err = %v, want ACCESS_DENIED", err)
	}
	if _, err := dummyBatches.Call(ctx, c, rpc.TenantInput{TenantID: "bad/tenant"}); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("bad input: err = %v, want INVALID_INPUT", err)
	}
}

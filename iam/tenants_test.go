package iam

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/core"
)

// The cache tests' ports know every tenant: the lookup is the embedded
// port's and the remote's (tested there), not the cache's.
func (f *cacheCountingPort) TenantKnown(context.Context, *Caller, string) (bool, error) {
	return true, nil
}

// The embedded port and the remote one (through the host) answer alike;
// the host answers only a caller with root authority; a known tenant is
// cached, an unknown one asked again.
func TestTenantKnown(t *testing.T) {
	env := newRemoteEnv(t, HostConfig{})
	alice, _ := env.acme()
	op := env.identity(DefaultRootTenantID, KindPerson, "op", true)
	rootTok := env.token(op, SessionUser, true)
	root, err := env.remote.Authenticate(env.ctx, bearer(rootTok))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tenant string
		known  bool
	}{{"acme", true}, {DefaultRootTenantID, true}, {"ghost-tenant", false}, {"ACME", false}} {
		for name, p := range map[string]Port{"embedded": env.iam, "remote": env.remote} {
			known, err := p.TenantKnown(env.ctx, root, c.tenant)
			if err != nil || known != c.known {
				t.Errorf("%s: TenantKnown(%q) = %v, %v; want %v", name, c.tenant, known, err, c.known)
			}
		}
	}
	plain, err := env.remote.Authenticate(env.ctx, bearer(alice))
	if err != nil {
		t.Fatal(err)
	}
	_, err = env.remote.TenantKnown(env.ctx, plain, "globex")
	if e := core.AsError(err); e.Code != core.CodeAccessDenied {
		t.Fatalf("a caller without root authority asking the host = %v, want ACCESS_DENIED", err)
	}
}

func TestKnownTenantsAreCached(t *testing.T) {
	k := newKnownTenants()
	asked := map[string]int{}
	for range 3 {
		for tenant, known := range map[string]bool{"acme": true, "ghost": false} {
			got, err := k.lookup(tenant, func() (bool, error) { asked[tenant]++; return known, nil })
			if err != nil || got != known {
				t.Fatalf("lookup(%s) = %v, %v", tenant, got, err)
			}
		}
	}
	if asked["acme"] != 1 || asked["ghost"] != 3 {
		t.Fatalf("asked %v; want a known tenant once, an unknown one every time", asked)
	}
}

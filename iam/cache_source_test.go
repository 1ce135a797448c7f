package iam

import "testing"

// A read allowed from one address is not reused for the same session from
// another: a policy that forbids reads from 127.0.0.2 denies the second
// read even though the first, from 127.0.0.1, was allowed and cached.
func TestCacheDecisionsAreKeyedBySourceAddress(t *testing.T) {
	env := newEmbTestEnv(t)
	env.tenant("acme")
	env.resolver.put(embPool("acme", "pool_1", nil))
	env.policy("acme", "not-from-two", `permit (principal, action, resource);
forbid (principal, action, resource)
  when { context has sourceIp && context.sourceIp.isInRange(ip("127.0.0.2/32")) };`)
	idn := env.identity("acme", KindPerson, "alice", false)
	tok := env.token(idn, SessionUser, false)
	port := NewCachingPort(env.iam, CacheOptions{Now: env.clock.Now})
	readFrom := func(ip string) Decision {
		t.Helper()
		c, err := port.Authenticate(env.ctx, Credential{Authorization: "Bearer " + tok.Token, SourceIP: ip})
		if err != nil {
			t.Fatal(err)
		}
		d, err := port.Authorize(env.ctx, Request{Caller: c, TenantID: "acme", Action: "compute:pools:read",
			Resource: Resource{Type: "compute-pool", ID: "pool_1"}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := readFrom("127.0.0.1"); !d.Allowed {
		t.Fatalf("read from 127.0.0.1 = %+v, want allowed", d)
	}
	if d := readFrom("127.0.0.2"); d.Allowed {
		t.Fatalf("read from 127.0.0.2 after an allow from 127.0.0.1 = %+v, want denied", d)
	}
	if d := readFrom("127.0.0.1"); !d.Allowed {
		t.Fatalf("read from 127.0.0.1 again = %+v, want allowed", d)
	}
}

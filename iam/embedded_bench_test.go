package iam

import (
	"fmt"
	"testing"

	"github.com/better-compute/better-compute/iam/policies"
)

// embBenchEnv: acme with the example policies, alice a user of pool_1, and
// draft reservations in pool_1 for the map resolver.
func embBenchEnv(b *testing.B) (*embTestEnv, *Caller) {
	b.Helper()
	env := newEmbTestEnv(b)
	env.tenant("acme")
	for _, ex := range policies.All() {
		env.policy("acme", ex.Name, ex.Cedar)
	}
	alice, c := env.person("acme", "alice")
	env.relate(alice, "user", "compute-pool", "pool_1")
	for i := range MaxBatch {
		env.resolver.put(embReservation(fmt.Sprintf("rsv_%02d", i), alice.ID,
			map[string]any{"gpuModel": "H100", "gpuCount": float64(8), "durationHours": float64(72), "region": "eu"}))
	}
	env.resolver.put(embReservation("rsv_big", alice.ID,
		map[string]any{"gpuModel": "H100", "gpuCount": float64(9), "durationHours": float64(72)}))
	return env, c
}

// BenchmarkUncachedDecision is one Authorize with a warm policy cache and no
// decision cache: the map resolver, the one decision query against the real
// database (relations, groups, liveness, policy version) and Cedar.
func BenchmarkUncachedDecision(b *testing.B) {
	env, c := embBenchEnv(b)
	run := func(b *testing.B, id string, allow bool) {
		req := Request{Caller: c, TenantID: "acme", Action: "compute:reservations:create",
			Resource: Resource{Type: "compute-reservation", ID: id}}
		if d := env.authorize(req); d.Allowed != allow { // warms the policy cache
			b.Fatalf("%+v", d)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			d, err := env.iam.Authorize(env.ctx, req)
			if err != nil || d.Allowed != allow {
				b.Fatalf("%+v, %v", d, err)
			}
		}
	}
	b.Run("allow", func(b *testing.B) { run(b, "rsv_00", true) })
	// A denial also appends to the tenant's audit chain (one write transaction).
	b.Run("deny-audited", func(b *testing.B) { run(b, "rsv_big", false) })
}

// BenchmarkAuthorizeMany50 is one full batch: one decision query for all 50.
func BenchmarkAuthorizeMany50(b *testing.B) {
	env, c := embBenchEnv(b)
	reqs := make([]Request, MaxBatch)
	for i := range reqs {
		reqs[i] = Request{Caller: c, TenantID: "acme", Action: "compute:reservations:create",
			Resource: Resource{Type: "compute-reservation", ID: fmt.Sprintf("rsv_%02d", i)}}
	}
	if _, err := env.iam.AuthorizeMany(env.ctx, reqs); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		ds, err := env.iam.AuthorizeMany(env.ctx, reqs)
		if err != nil || len(ds) != MaxBatch || !ds[MaxBatch-1].Allowed {
			b.Fatalf("%v, %v", ds, err)
		}
	}
}

package api_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api/pools"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/core"
)

// offeredH100Pool makes acme's H100 pool with n schedulable 8-GPU nodes and
// offers it to globex with a quota of quota GPUs.
func offeredH100Pool(t testing.TB, e *env, n int, quota int64) pools.Pool {
	t.Helper()
	s := e.site(e.boot.UserToken, "acme", "fra-1", "custom")
	p := e.poolWith("acme", s.ID, "h100", "H100", "", `{}`)
	for i := range n {
		if node := e.node(schedulableNode(p.ID, fmt.Sprintf("gpu-a%02d", i+1)), fixture(t, "h100-8x-sxm.json")); !node.Schedulable {
			t.Fatalf("node not schedulable: %+v", node)
		}
	}
	if _, err := pools.Offer.Call(context.Background(), e.client(e.boot.UserToken), pools.OfferInput{TenantID: "acme", PoolID: p.ID,
		ToTenantID: "globex", Quota: map[string]int64{"gpu": quota}}); err != nil {
		t.Fatal(err)
	}
	return p
}

// createAtOnce sends n creates of one GPU each for globex over one window,
// all at once, and answers their errors (nil for a placed one).
func createAtOnce(t *testing.T, e *env, poolID, prefix string, n int) []error {
	t.Helper()
	errs := make([]error, n)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			r, err := reservations.Create.Call(context.Background(), e.client(e.globex),
				reserveInput("globex", poolID, fmt.Sprintf("%s-%d", prefix, i), 1, reservationsT0, 3600))
			if err == nil && r.State != "placed" {
				err = fmt.Errorf("reservation %s is %s", r.ID, r.State)
			}
			errs[i] = err
		}()
	}
	close(gate)
	wg.Wait()
	return errs
}

// One tenant's concurrent creates on an offered pool with room for all of
// them place concurrently yet never past the quota: exactly the quota's
// worth is placed, every other call is QUOTA_EXCEEDED counting exactly
// that much in use, and the tenant's bookings are the quota.
func TestReservationsConcurrentCreatesKeepTheQuota(t *testing.T) {
	e := newEnv(t)
	const quota, calls = 5, 32
	p := offeredH100Pool(t, e, 2, quota)
	placed := 0
	for i, err := range createAtOnce(t, e, p.ID, "quota", calls) {
		if err == nil {
			placed++
			continue
		}
		ce := core.AsError(err)
		if ce.Code != core.CodeQuotaExceeded || fmt.Sprint(ce.Details["limit"]) != fmt.Sprint(quota) ||
			fmt.Sprint(ce.Details["inUse"]) != fmt.Sprint(quota) || fmt.Sprint(ce.Details["requested"]) != "1" {
			t.Fatalf("call %d = %v %+v, want QUOTA_EXCEEDED with %d of %d in use", i, err, ce.Details, quota, quota)
		}
	}
	if placed != quota {
		t.Fatalf("placed %d, want the quota of %d", placed, quota)
	}
	if got := e.count(`SELECT count(*) FROM device_bookings WHERE tenant_id = 'globex'`); got != quota {
		t.Fatalf("globex bookings = %d, want %d", got, quota)
	}
}

// Concurrent creates on a pool with room for all of them all place: none
// is answered UNAVAILABLE (contention) for racing the others for the same
// atoms, and each atom is booked once.
func TestReservationsConcurrentCreatesWithRoomAllPlace(t *testing.T) {
	e := newEnv(t)
	const calls = 24
	p := offeredH100Pool(t, e, 4, 32)
	for i, err := range createAtOnce(t, e, p.ID, "room", calls) {
		if err != nil {
			t.Fatalf("call %d = %v %+v", i, err, core.AsError(err).Details)
		}
	}
	if got := e.count(`SELECT count(DISTINCT (device_node_id, device_id)) FROM device_bookings WHERE tenant_id = 'globex'`); got != calls {
		t.Fatalf("%d atoms booked, want %d", got, calls)
	}
}

// BenchmarkConcurrentCreates: one tenant's creates of one GPU on an offered
// pool of 8 nodes, 16 at a time (admission and booking, no workflow
// engine), each window taking 64 of them so that placement works on
// partly booked nodes and the pool never runs out.
func BenchmarkConcurrentCreates(b *testing.B) {
	e := newEnv(b)
	p := offeredH100Pool(b, e, 8, 1<<20)
	g := e.client(e.globex)
	var seq, failed atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := seq.Add(1) - 1
			start := reservationsT0.Add(time.Duration(i/64) * time.Hour)
			if _, err := reservations.Create.Call(context.Background(), g,
				reserveInput("globex", p.ID, fmt.Sprintf("bench-%d", i), 1, start, 3600)); err != nil {
				failed.Add(1)
				b.Log(err)
			}
		}
	})
	b.ReportMetric(float64(failed.Load()), "failed")
}

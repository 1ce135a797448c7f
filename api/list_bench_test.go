package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/api/rpc"
	"github.com/better-compute/better-compute/store"
)

// BenchmarkReservationsList500 is the bench tool's list scenario in one
// process, over real HTTP: reservations.list with scope all answering 500
// reservations, each decided on. Cold drops the decision cache before
// every call (ten AuthorizeMany batches reach the embedded IAM); Warm
// reuses the cached allows; Raw is Warm without decoding the answer;
// Parallel is Warm from 16 clients at once.
func BenchmarkReservationsList500(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	// Keep a connection per client, as the bench tool does, so the runs
	// measure the list rather than TCP handshakes.
	c.HTTP = &http.Client{Transport: &http.Transport{MaxIdleConns: 32, MaxIdleConnsPerHost: 32}}
	p, _ := h100Pool(b, e)
	makeReservations(b, e, p.ID, 500)
	if _, err := e.store.Pool.Exec(ctx, "ANALYZE"); err != nil {
		b.Fatal(err)
	}
	in := reservations.ListInput{TenantID: "acme", Scope: "all", ListInput: rpc.ListInput{Limit: store.MaxPageLimit}}
	list := func() error {
		out, err := reservations.List.Call(ctx, c, in)
		if err == nil && len(out.Items) != 500 {
			err = fmt.Errorf("list = %d items, want 500", len(out.Items))
		}
		return err
	}
	b.Run("Cold", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			e.cache.DropDecisions()
			b.StartTimer()
			if err := list(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Warm", func(b *testing.B) {
		for b.Loop() {
			if err := list(); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Raw is Warm with the answer read but not decoded: the server's share.
	raw, err := json.Marshal(in)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Raw", func(b *testing.B) {
		for b.Loop() {
			req, _ := http.NewRequest(http.MethodPost, e.url+"/api/compute/reservations/list", bytes.NewReader(raw))
			req.Header.Set("Authorization", "Bearer "+e.boot.UserToken)
			resp, err := c.HTTP.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || n < 500*100 {
				b.Fatalf("list = %d, %d bytes", resp.StatusCode, n)
			}
		}
	})
	b.Run("Parallel", func(b *testing.B) {
		b.SetParallelism(8) // 8 × GOMAXPROCS (2 here) = 16 clients
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := list(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// makeReservations books n one-GPU hours on the pool's 8-GPU node, eight
// to an hour, from four clients at once, each in hours of its own so they
// do not race for the same atoms.
func makeReservations(b testing.TB, e *env, poolID string, n int) {
	b.Helper()
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	const clients = 4
	for w := range clients {
		wg.Go(func() {
			for i := w * n / clients; i < (w+1)*n/clients; i++ {
				start := reservationsT0.Add(time.Duration(i/8) * time.Hour)
				if _, err := reservations.Create.Call(ctx, c, reserveInput("acme", poolID, fmt.Sprintf("l%d", i), 1, start, 3600)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

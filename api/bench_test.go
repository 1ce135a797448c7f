package api_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/projects"
	"github.com/better-compute/better-compute/api/reservations"
	"github.com/better-compute/better-compute/api/rpc"
)

// The envelope's cost over real HTTP against the real embedded IAM and
// PostgreSQL: a read (authenticate and decision cached, one read-only
// transaction), a mutation (an uncached Require, one transaction with its
// audit row), a public call (no IAM, no database) as the floor, and a list
// of 500 items decided per item.

func BenchmarkPublicCall(b *testing.B) {
	c := newEnv(b).client("")
	ctx := context.Background()
	for b.Loop() {
		if _, err := api.SystemVersion.Call(ctx, c, rpc.NoInput{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadOverHTTP(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	p, err := projects.Create.Call(ctx, c, projects.CreateInput{TenantID: "acme", Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := projects.Get.Call(ctx, c, projects.ProjectInput{TenantID: "acme", ProjectID: p.ID}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReservationGetOverHTTP is the bench tool's get: a placed
// reservation read with its decision cached, one round trip to the database.
func BenchmarkReservationGetOverHTTP(b *testing.B) {
	e, c, r := benchReservation(b)
	in := reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID}
	parallelGets(b, e, c, in)
}

// BenchmarkBareGinOverHTTP is the floor BenchmarkReservationGetOverHTTP is
// compared with: a bare gin handler on the same route that reads the same
// body and answers the same reservation, with no middleware, IAM or
// database, called by the same client.
func BenchmarkBareGinOverHTTP(b *testing.B) {
	e, _, r := benchReservation(b)
	engine := gin.New()
	engine.POST("/api/compute/:group/:method", func(g *gin.Context) {
		if _, err := io.ReadAll(g.Request.Body); err != nil {
			g.AbortWithStatus(http.StatusBadRequest)
			return
		}
		g.JSON(http.StatusOK, r)
	})
	hs := httptest.NewServer(engine)
	b.Cleanup(hs.Close)
	bare := api.NewClient(hs.URL, e.boot.UserToken)
	in := reservations.ReservationInput{TenantID: "acme", ReservationID: r.ID}
	parallelGets(b, e, bare, in)
}

// benchReservation is an environment, its tenant user's client and one
// placed reservation of that user.
func benchReservation(b *testing.B) (*env, *api.Client, reservations.Reservation) {
	e := newEnv(b)
	c := e.client(e.boot.UserToken)
	p, _ := h100Pool(b, e)
	r, err := reservations.Create.Call(context.Background(), c, reserveInput("acme", p.ID, "bench", 1, reservationsT0, 3600))
	if err != nil {
		b.Fatal(err)
	}
	return e, c, r
}

// parallelGets calls reservations.get through c from 4 goroutines per
// core until b is done, measuring CPU per call.
func parallelGets(b *testing.B, e *env, c *api.Client, in reservations.ReservationInput) {
	ctx := context.Background()
	cpu := newCPUMeter(b, e)
	b.ResetTimer()
	cpu.start()
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := reservations.Get.Call(ctx, c, in); err != nil {
				b.Error(err)
				return
			}
		}
	})
	cpu.stop()
}

func BenchmarkMutationOverHTTP(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	i := 0
	for b.Loop() {
		i++
		if _, err := projects.Create.Call(ctx, c, projects.CreateInput{TenantID: "acme", Name: fmt.Sprintf("b%d", i)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkList500 lists 500 projects, each decided: Cold drops the
// decision cache first (10 AuthorizeMany batches reach IAM), Warm reuses it.
func BenchmarkList500(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	for i := range 500 {
		if _, err := projects.Create.Call(ctx, c, projects.CreateInput{TenantID: "acme", Name: fmt.Sprintf("p%03d", i)}); err != nil {
			b.Fatal(err)
		}
	}
	// Autovacuum would have analysed the tables by now in a real deployment;
	// without statistics the planner probes authz_resources 500 times.
	if _, err := e.store.Pool.Exec(ctx, "ANALYZE"); err != nil {
		b.Fatal(err)
	}
	for _, cold := range []bool{true, false} {
		name := map[bool]string{true: "Cold", false: "Warm"}[cold]
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if cold {
					b.StopTimer()
					e.cache.DropDecisions()
					b.StartTimer()
				}
				list, err := projects.List.Call(ctx, c, rpc.TenantListInput{TenantID: "acme"})
				if err != nil || len(list.Items) != 500 {
					b.Fatalf("list = %d items, %v", len(list.Items), err)
				}
			}
		})
	}
}

// BenchmarkAdmission times one admission end to end over HTTP (transaction
// 1, refresh, Require, transaction 2) with the embedded IAM and with the
// remote IAM (an IAM host over HTTP reading a streaming replica, with signed
// refresh), side by side in one run, and reports p50 and p99.
func BenchmarkAdmission(b *testing.B) {
	modes := []struct {
		name string
		env  func(b *testing.B) *env
	}{
		{"embedded", func(b *testing.B) *env { return newEnv(b) }},
		{"remote-refresh", func(b *testing.B) *env { e, _, _ := newRemoteEnv(b, true); return e }},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			e := m.env(b)
			serveCloudResourceDrafts(b, e)
			var lat []time.Duration
			i := 0
			for b.Loop() {
				i++
				start := time.Now()
				if status, body := e.call(e.stranger, "cloudResources.create", createBody(fmt.Sprintf("b%d", i), "postgres")); status != 200 {
					b.Fatalf("admission = %d %s", status, body)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

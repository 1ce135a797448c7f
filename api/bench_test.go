package api_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/better-compute/better-compute/api"
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
		if _, err := c.SystemVersion(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadOverHTTP(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	p, err := c.ProjectsCreate(ctx, api.ProjectsCreateInput{TenantID: "acme", Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := c.ProjectsGet(ctx, "acme", p.ID); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMutationOverHTTP(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	c := e.client(e.boot.UserToken)
	i := 0
	for b.Loop() {
		i++
		if _, err := c.ProjectsCreate(ctx, api.ProjectsCreateInput{TenantID: "acme", Name: fmt.Sprintf("b%d", i)}); err != nil {
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
		if _, err := c.ProjectsCreate(ctx, api.ProjectsCreateInput{TenantID: "acme", Name: fmt.Sprintf("p%03d", i)}); err != nil {
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
				list, err := c.ProjectsList(ctx, "acme")
				if err != nil || len(list.Items) != 500 {
					b.Fatalf("list = %d items, %v", len(list.Items), err)
				}
			}
		})
	}
}

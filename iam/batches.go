package iam

import (
	"context"

	"golang.org/x/sync/errgroup"

	"github.com/better-compute/better-compute/core"
)

// MaxBatchesInFlight bounds how many AuthorizeMany batches one caller sends
// at once. Sent one after another, a 500-item page waits for ten answers in
// a row (ten round trips to a remote IAM); unbounded, one page could take
// every connection to it and every core of the embedded engine.
const MaxBatchesInFlight = 4

// AnyBatch is a Port whose AuthorizeMany takes any number of requests.
type AnyBatch interface {
	TakesAnyBatch() bool
}

// AuthorizeInBatches decides any number of requests through p in batches
// of at most MaxBatch, at most MaxBatchesInFlight of them at once, and
// answers in the order of reqs. The first batch to fail fails the whole
// call with its error (a NOT_FOUND stays a NOT_FOUND) and cancels the
// batches still in flight: a caller never gets a partial answer.
//
// A port that batches itself (AnyBatch: the caching port, which answers its
// held allows under one lock and batches only the rest) gets the whole
// call at once: split here, a warm page would take the cache's lock and a
// goroutine per batch for nothing (measured on 2 cores: 267 lists of 500
// a second split four at a time, 307 whole).
func AuthorizeInBatches(ctx context.Context, p Port, reqs []Request) ([]Decision, error) {
	if b, ok := p.(AnyBatch); ok && b.TakesAnyBatch() {
		ds, err := p.AuthorizeMany(ctx, reqs)
		if err == nil && len(ds) != len(reqs) {
			return nil, core.Errorf(core.CodeInternal, "IAM answered %d decisions for %d requests", len(ds), len(reqs))
		}
		return ds, err
	}
	out := make([]Decision, len(reqs))
	if len(reqs) <= MaxBatch { // one batch: no goroutine to pay for
		if len(reqs) == 0 {
			return out, nil
		}
		if err := authorizeBatch(ctx, p, reqs, out); err != nil {
			return nil, err
		}
		return out, nil
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(MaxBatchesInFlight)
	for lo := 0; lo < len(reqs); lo += MaxBatch {
		hi := min(lo+MaxBatch, len(reqs))
		g.Go(func() error { return authorizeBatch(ctx, p, reqs[lo:hi], out[lo:hi]) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// authorizeBatch decides one batch into out, which has its length. A
// batch whose call has already failed is not sent.
func authorizeBatch(ctx context.Context, p Port, batch []Request, out []Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ds, err := p.AuthorizeMany(ctx, batch)
	if err != nil {
		return err
	}
	if len(ds) != len(batch) {
		return core.Errorf(core.CodeInternal, "IAM answered %d decisions for %d requests", len(ds), len(batch))
	}
	copy(out, ds)
	return nil
}

package iam

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/better-compute/better-compute/core"
)

// batchPort answers AuthorizeMany from its requests' ids and records how
// many calls were in flight at once. With barrier set, the first calls
// wait until barrier of them are in flight together, which only
// concurrent batches ever reach.
type batchPort struct {
	Port // nil: only AuthorizeMany is called
	fail string

	mu       sync.Mutex
	inFlight int
	maxIn    int
	calls    int
	barrier  int
	arrived  int
	release  chan struct{}
}

func (p *batchPort) AuthorizeMany(ctx context.Context, reqs []Request) ([]Decision, error) {
	p.mu.Lock()
	p.calls++
	p.inFlight++
	p.maxIn = max(p.maxIn, p.inFlight)
	wait := p.arrived < p.barrier
	if wait {
		if p.arrived++; p.arrived == p.barrier {
			close(p.release)
		}
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inFlight--
		p.mu.Unlock()
	}()
	if wait {
		<-p.release
	}
	if len(reqs) > MaxBatch {
		return nil, core.Errorf(core.CodeInvalidInput, "batch of %d", len(reqs))
	}
	out := make([]Decision, len(reqs))
	for i, r := range reqs {
		if r.Resource.ID == p.fail {
			return nil, core.Errorf(core.CodeNotFound, "%s not found", r.Resource.ID)
		}
		out[i] = Decision{Allowed: len(r.Resource.ID)%2 == 0, Reason: r.Resource.ID}
	}
	return out, nil
}

func batchReqs(n int) []Request {
	out := make([]Request, n)
	for i := range out {
		out[i] = Request{Action: "compute:pools:read", Resource: Resource{Type: "compute-pool", ID: fmt.Sprintf("pool_%d", i)}}
	}
	return out
}

// A page's batches are in flight together, at most MaxBatchesInFlight at
// once, and their answers come back in the order of the requests.
func TestAuthorizeInBatchesConcurrentInOrder(t *testing.T) {
	p := &batchPort{barrier: MaxBatchesInFlight, release: make(chan struct{})}
	reqs := batchReqs(10*MaxBatch + 7)
	got, err := AuthorizeInBatches(context.Background(), p, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(reqs) {
		t.Fatalf("%d decisions for %d requests", len(got), len(reqs))
	}
	for i, r := range reqs {
		if got[i].Reason != r.Resource.ID || got[i].Allowed != (len(r.Resource.ID)%2 == 0) {
			t.Fatalf("decision %d = %+v, answers %s (order lost)", i, got[i], r.Resource.ID)
		}
	}
	if p.calls != 11 {
		t.Fatalf("%d batches, want 11", p.calls)
	}
	if p.maxIn != MaxBatchesInFlight {
		t.Fatalf("at most %d batches in flight, want %d", p.maxIn, MaxBatchesInFlight)
	}
}

// One failing batch fails the whole call with its own error, and no
// decision of the other batches comes back.
func TestAuthorizeInBatchesOneFailureFailsAll(t *testing.T) {
	for _, n := range []int{3, MaxBatch + 1, 6 * MaxBatch} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			p := &batchPort{fail: fmt.Sprintf("pool_%d", n-1)}
			got, err := AuthorizeInBatches(context.Background(), p, batchReqs(n))
			if !errors.Is(err, core.ErrNotFound) || got != nil {
				t.Fatalf("= %d decisions, %v; want NOT_FOUND and none", len(got), err)
			}
		})
	}
}

func TestAuthorizeInBatchesEmptyAndSingle(t *testing.T) {
	p := &batchPort{}
	if got, err := AuthorizeInBatches(context.Background(), p, nil); err != nil || len(got) != 0 || p.calls != 0 {
		t.Fatalf("empty = %v, %v after %d calls", got, err, p.calls)
	}
	if got, err := AuthorizeInBatches(context.Background(), p, batchReqs(MaxBatch)); err != nil || len(got) != MaxBatch || p.calls != 1 {
		t.Fatalf("one batch = %d, %v after %d calls", len(got), err, p.calls)
	}
}

// wholePort is a batchPort that takes any number of requests in one call.
type wholePort struct{ batchPort }

func (p *wholePort) TakesAnyBatch() bool { return true }

func (p *wholePort) AuthorizeMany(ctx context.Context, reqs []Request) ([]Decision, error) {
	p.mu.Lock()
	p.calls++
	p.mu.Unlock()
	out := make([]Decision, len(reqs))
	for i, r := range reqs {
		out[i] = Decision{Allowed: len(r.Resource.ID)%2 == 0, Reason: r.Resource.ID}
	}
	return out, nil
}

func TestAuthorizeInBatchesSendsAPortThatBatchesItselfOneCall(t *testing.T) {
	p := &wholePort{}
	reqs := batchReqs(5*MaxBatch + 3)
	ds, err := AuthorizeInBatches(context.Background(), p, reqs)
	if err != nil || len(ds) != len(reqs) {
		t.Fatalf("AuthorizeInBatches = %d decisions, %v", len(ds), err)
	}
	for i, d := range ds {
		if d.Reason != reqs[i].Resource.ID {
			t.Fatalf("decision %d answers %s, want %s", i, d.Reason, reqs[i].Resource.ID)
		}
	}
	if p.calls != 1 {
		t.Fatalf("%d calls, want the whole request in one", p.calls)
	}
}

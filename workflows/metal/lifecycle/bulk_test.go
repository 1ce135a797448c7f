package lifecycle

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	activities "github.com/better-compute/better-compute/activities/metal"
)

// gate counts the node operations in flight and holds each until as many
// as the bound allows are in flight together (or every node left is), so
// a bulk run that ran one at a time never finishes and one that ran more
// than the bound at once shows it.
type gate struct {
	mu       sync.Mutex
	cond     *sync.Cond
	inFlight int
	max      int
	left     int
	limit    int
}

func newGate(nodes, limit int) *gate {
	g := &gate{left: nodes, limit: limit}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *gate) start() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inFlight++
	g.max = max(g.max, g.inFlight)
	g.cond.Broadcast()
}

func (g *gate) await() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.inFlight < min(g.limit, g.left) {
		g.cond.Wait()
	}
	g.inFlight--
	g.left--
	g.cond.Broadcast()
}

// A bulk run keeps at most its concurrency of lifecycles in flight, and
// answers every node's result in order.
func TestBulkRespectsTheConcurrencyBound(t *testing.T) {
	const nodes, limit = 7, 3
	g := newGate(nodes, limit)
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	// The machine is shared: a slow workflow task is not a deadlock.
	env.SetWorkerOptions(worker.Options{DeadlockDetectionTimeout: time.Minute})
	Register(env, &activities.Metal{Store: newFakeStore()})
	env.OnActivity(activities.ActivityStartNode, mock.Anything, mock.Anything).Return(
		func(_ context.Context, p activities.MetalParams) error {
			g.start()
			return nil
		})
	env.OnActivity(activities.ActivityAwaitOutcome, mock.Anything, mock.Anything).Return(
		func(_ context.Context, p activities.MetalParams) (activities.BulkResult, error) {
			g.await()
			if p.NodeID == "node_4" {
				return activities.BulkResult{NodeID: p.NodeID, State: "failed", Error: "bmc: unreachable"}, nil
			}
			return activities.BulkResult{NodeID: p.NodeID, State: "ready"}, nil
		})
	p := activities.BulkParams{TenantID: "ten_a", PoolID: "pool_1", Operation: "provide", Concurrency: limit}
	for i := range nodes {
		p.Nodes = append(p.Nodes, activities.BulkNode{NodeID: fmt.Sprintf("node_%d", i), OpSeq: int64(i + 1)})
	}
	env.ExecuteWorkflow(activities.MetalBulkWorkflowName, p)
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res []activities.BulkResult
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if g.max != limit {
		t.Fatalf("at most %d operations were in flight at once, want %d", g.max, limit)
	}
	if len(res) != nodes {
		t.Fatalf("results %+v", res)
	}
	for i, r := range res {
		want := "ready"
		if i == 4 {
			want = "failed"
		}
		if r.NodeID != fmt.Sprintf("node_%d", i) || r.State != want {
			t.Fatalf("result %d = %+v", i, r)
		}
	}
}

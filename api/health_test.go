package api

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"

	"go.temporal.io/sdk/client"

	"github.com/better-compute/better-compute/internal/testenv"
)

// echoTemporal stands in for Temporal: each health workflow it is asked to
// start is counted and echoes its nonce.
type echoTemporal struct {
	client.Client
	starts atomic.Int32
}

func (e *echoTemporal) ExecuteWorkflow(_ context.Context, o client.StartWorkflowOptions, _ any, args ...any) (client.WorkflowRun, error) {
	e.starts.Add(1)
	return echoRun{id: o.ID, nonce: args[0].(string)}, nil
}

type echoRun struct {
	client.WorkflowRun
	id, nonce string
}

func (r echoRun) Get(_ context.Context, out any) error {
	*out.(*string) = r.nonce
	return nil
}

// Two /healthz calls in a row share one Temporal round trip.
func TestHealthTwiceStartsOneWorkflow(t *testing.T) {
	tc := &echoTemporal{}
	srv := newTestServer(t, Deps{Store: testenv.Store(t), Temporal: tc, TaskQueue: "control-plane"})
	var checked []int64
	for range 2 {
		resp, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		var h Health
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !h.Checks["temporal"].OK {
			t.Fatalf("healthz = %d %+v", resp.StatusCode, h)
		}
		checked = append(checked, h.Checks["temporal"].CheckedAt)
	}
	if n := tc.starts.Load(); n != 1 {
		t.Fatalf("two health checks started %d workflows, want 1", n)
	}
	if checked[0] != checked[1] {
		t.Fatalf("the second check answered a round trip of %d, want the first's, %d", checked[1], checked[0])
	}
}

package e2e

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/webhooks"
	"github.com/better-compute/better-compute/deploy/devstack"
	"github.com/better-compute/better-compute/internal/freeport"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
)

// A webhook on the dev stack, fed by a real worker process that is killed
// with SIGKILL mid-stream: every event arrives, verified with the Standard
// Webhooks library, in order, once after deduplicating by webhook-id.
func TestWebhookDeliveriesSurviveAKilledWorker(t *testing.T) {
	dir := stackDir(t)
	pgPort, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	s, err := devstack.Start(context.Background(), devstack.Options{Dir: dir, APIAddr: "127.0.0.1:0", AgentAddr: "127.0.0.1:0",
		PostgresPort: pgPort, TemporalAddr: "127.0.0.1:0", UIAddr: "-", Agents: -1, NoWorker: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("devstack: %v", err)
	}
	t.Cleanup(func() { s.Stop(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	worker := workerProcess(t, s)
	token, err := s.DemoToken()
	if err != nil {
		t.Fatal(err)
	}
	acme := api.NewClient(s.APIURL(), token)

	var mu sync.Mutex
	var secret string
	seen := map[string]int{}
	var seqs []float64
	requests := 0
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		requests++
		if requests%15 == 0 { // an unreliable receiver
			http.Error(w, "flaky", http.StatusServiceUnavailable)
			return
		}
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil || wh.Verify(body, r.Header) != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		id := r.Header.Get("webhook-id")
		if seen[id]++; seen[id] == 1 {
			var m struct {
				Data struct {
					Seq  float64        `json:"seq"`
					Data map[string]any `json:"data"`
				} `json:"data"`
			}
			_ = json.Unmarshal(body, &m)
			if m.Data.Data["e2e"] == true {
				seqs = append(seqs, m.Data.Seq)
			}
		}
	}))
	defer hook.Close()
	created, err := webhooks.Create.Call(ctx, acme, webhooks.CreateInput{TenantID: "acme", URL: hook.URL, EventTypes: []string{"reservation.*"}})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	secret = created.Secret
	mu.Unlock()

	st, err := store.Open(ctx, s.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	publish := func(n int) {
		for i := 0; i < n; i++ {
			if err := st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
				return store.PublishEvent(ctx, tx, store.Event{TenantID: "acme", Type: "reservation.extended", ResourceType: "reservation",
					ResourceID: "rsv_e2e", Data: map[string]any{"e2e": true, "i": i}})
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	delivered := func() int { mu.Lock(); defer mu.Unlock(); return len(seqs) }
	began := time.Now()
	publish(40)
	testutil.Eventually(t, time.Minute, "ten deliveries", func() bool { return delivered() >= 10 })
	if err := worker.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = worker.Wait()
	killedAt := delivered()
	publish(20)
	workerProcess(t, s)
	testutil.Eventually(t, 2*time.Minute, "sixty deliveries", func() bool { return delivered() >= 60 })
	t.Logf("60 events in %v (the worker killed after %d, its activity retried after its heartbeat timeout)",
		time.Since(began).Round(time.Millisecond), killedAt)

	mu.Lock()
	defer mu.Unlock()
	if len(seqs) != 60 {
		t.Fatalf("%d events delivered, want 60", len(seqs))
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Fatalf("out of order at %d: %v", i, seqs)
		}
	}
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	t.Logf("%d requests for %d messages (every 15th answered 503), %d duplicates deduplicated", requests, len(seen), dups)
}

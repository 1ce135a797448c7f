package webhooks_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"

	"github.com/better-compute/better-compute/activities/webhooks"
	sender "github.com/better-compute/better-compute/drivers/webhooks"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/store"
	"github.com/better-compute/better-compute/store/secrets"
	domain "github.com/better-compute/better-compute/store/webhooks"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// BenchmarkDeliver measures delivery throughput: b.N events per webhook,
// each webhook of its own tenant with its own loopback receiver, sent by
// the delivery activity (signing, one POST, two transactions each), the
// webhooks' activities running side by side as their workflows would.
func BenchmarkDeliver(b *testing.B) {
	for _, hooks := range []int{1, 8} {
		b.Run(fmt.Sprintf("webhooks=%d", hooks), func(b *testing.B) { benchDeliver(b, hooks) })
	}
}

func benchDeliver(b *testing.B, hooks int) {
	ctx := context.Background()
	st := testenv.Store(b)
	kek, err := secrets.GenerateKEK()
	if err != nil {
		b.Fatal(err)
	}
	keys, err := secrets.ParseKeyring(kek)
	if err != nil {
		b.Fatal(err)
	}
	vault := secrets.NewVault(keys, "root")
	var received atomic.Int64
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		received.Add(1)
	}))
	defer rcv.Close()
	a := &webhooks.Webhooks{Store: st, Vault: vault, Sender: sender.New(true, 5*time.Second), IdlePoll: time.Millisecond}
	ids := make([]string, hooks)
	for i := range ids {
		tenant := fmt.Sprintf("bench-%d", i)
		if err := st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			w, _, err := domain.Create(ctx, tx, vault, tenant, "idn_bench", domain.New{URL: rcv.URL, EventTypes: []string{"*"}})
			ids[i] = w.ID
			return err
		}); err != nil {
			b.Fatal(err)
		}
		if err := st.InTx(ctx, store.ReadWrite, func(tx store.Tx) error {
			for n := 0; n < b.N; n++ {
				if err := store.PublishEvent(ctx, tx, store.Event{TenantID: tenant, Type: "reservation.placed",
					ResourceType: "reservation", ResourceID: "rsv_bench", Data: map[string]any{"n": n}}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	var suite testsuite.WorkflowTestSuite
	suite.SetLogger(tlog.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	b.ResetTimer()
	began := time.Now()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			env := suite.NewTestActivityEnvironment()
			env.RegisterActivity(a.WebhookDeliver)
			sent := 0
			for sent < b.N {
				v, err := env.ExecuteActivity(a.WebhookDeliver, webhooks.Params{WebhookID: id})
				if err != nil {
					b.Error(err)
					return
				}
				var step webhooks.Step
				if err := v.Get(&step); err != nil {
					b.Error(err)
					return
				}
				sent += step.Sent
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began)
	b.StopTimer()
	if got := received.Load(); got != int64(hooks*b.N) {
		b.Fatalf("%d received, want %d", got, hooks*b.N)
	}
	b.ReportMetric(float64(hooks*b.N)/elapsed.Seconds(), "deliveries/s")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "deliveries/s/webhook")
}

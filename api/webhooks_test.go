package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"go.temporal.io/sdk/worker"

	webhooksact "github.com/better-compute/better-compute/activities/webhooks"
	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/webhooks"
	"github.com/better-compute/better-compute/core"
	sender "github.com/better-compute/better-compute/drivers/webhooks"
	"github.com/better-compute/better-compute/internal/testutil"
	"github.com/better-compute/better-compute/store"
	webhookswf "github.com/better-compute/better-compute/workflows/webhooks"
)

// receiver is a webhook endpoint as a tenant writes one: it verifies each
// delivery with the Standard Webhooks library against the secrets it
// holds, answers the next injected statuses first, and keeps the messages
// it accepted, deduplicated by webhook-id, in arrival order.
type receiver struct {
	mu       sync.Mutex
	secrets  []string
	fail     int // answer 500 to this many more requests
	requests int
	seen     map[string]int // webhook-id → times accepted
	order    []map[string]any
	bad      []string
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	if r.fail > 0 {
		r.fail--
		http.Error(w, "injected failure", http.StatusInternalServerError)
		return
	}
	verified := false
	for _, s := range r.secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err == nil && wh.Verify(body, req.Header) == nil {
			verified = true
		}
	}
	if !verified {
		r.bad = append(r.bad, req.Header.Get("webhook-id"))
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	id := req.Header.Get("webhook-id")
	r.seen[id]++
	if r.seen[id] == 1 {
		var msg map[string]any
		_ = json.Unmarshal(body, &msg)
		r.order = append(r.order, msg)
	}
	io.WriteString(w, "ok")
}

func (r *receiver) accepted() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]any(nil), r.order...)
}

// webhooksEnv serves env with a real Temporal, and answers a function that
// starts a worker delivering webhooks (to loopback, retrying after 50 ms).
func webhooksEnv(t *testing.T) (*env, func() worker.Worker) {
	e := newEnv(t)
	tc, _ := startTemporal(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	const queue = "webhooks-test-queue"
	startWorker := func() worker.Worker {
		w := worker.New(tc, queue, worker.Options{})
		webhookswf.Register(w, &webhooksact.Webhooks{Store: e.store, Vault: e.vault, Sender: sender.New(true, 5*time.Second),
			Temporal: tc, TaskQueue: queue, IdlePoll: 100 * time.Millisecond,
			Backoff: func(int) time.Duration { return 50 * time.Millisecond }})
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		return w
	}
	srv, err := api.New(api.Deps{Store: e.store, IAM: e.outer, Catalog: e.catalog, Logger: quiet, Secrets: e.vault,
		Temporal: tc, TaskQueue: queue, WebhookLoopback: true})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	e.server, e.url = srv, hs.URL
	return e, startWorker
}

// publish commits n events of typ for tenant, one transaction each.
func (e *env) publish(tenant, typ string, n int) {
	e.t.Helper()
	for i := 0; i < n; i++ {
		if err := e.store.InTx(context.Background(), store.ReadWrite, func(tx store.Tx) error {
			return store.PublishEvent(context.Background(), tx, store.Event{TenantID: tenant, Type: typ, ResourceType: "reservation",
				ResourceID: fmt.Sprintf("rsv_%d", i), Data: map[string]any{"i": i}})
		}); err != nil {
			e.t.Fatal(err)
		}
	}
}

func TestWebhooksDeliverSignedInOrderOnceThroughFailures(t *testing.T) {
	ctx := context.Background()
	e, startWorker := webhooksEnv(t)
	c := e.client(e.boot.UserToken)
	rcv := &receiver{seen: map[string]int{}, fail: 3}
	hook := httptest.NewServer(rcv)
	defer hook.Close()

	// The SSRF guard: private and link-local addresses are refused.
	for _, url := range []string{"https://10.0.0.7/hook", "https://169.254.169.254/latest", "https://[fd00::1]/hook"} {
		_, err := webhooks.Create.Call(ctx, c, webhooks.CreateInput{TenantID: "acme", URL: url, EventTypes: []string{"*"}})
		if ce := core.AsError(err); codeOf(err) != core.CodeInvalidInput || ce.Details["reason"] != "privateAddress" {
			t.Fatalf("create %s = %v, want INVALID_INPUT privateAddress", url, err)
		}
	}
	if _, err := webhooks.Create.Call(ctx, c, webhooks.CreateInput{TenantID: "acme", URL: hook.URL, EventTypes: []string{"nothing.*"}}); codeOf(err) != core.CodeInvalidInput {
		t.Fatalf("unknown event types = %v, want INVALID_INPUT", err)
	}
	created, err := webhooks.Create.Call(ctx, c, webhooks.CreateInput{TenantID: "acme", URL: hook.URL + "/hook",
		EventTypes: []string{"reservation.*", "webhook.ping"}})
	if err != nil || len(created.Secret) < 40 || created.Webhook.State != "active" {
		t.Fatalf("create = %+v, %v", created, err)
	}
	rcv.mu.Lock()
	rcv.secrets = []string{created.Secret}
	rcv.mu.Unlock()
	id := created.Webhook.ID

	// Events before the worker runs: reservation events (wanted), instance
	// events (not), and another tenant's.
	e.publish("acme", "reservation.placed", 10)
	e.publish("acme", "instance.running", 3)
	e.publish("globex", "reservation.placed", 5)
	w := startWorker()
	testutil.Eventually(t, 30*time.Second, "ten deliveries", func() bool { return len(rcv.accepted()) >= 10 })

	// The worker dies; what is published meanwhile arrives with the next.
	w.Stop()
	e.publish("acme", "reservation.active", 5)
	w = startWorker()
	defer func() { w.Stop() }()
	testutil.Eventually(t, 30*time.Second, "fifteen deliveries", func() bool { return len(rcv.accepted()) >= 15 })

	// A rotation: the receiver switches to the new secret alone at once.
	rotated, err := webhooks.RotateSecret.Call(ctx, c, webhooks.WebhookInput{TenantID: "acme", WebhookID: id})
	if err != nil || rotated.Secret == created.Secret || rotated.Webhook.PreviousSecretValidUntil == nil {
		t.Fatalf("rotate = %+v, %v", rotated, err)
	}
	rcv.mu.Lock()
	rcv.secrets = []string{rotated.Secret}
	rcv.mu.Unlock()
	e.publish("acme", "reservation.released", 5)
	ping, err := webhooks.Ping.Call(ctx, c, webhooks.WebhookInput{TenantID: "acme", WebhookID: id})
	if err != nil || ping.EventType != "webhook.ping" {
		t.Fatalf("ping = %+v, %v", ping, err)
	}
	testutil.Eventually(t, 30*time.Second, "twenty deliveries and the ping", func() bool { return len(rcv.accepted()) >= 21 })

	got := rcv.accepted()
	if len(got) != 21 || len(rcv.bad) != 0 {
		t.Fatalf("%d accepted (want 21), %d with bad signatures", len(got), len(rcv.bad))
	}
	last := 0.0
	for i, m := range got[:20] {
		data, _ := m["data"].(map[string]any)
		seq, _ := data["seq"].(float64)
		if seq <= last || m["type"] == "instance.running" {
			t.Fatalf("delivery %d = %v after seq %v: out of order or unwanted", i, m, last)
		}
		last = seq
	}
	if got[20]["type"] != "webhook.ping" {
		t.Fatalf("last = %v, want the ping", got[20])
	}
	// At least once: a worker stopped between a send and its record sends
	// again; the receiver's deduplication keeps one of each.
	dups := 0
	for _, n := range rcv.seen {
		dups += n - 1
	}
	t.Logf("%d requests for %d messages (%d injected failures, %d duplicates)", rcv.requests, len(got), 3, dups)

	// The record: the first delivery's three failed attempts, then a 200.
	var all []webhooks.Delivery
	for cursor := ""; ; {
		page, err := webhooks.DeliveriesList.Call(ctx, c, webhooks.DeliveriesInput{TenantID: "acme", WebhookID: id,
			ListInput: rpcList(100, cursor)})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page.Items...)
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if len(all) != 21 {
		t.Fatalf("%d deliveries listed, want 21", len(all))
	}
	// The first event's delivery took the three failures (deliveries made
	// in one fan-out share their creation instant, so find it by attempts).
	first := all[0]
	for _, d := range all {
		if d.Attempts > first.Attempts {
			first = d
		}
	}
	if first.State != "delivered" || first.Attempts != 4 || len(first.LastAttempts) != 4 ||
		first.LastAttempts[0].StatusCode != 200 || first.LastAttempts[3].StatusCode != 500 ||
		first.LastAttempts[3].Response == "" {
		t.Fatalf("first delivery = %+v", first)
	}

	// A redelivery sends the same message id again: the receiver sees it
	// twice and deduplicates.
	before := func() int { rcv.mu.Lock(); defer rcv.mu.Unlock(); return rcv.seen[first.ID] }()
	if _, err := webhooks.Redeliver.Call(ctx, c, webhooks.RedeliverInput{TenantID: "acme", WebhookID: id, DeliveryID: first.ID}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the redelivery", func() bool {
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		return rcv.seen[first.ID] == before+1
	})

	// Another tenant: its own tenant answers NOT_FOUND, acme's ACCESS_DENIED.
	g := e.client(e.globex)
	if _, err := webhooks.Get.Call(ctx, g, webhooks.WebhookInput{TenantID: "globex", WebhookID: id}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex get = %v, want NOT_FOUND", err)
	}
	if _, err := webhooks.Redeliver.Call(ctx, g, webhooks.RedeliverInput{TenantID: "acme", WebhookID: id, DeliveryID: first.ID}); codeOf(err) != core.CodeAccessDenied {
		t.Fatalf("globex redeliver in acme = %v, want ACCESS_DENIED", err)
	}
	if _, err := webhooks.Redeliver.Call(ctx, g, webhooks.RedeliverInput{TenantID: "globex", WebhookID: id, DeliveryID: first.ID}); codeOf(err) != core.CodeNotFound {
		t.Fatalf("globex redeliver = %v, want NOT_FOUND", err)
	}
	// No secret is kept in clear.
	if n := e.count(`SELECT count(*) FROM webhooks WHERE position($1::bytea in secret_sealed) > 0 OR url = $2`,
		[]byte(rotated.Secret[6:]), rotated.Secret); n != 0 {
		t.Fatal("a signing secret is stored in clear")
	}
}

// A receiver that answers 500 forever: retried with backoff until the
// horizon, then the delivery is failed and the webhook failing; what was
// published meanwhile stays queued and goes out, in order, once enabled.
func TestWebhooksFailingAfterTheHorizonLoseNothing(t *testing.T) {
	ctx := context.Background()
	e, startWorker := webhooksEnv(t)
	c := e.client(e.boot.UserToken)
	rcv := &receiver{seen: map[string]int{}, fail: 1 << 30}
	hook := httptest.NewServer(rcv)
	defer hook.Close()
	created, err := webhooks.Create.Call(ctx, c, webhooks.CreateInput{TenantID: "acme", URL: hook.URL, EventTypes: []string{"*"}})
	if err != nil {
		t.Fatal(err)
	}
	rcv.secrets = []string{created.Secret}
	w := startWorker()
	defer func() { w.Stop() }()
	e.publish("acme", "reservation.placed", 3)
	testutil.Eventually(t, 30*time.Second, "retries", func() bool {
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		return rcv.requests >= 3
	})
	// Three days pass for the head delivery.
	e.exec(`UPDATE webhook_deliveries SET first_attempt_at = now() - interval '73 hours' WHERE webhook_id = $1 AND first_attempt_at IS NOT NULL`,
		created.Webhook.ID)
	testutil.Eventually(t, 30*time.Second, "failing", func() bool {
		got, err := webhooks.Get.Call(ctx, c, webhooks.WebhookInput{TenantID: "acme", WebhookID: created.Webhook.ID})
		return err == nil && got.State == "failing" && got.LastError != "" && got.Pending == 2
	})
	e.publish("acme", "reservation.active", 2)
	// The receiver is fixed; the owner enables the webhook and redelivers
	// the failed one.
	rcv.mu.Lock()
	rcv.fail = 0
	rcv.mu.Unlock()
	enabled := true
	if _, err := webhooks.Update.Call(ctx, c, webhooks.UpdateInput{TenantID: "acme", WebhookID: created.Webhook.ID, Enabled: &enabled}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the queued four", func() bool { return len(rcv.accepted()) == 4 })
	page, err := webhooks.DeliveriesList.Call(ctx, c, webhooks.DeliveriesInput{TenantID: "acme", WebhookID: created.Webhook.ID})
	if err != nil {
		t.Fatal(err)
	}
	var failed string
	for _, d := range page.Items {
		if d.State == "failed" {
			failed = d.ID
		}
	}
	if failed == "" {
		t.Fatalf("no failed delivery in %+v", page.Items)
	}
	if _, err := webhooks.Redeliver.Call(ctx, c, webhooks.RedeliverInput{TenantID: "acme", WebhookID: created.Webhook.ID, DeliveryID: failed}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "all five", func() bool { return len(rcv.accepted()) == 5 })
}

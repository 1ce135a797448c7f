package session

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/commands"
	"github.com/better-compute/better-compute/agent/join"
)

func TestQueueDropsRedeliveriesAndKeepsOrder(t *testing.T) {
	q := newQueue(2)
	for _, seq := range []int64{1, 2, 3, 3, 4} {
		q.push(commands.Command{Seq: seq})
	}
	q.cancel(4)
	ctx := context.Background()
	if c, cancelled, ok := q.next(ctx); !ok || c.Seq != 3 || cancelled {
		t.Fatalf("first: %d %v %v", c.Seq, cancelled, ok)
	}
	if c, cancelled, ok := q.next(ctx); !ok || c.Seq != 4 || !cancelled {
		t.Fatalf("second: %d %v %v", c.Seq, cancelled, ok)
	}
	q.raise(10)
	q.push(commands.Command{Seq: 9})
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, ok := q.next(ctx); ok {
		t.Fatal("a redelivery below the raised seq was queued")
	}
}

// A refused session is retried with growing waits, never in a tight loop,
// and Run ends cleanly with its context.
func TestRunBacksOffWhenRefused(t *testing.T) {
	var attempts atomic.Int32
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		http.Error(w, `{"error":{"code":"ACCESS_DENIED"}}`, http.StatusForbidden)
	}))
	hs.EnableHTTP2 = true
	hs.StartTLS()
	defer hs.Close()
	client := hs.Client()
	client.Transport.(*http.Transport).TLSClientConfig.MinVersion = tls.VersionTLS12
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := Run(ctx, Options{Identity: join.Identity{NodeID: "node_x", AgentEndpoint: hs.URL}, HTTPClient: client,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Waits of at least 50, 100, 200, 400 ms fit in one second: at most 5 attempts.
	if n := attempts.Load(); n < 2 || n > 5 {
		t.Fatalf("%d attempts in a second", n)
	}
}

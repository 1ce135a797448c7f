package session

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/commands"
	"github.com/better-compute/better-compute/agent/join"
	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/internal/testutil"
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

// A result written on a session whose server died before reading it is
// sent again on the next session: the server never redelivers a command at
// or below the hello's lastExecutedSeq, so a result lost in flight would
// leave the command delivered forever.
func TestResultsAreSentAgainOnTheNextSession(t *testing.T) {
	var sessions atomic.Int32
	resent := make(chan struct{})
	var once sync.Once
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := sessions.Add(1)
		flush := func(v any) {
			_ = json.NewEncoder(w).Encode(v)
			_ = http.NewResponseController(w).Flush()
		}
		// The agent sends hello once the response's headers are in.
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
		sc := bufio.NewScanner(r.Body)
		if !sc.Scan() { // hello
			return
		}
		flush(protocol.Welcome{Type: protocol.FrameWelcome, NodeID: "node_x", Epoch: int64(n), HeartbeatSeconds: 10, LeaseSeconds: 30})
		if n == 1 {
			flush(protocol.Command{Type: protocol.FrameCommand, Seq: 5, ID: "cmd_x", Kind: protocol.CommandExec, Args: json.RawMessage(`{}`)})
		}
		for sc.Scan() {
			f, err := protocol.DecodeAgentFrame(sc.Bytes())
			if res, ok := f.(protocol.Result); err == nil && ok && res.Seq == 5 {
				if n == 1 {
					return // dies with the result read but never recorded
				}
				once.Do(func() { close(resent) })
			}
		}
	}))
	hs.EnableHTTP2 = true
	hs.StartTLS()
	defer hs.Close()
	client := hs.Client()
	client.Transport.(*http.Transport).TLSClientConfig.MinVersion = tls.VersionTLS12
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // before the server's Close, which waits for its handlers
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Identity: join.Identity{NodeID: "node_x", AgentEndpoint: hs.URL}, HTTPClient: client,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	}()
	testutil.Eventually(t, 20*time.Second, "the result sent again on the second session", func() bool {
		select {
		case <-resent:
			return true
		default:
			return false
		}
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

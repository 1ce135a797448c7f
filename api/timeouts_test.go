package api_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api"
	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/internal/testutil"
)

// closedByPeer reads conn until the server closes it, in the background;
// the returned flag turns true then.
func closedByPeer(conn net.Conn) *atomic.Bool {
	var closed atomic.Bool
	go func() {
		_, _ = io.Copy(io.Discard, conn)
		closed.Store(true)
	}()
	return &closed
}

// A client that sends its headers and part of a body, then stalls, loses
// the connection once the listener's read timeout passes; so does a
// kept-alive connection that sends nothing more.
func TestAPIListenerBoundsBodiesAndIdleConnections(t *testing.T) {
	srv, err := api.New(api.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Timeouts: httpx.Timeouts{ReadHeader: 200 * time.Millisecond, Read: 200 * time.Millisecond, Idle: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})

	trickle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer trickle.Close()
	if _, err := io.WriteString(trickle, "POST /api/compute/system/whoami HTTP/1.1\r\nHost: api\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ten"); err != nil {
		t.Fatal(err)
	}
	stalled := closedByPeer(trickle)
	testutil.Eventually(t, 30*time.Second, "the server to close a connection whose body stalls", stalled.Load)

	idle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET /healthz/none HTTP/1.1\r\nHost: api\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	kept := closedByPeer(idle)
	testutil.Eventually(t, 30*time.Second, "the server to close an idle kept-alive connection", kept.Load)
}

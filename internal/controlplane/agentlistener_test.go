package controlplane_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/api/httpx"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/internal/controlplane"
	"github.com/better-compute/better-compute/internal/nodeca"
	"github.com/better-compute/better-compute/internal/testenv"
	"github.com/better-compute/better-compute/internal/testutil"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// nodeCertificate is a client certificate of ca for a made-up node.
func nodeCertificate(t *testing.T, ca *nodeca.CA) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	nodeID := core.NewID("node")
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: nodeID}}, key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := ca.SignNode(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nodeID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	return tls.Certificate{Certificate: [][]byte{b.Bytes}, PrivateKey: key}
}

// The agent listener bounds what a connection may hold without a session:
// a TLS handshake that stalls, and an HTTP/2 connection that opens no
// stream, are closed once its timeouts pass. (A session's stream clears its
// own read deadline; its lifetime is the liveness lease's.)
func TestAgentListenerClosesStalledAndIdleConnections(t *testing.T) {
	ctx := context.Background()
	ca, err := nodeca.LoadOrGenerate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.New(ctx, controlplane.Config{
		Store: testenv.Store(t), NodeCA: ca, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		AgentTimeouts: httpx.Timeouts{ReadHeader: 200 * time.Millisecond, Read: 200 * time.Millisecond, Idle: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cp.ServeAgents(sctx, ln, []string{"127.0.0.1"}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	})
	closedByPeer := func(conn net.Conn) *atomic.Bool {
		var closed atomic.Bool
		go func() {
			_, _ = io.Copy(io.Discard, conn)
			closed.Store(true)
		}()
		return &closed
	}

	// A handshake that never finishes: a few bytes of a ClientHello.
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01}); err != nil {
		t.Fatal(err)
	}
	stalled := closedByPeer(raw)
	testutil.Eventually(t, 30*time.Second, "the agent listener to close a stalled handshake", stalled.Load)

	// A node's connection that completes TLS and HTTP/2's preface, then
	// opens no stream.
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{
		RootCAs: ca.Pool(), ServerName: "127.0.0.1", NextProtos: []string{"h2"},
		Certificates: []tls.Certificate{nodeCertificate(t, ca)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	preface := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 0x4, 0, 0, 0, 0, 0) // and an empty SETTINGS frame
	if _, err := conn.Write(preface); err != nil {
		t.Fatal(err)
	}
	idle := closedByPeer(conn)
	testutil.Eventually(t, 30*time.Second, "the agent listener to close an idle HTTP/2 connection", idle.Load)
}

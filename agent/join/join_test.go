package join

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/core/inventory"
	"github.com/better-compute/better-compute/internal/nodeca"
)

func TestDefaultName(t *testing.T) {
	for host, want := range map[string]string{"GPU-07.rack.example": "gpu-07", "a_b": "a-b", "--": "node"} {
		if got := defaultName(&inventory.NodeInventory{System: inventory.System{Hostname: host}}); got != want {
			t.Errorf("defaultName(%q) = %q, want %q", host, got, want)
		}
	}
}

// A restarted agent resumes polling its pending join instead of joining
// again; a rejection forgets it.
func TestJoinResumesPending(t *testing.T) {
	ca, err := nodeca.LoadOrGenerate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var joins, polls atomic.Int32
	var approve atomic.Bool
	var csr string
	// The first Join gives up (its context cancelled) once the server has
	// answered a poll "still pending": no deadline, so a loaded machine
	// cannot make it stop before it polled.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var in map[string]any
		_ = json.Unmarshal(raw, &in)
		switch r.URL.Path {
		case "/agent/v1/join":
			joins.Add(1)
			csr, _ = in["csr"].(string)
			w.WriteHeader(http.StatusAccepted)
			_, _ = w.Write([]byte(`{"joinRequestId":"jreq_1","state":"pending","requestSecret":"bcjr_s"}`))
		case "/agent/v1/join/status":
			polls.Add(1)
			if in["requestSecret"] != "bcjr_s" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			if !approve.Load() {
				defer cancel()
				w.WriteHeader(http.StatusAccepted)
				_, _ = w.Write([]byte(`{"joinRequestId":"jreq_1","state":"pending"}`))
				return
			}
			cert, _, err := ca.SignNode([]byte(csr), "node_1", time.Hour)
			if err != nil {
				t.Error(err)
			}
			_ = json.NewEncoder(w).Encode(map[string]string{"nodeId": "node_1", "certificate": string(cert),
				"caCertificate": string(ca.CertPEM()), "agentEndpoint": "https://a:1"})
		}
	}))
	defer srv.Close()
	dir := t.TempDir()
	o := Options{APIURL: srv.URL, Token: "bcjt_x", StateDir: dir, Name: "n1", Inventory: &inventory.NodeInventory{},
		PollInterval: 5 * time.Millisecond}
	_, err = Join(ctx, o)
	if !errors.Is(err, context.Canceled) || joins.Load() != 1 || polls.Load() == 0 {
		t.Fatalf("pending join = %v (joins %d, polls %d)", err, joins.Load(), polls.Load())
	}
	approve.Store(true)
	id, err := Join(context.Background(), o)
	if err != nil || id.NodeID != "node_1" || id.AgentEndpoint != "https://a:1" || joins.Load() != 1 {
		t.Fatalf("resumed join = %+v, %v (joins %d)", id, err, joins.Load())
	}
	for _, f := range []string{pendingJoinFile, pendingKeyFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s outlived the join: %v", f, err)
		}
	}
	if id.TLSConfig().Certificates[0].PrivateKey == nil {
		t.Fatal("no key in the TLS configuration")
	}
	// Joined: nothing is sent again.
	if _, err := Join(context.Background(), o); err != nil || joins.Load() != 1 {
		t.Fatalf("join when joined = %v, joins %d", err, joins.Load())
	}
}

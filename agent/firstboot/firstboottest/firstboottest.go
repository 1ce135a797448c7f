// Package firstboottest is a join endpoint for tests of a first boot: an
// httptest handler with a real node CA that signs the CSR of each join it
// accepts, and records every join request.
package firstboottest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
)

// JoinAPI answers protocol.JoinPath: Fail times Status with Body, then a
// joined node NodeID with the certificate its CA signed for the CSR.
type JoinAPI struct {
	NodeID        string
	AgentEndpoint string

	mu     sync.Mutex
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  string
	joins  []protocol.JoinRequest
	fail   int
	status int
	body   string
	serial int64
}

// New makes the endpoint and its CA.
func New(t testing.TB, nodeID, agentEndpoint string) *JoinAPI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test node CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &JoinAPI{NodeID: nodeID, AgentEndpoint: agentEndpoint, ca: ca, caKey: key, serial: 1,
		caPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// FailNext makes the next n joins answer status with body (a JSON error).
func (a *JoinAPI) FailNext(n, status int, body string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.fail, a.status, a.body = n, status, body
}

// Requests are the join requests received, oldest first.
func (a *JoinAPI) Requests() []protocol.JoinRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]protocol.JoinRequest(nil), a.joins...)
}

func (a *JoinAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != protocol.JoinPath {
		http.NotFound(w, r)
		return
	}
	var req protocol.JoinRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.joins = append(a.joins, req)
	fail := a.fail > 0
	if fail {
		a.fail--
	}
	a.serial++
	serial := a.serial
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if fail {
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.body))
		return
	}
	block, _ := pem.Decode([]byte(req.CSR))
	if block == nil {
		http.Error(w, "no CSR", http.StatusBadRequest)
		return
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: csr.Subject, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.ca, csr.PublicKey, a.caKey)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_ = json.NewEncoder(w).Encode(protocol.JoinResult{NodeID: a.NodeID, AgentEndpoint: a.AgentEndpoint,
		Certificate: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), CACertificate: a.caPEM})
}

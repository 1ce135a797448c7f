package nodeca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func csr(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func TestNodeCertificatesVerifyAndNameTheirNode(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrGenerate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	again, err := LoadOrGenerate(dir)
	if err != nil || string(again.CertPEM()) != string(ca.CertPEM()) {
		t.Fatalf("a second LoadOrGenerate made another CA: %v", err)
	}
	// The CN the agent asks for is ignored: the CA names the node.
	certPEM, serial, err := ca.SignNode(csr(t, "node_someone_else"), "node_01abc", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if id, err := NodeID(cert); err != nil || id != "node_01abc" || cert.Subject.CommonName != "node_01abc" {
		t.Fatalf("NodeID = %q, %v (CN %q)", id, err, cert.Subject.CommonName)
	}
	if serial != Serial(cert.SerialNumber) || serial == "" {
		t.Fatalf("serial %q", serial)
	}
	// Another CA's certificate does not verify.
	other, err := LoadOrGenerate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: other.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Fatal("a certificate of another CA verified")
	}
	// A request whose signature does not match is refused.
	bad := csr(t, "x")
	blk, _ := pem.Decode(bad)
	blk.Bytes[len(blk.Bytes)-3] ^= 0xff
	if _, _, err := ca.SignNode(pem.EncodeToMemory(blk), "node_x", time.Hour); err == nil {
		t.Fatal("a tampered request was signed")
	}
	srv, err := ca.ServerCertificate([]string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil || len(srv.Certificate) != 2 {
		t.Fatalf("server certificate: %v", err)
	}
}

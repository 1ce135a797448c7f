// Package nodeca is the control plane's node certificate authority: it signs
// the client certificates `bcd` uses for mutual TLS once a node has joined,
// and the server certificate of the agent listener in the dev stack.
//
// A node certificate names its node twice: the subject's common name and a
// URI SAN spiffe://better-compute/node/<nodeId>. NodeID reads the URI, which
// the CA alone writes. Revocation is not in the certificate: the API checks
// every session's serial against node_identities, so a revocation takes
// effect on the next request.
package nodeca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// nodeURIPrefix is the URI SAN prefix of node certificates.
const nodeURIPrefix = "spiffe://better-compute/node/"

// Files a generated CA keeps in its directory.
const (
	CertFile = "node-ca.crt"
	KeyFile  = "node-ca.key"
)

// CA signs node and agent-listener certificates.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     crypto.Signer
	pool    *x509.CertPool
}

// Load reads a CA certificate and its private key (PEM; PKCS#8, EC or RSA).
func Load(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("node CA: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("node CA: %w", err)
	}
	return parse(certPEM, keyPEM)
}

// LoadOrGenerate loads the CA kept in dir, creating it first (a 10-year
// ECDSA P-256 CA, the key written 0600) when dir has none: the dev stack's
// CA. Production deployments configure theirs with Load.
func LoadOrGenerate(dir string) (*CA, error) {
	certFile, keyFile := filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	if _, err := os.Stat(certFile); err == nil {
		return Load(certFile, keyFile)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "Better Compute node CA", Organization: []string{"Better Compute"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return nil, err
	}
	return parse(certPEM, keyPEM)
}

func parse(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("node CA: no certificate in the certificate file")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("node CA: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("node CA: the certificate is not a CA")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("node CA: no key in the key file")
	}
	var key any
	switch kb.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(kb.Bytes)
	default:
		err = fmt.Errorf("unsupported key type %q", kb.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("node CA key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, errors.New("node CA: the key cannot sign")
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, certPEM: certPEM, key: signer, pool: pool}, nil
}

// CertPEM is the CA certificate, for agents to trust.
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// Pool holds the CA certificate, for verifying node certificates.
func (ca *CA) Pool() *x509.CertPool { return ca.pool }

// SignNode checks a PEM certificate request's signature and issues a client
// certificate for nodeID, valid for ttl. It answers the certificate (PEM)
// and its serial number (hex), which the caller records to revoke it.
func (ca *CA) SignNode(csrPEM []byte, nodeID string, ttl time.Duration) (certPEM []byte, serial string, err error) {
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, "", errors.New("no PEM certificate request")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, "", err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, "", fmt.Errorf("certificate request signature: %w", err)
	}
	uri, err := url.Parse(nodeURIPrefix + nodeID)
	if err != nil {
		return nil, "", err
	}
	sn, err := newSerial()
	if err != nil {
		return nil, "", err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: nodeID, Organization: []string{"Better Compute node"}},
		URIs:         []*url.URL{uri},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, csr.PublicKey, ca.key)
	if err != nil {
		return nil, "", err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Serial(sn), nil
}

// ServerCertificate issues a server certificate for the agent listener,
// valid for the given host names and IP addresses for ttl.
func (ca *CA) ServerCertificate(hosts []string, ttl time.Duration) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	sn, err := newSerial()
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: "Better Compute agent listener"},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key}, nil
}

// NodeID is the node a verified client certificate was issued to.
func NodeID(cert *x509.Certificate) (string, error) {
	for _, u := range cert.URIs {
		if s := u.String(); strings.HasPrefix(s, nodeURIPrefix) && len(s) > len(nodeURIPrefix) {
			return strings.TrimPrefix(s, nodeURIPrefix), nil
		}
	}
	return "", errors.New("the certificate names no node")
}

// Serial is a certificate serial number as node_identities records it.
func Serial(n *big.Int) string { return hex.EncodeToString(n.Bytes()) }

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// Package emulator is a stateful Redfish service over real HTTPS, the test
// peer of the Redfish driver: each BMC it serves listens on its own port
// and controls one machine (package machines) as its single system "1",
// with the resources real BMCs expose (service root, Systems with Boot
// override and Reset, Managers with VirtualMedia, Chassis, Bios,
// UpdateService with FirmwareInventory, TaskService with task monitors,
// SessionService, host console log) and switchable misbehaviour (Faults):
// writes acknowledged but not applied, 503 bursts, slow tasks and dropped
// connections. bmclib and gofish drive it unmodified.
package emulator

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/better-compute/better-compute/drivers/machines"
)

// Config is what every BMC of an emulator shares.
type Config struct {
	// Username and Password are the BMCs' credentials (basic auth and
	// sessions). Both are required.
	Username string
	Password string
	// TaskDelay is how long a task (BIOS reset, firmware update) runs before
	// it completes; a BMC's Faults.SlowTasks overrides it. 200 ms when zero.
	TaskDelay time.Duration
	// MediaClient fetches virtual media images from their URLs, as a BMC
	// does; a client with a 10-minute timeout when nil.
	MediaClient *http.Client
	// MediaDir keeps the fetched images; a temporary directory, removed
	// by Close, when empty.
	MediaDir string
	// Hosts are extra names or addresses the certificate is valid for
	// (127.0.0.1, ::1 and localhost always are).
	Hosts []string
	// Logger gets the service's own events; discarded when nil.
	Logger *slog.Logger
}

// Emulator serves BMCs that share a certificate authority and a
// configuration.
type Emulator struct {
	cfg        Config
	caPEM      []byte
	tlsConfig  *tls.Config
	mediaDir   string
	ownsMedia  bool
	log        *slog.Logger
	mediaFetch *http.Client

	mu     sync.Mutex
	bmcs   map[string]*BMC
	closed bool
}

// New makes an emulator with a freshly generated certificate authority and
// a server certificate for the loopback names.
func New(cfg Config) (*Emulator, error) {
	if cfg.Username == "" || cfg.Password == "" {
		return nil, errors.New("emulator: a username and a password are required")
	}
	if cfg.TaskDelay <= 0 {
		cfg.TaskDelay = 200 * time.Millisecond
	}
	e := &Emulator{cfg: cfg, bmcs: map[string]*BMC{}, log: cfg.Logger, mediaFetch: cfg.MediaClient}
	if e.log == nil {
		e.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if e.mediaFetch == nil {
		e.mediaFetch = &http.Client{Timeout: 10 * time.Minute}
	}
	caPEM, cert, err := generateCertificates(cfg.Hosts)
	if err != nil {
		return nil, fmt.Errorf("emulator: certificates: %w", err)
	}
	e.caPEM = caPEM
	e.tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	e.mediaDir = cfg.MediaDir
	if e.mediaDir == "" {
		dir, err := os.MkdirTemp("", "redfish-emulator-media-")
		if err != nil {
			return nil, fmt.Errorf("emulator: media directory: %w", err)
		}
		e.mediaDir, e.ownsMedia = dir, true
	} else if err := os.MkdirAll(e.mediaDir, 0o755); err != nil {
		return nil, fmt.Errorf("emulator: media directory: %w", err)
	}
	return e, nil
}

// CAPEM is the certificate authority's certificate (PEM): a client pins it
// to trust every BMC of this emulator.
func (e *Emulator) CAPEM() []byte { return append([]byte(nil), e.caPEM...) }

// CertPool is a pool holding only the emulator's certificate authority.
func (e *Emulator) CertPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.caPEM)
	return pool
}

// HTTPClient is a client that trusts the emulator's certificate authority.
func (e *Emulator) HTTPClient() *http.Client {
	return &http.Client{
		Timeout: time.Minute,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: e.CertPool(), MinVersion: tls.VersionTLS12},
		},
	}
}

// AddBMC serves a BMC for the machine on a free loopback port. The
// emulator owns the machine from then on: Close closes it.
func (e *Emulator) AddBMC(id string, m machines.Machine) (*BMC, error) {
	return e.AddBMCAt("127.0.0.1:0", id, m)
}

// AddBMCAt serves a BMC for the machine at addr (host:port).
func (e *Emulator) AddBMCAt(addr, id string, m machines.Machine) (*BMC, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("emulator: closed")
	}
	if _, dup := e.bmcs[id]; dup {
		return nil, fmt.Errorf("emulator: BMC %q exists", id)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("emulator: listen %s: %w", addr, err)
	}
	b := newBMC(e, id, m, ln.Addr().String())
	b.srv = &http.Server{
		Handler:           b,
		TLSConfig:         e.tlsConfig.Clone(),
		ReadHeaderTimeout: 30 * time.Second,
		// HTTP/1.1 only: BMCs speak it, and a dropped connection is then
		// one request's.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ErrorLog:     slog.NewLogLogger(e.log.Handler(), slog.LevelDebug),
	}
	e.bmcs[id] = b
	go func() {
		if err := b.srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Warn("redfish emulator: serve", "bmc", id, "err", err)
		}
	}()
	return b, nil
}

// BMC is the BMC of that id, nil when there is none.
func (e *Emulator) BMC(id string) *BMC {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.bmcs[id]
}

// Close stops every BMC, closes their machines and removes fetched media
// the emulator keeps in its own directory.
func (e *Emulator) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	bmcs := e.bmcs
	e.bmcs = map[string]*BMC{}
	e.mu.Unlock()
	var errs []error
	for _, b := range bmcs {
		errs = append(errs, b.close())
	}
	if e.ownsMedia {
		errs = append(errs, os.RemoveAll(e.mediaDir))
	}
	return errors.Join(errs...)
}

func generateCertificates(hosts []string) (caPEM []byte, cert tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "Redfish emulator CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, cert, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	leaf := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			leaf.IPAddresses = append(leaf.IPAddresses, ip)
		} else if h != "" {
			leaf.DNSNames = append(leaf.DNSNames, h)
		}
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	cert = tls.Certificate{Certificate: [][]byte{leafDER, caDER}, PrivateKey: key}
	return caPEM, cert, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

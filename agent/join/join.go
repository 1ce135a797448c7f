// Package join is `bcd node join`: it joins this machine to a pool with a
// join token (docs/agent-protocol.md, "Joining") and keeps the node's
// identity — its private key, its certificate and the node CA — in the
// state directory, every file mode 0600.
//
// The key never leaves the machine: the agent sends a certificate request
// (CSR) and receives the certificate the node CA signed for it. When the
// pool asks for approval, the pending request (its id and secret) is kept
// in the state directory too, so an agent restarted while it waits resumes
// polling instead of spending another token use.
package join

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/better-compute/better-compute/agent/protocol"
	"github.com/better-compute/better-compute/core"
	"github.com/better-compute/better-compute/core/inventory"
)

// Files of the state directory.
const (
	KeyFile          = "node.key"      // the node's private key (PKCS#8 PEM)
	CertFile         = "node.crt"      // its certificate, signed by the node CA
	CAFile           = "ca.crt"        // the node CA
	IdentityFile     = "identity.json" // {nodeId, agentEndpoint}; written last
	pendingKeyFile   = "join.key"      // the key of a join in flight
	pendingJoinFile  = "join-request.json"
	defaultPoll      = 5 * time.Second
	maxResponseBytes = 1 << 20
)

// Options configures Join.
type Options struct {
	// APIURL is the API's base URL, e.g. https://compute.example.com.
	APIURL string
	// Token is the join token (bcjt_…). It is sent once and never written.
	Token string
	// StateDir keeps the identity (created 0700 when missing).
	StateDir string
	// Name is the node's name (a DNS label); "" means the inventory's
	// hostname, first label, lower case.
	Name string
	// Inventory is the machine's NodeInventory v1 document.
	Inventory *inventory.NodeInventory
	// HTTPClient defaults to one with a 30 s timeout.
	HTTPClient *http.Client
	// PollInterval is how often a pending join is polled (default 5 s).
	PollInterval time.Duration
	// Force joins again even when StateDir holds an identity (the old one
	// stays until the new one is written).
	Force bool
}

// Identity is a joined node's identity, ready for mutual TLS with the
// agent listener.
type Identity struct {
	NodeID        string
	AgentEndpoint string
	// Certificate is the node's certificate and private key.
	Certificate tls.Certificate
	// CAPool holds the node CA: the agent listener's certificate is
	// verified against it.
	CAPool *x509.CertPool
}

// TLSConfig is a client TLS configuration presenting the identity and
// trusting only the node CA.
func (id Identity) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{id.Certificate}, RootCAs: id.CAPool}
}

// identityDoc is identity.json.
type identityDoc struct {
	NodeID        string `json:"nodeId"`
	AgentEndpoint string `json:"agentEndpoint"`
}

// pendingDoc is join-request.json.
type pendingDoc struct {
	JoinRequestID string `json:"joinRequestId"`
	RequestSecret string `json:"requestSecret"`
}

// joinResult is the API's 200 answer.
type joinResult = protocol.JoinResult

// ErrNoIdentity is LoadIdentity's error when the state directory holds no
// identity.
var ErrNoIdentity = errors.New("join: the state directory holds no node identity")

// LoadIdentity reads the identity kept in stateDir.
func LoadIdentity(stateDir string) (Identity, error) {
	raw, err := os.ReadFile(filepath.Join(stateDir, IdentityFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Identity{}, ErrNoIdentity
	}
	if err != nil {
		return Identity{}, fmt.Errorf("join: %w", err)
	}
	var doc identityDoc
	if err := json.Unmarshal(raw, &doc); err != nil || doc.NodeID == "" {
		return Identity{}, fmt.Errorf("join: %s is not an identity", IdentityFile)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(stateDir, CertFile), filepath.Join(stateDir, KeyFile))
	if err != nil {
		return Identity{}, fmt.Errorf("join: node certificate: %w", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(stateDir, CAFile))
	if err != nil {
		return Identity{}, fmt.Errorf("join: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return Identity{}, fmt.Errorf("join: %s holds no certificate", CAFile)
	}
	return Identity{NodeID: doc.NodeID, AgentEndpoint: doc.AgentEndpoint, Certificate: cert, CAPool: pool}, nil
}

// Join joins the machine and answers its identity. With an identity in
// StateDir already (and no Force) it sends nothing and answers that one.
// A pending join kept in StateDir is resumed (polled) rather than sent
// again. It polls while the join waits for approval, until ctx ends.
func Join(ctx context.Context, o Options) (Identity, error) {
	if o.StateDir == "" {
		return Identity{}, errors.New("join: a state directory is required")
	}
	if !o.Force {
		id, err := LoadIdentity(o.StateDir)
		if err == nil || !errors.Is(err, ErrNoIdentity) {
			return id, err
		}
	}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return Identity{}, fmt.Errorf("join: %w", err)
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if o.PollInterval <= 0 {
		o.PollInterval = defaultPoll
	}
	base := strings.TrimRight(o.APIURL, "/")
	if base == "" {
		return Identity{}, errors.New("join: the API URL is required")
	}

	var pending pendingDoc
	if raw, err := os.ReadFile(filepath.Join(o.StateDir, pendingJoinFile)); err == nil && json.Unmarshal(raw, &pending) == nil &&
		pending.JoinRequestID != "" && fileExists(filepath.Join(o.StateDir, pendingKeyFile)) {
		// A join waiting for approval: resume it.
	} else {
		pending = pendingDoc{}
		res, p, err := send(ctx, o, base)
		if err != nil {
			return Identity{}, err
		}
		if res != nil {
			return finish(o.StateDir, *res)
		}
		pending = *p
	}
	res, err := poll(ctx, o, base, pending)
	if err != nil {
		return Identity{}, err
	}
	return finish(o.StateDir, *res)
}

// send generates the key, posts the join and answers its result, or the
// pending request it became (kept in the state directory).
func send(ctx context.Context, o Options, base string) (*joinResult, *pendingDoc, error) {
	if o.Token == "" {
		return nil, nil, errors.New("join: a join token is required")
	}
	if o.Inventory == nil {
		return nil, nil, errors.New("join: the inventory is required")
	}
	name := o.Name
	if name == "" {
		name = defaultName(o.Inventory)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	if err := writeFile(o.StateDir, pendingKeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})); err != nil {
		return nil, nil, err
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, key)
	if err != nil {
		return nil, nil, err
	}
	inv, err := json.Marshal(o.Inventory)
	if err != nil {
		return nil, nil, err
	}
	body := protocol.JoinRequest{Token: o.Token, Name: name, Inventory: inv,
		CSR: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}))}
	status, raw, err := post(ctx, o.HTTPClient, base+protocol.JoinPath, body)
	if err != nil {
		return nil, nil, err
	}
	switch status {
	case http.StatusOK:
		var res joinResult
		if err := json.Unmarshal(raw, &res); err != nil || res.NodeID == "" {
			return nil, nil, errors.New("join: the API's answer is not a joined node")
		}
		return &res, nil, nil
	case http.StatusAccepted:
		var p pendingDoc
		if err := json.Unmarshal(raw, &p); err != nil || p.JoinRequestID == "" || p.RequestSecret == "" {
			return nil, nil, errors.New("join: the API's answer is not a join request")
		}
		doc, _ := json.Marshal(p)
		if err := writeFile(o.StateDir, pendingJoinFile, doc); err != nil {
			return nil, nil, err
		}
		return nil, &p, nil
	}
	return nil, nil, apiError(status, raw)
}

// poll asks for the pending join's decision every PollInterval. A
// rejected or expired request is forgotten, so the next join starts over.
func poll(ctx context.Context, o Options, base string, p pendingDoc) (*joinResult, error) {
	for {
		status, raw, err := post(ctx, o.HTTPClient, base+protocol.JoinStatusPath,
			protocol.JoinStatusRequest{JoinRequestID: p.JoinRequestID, RequestSecret: p.RequestSecret})
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, err
		case err != nil, status >= 500:
			// The API is unreachable or failing: keep waiting.
		case status == http.StatusOK:
			var res joinResult
			if err := json.Unmarshal(raw, &res); err != nil || res.NodeID == "" {
				return nil, errors.New("join: the API's answer is not a joined node")
			}
			return &res, nil
		case status == http.StatusAccepted:
		default:
			e := apiError(status, raw)
			var ce *core.Error
			if errors.As(e, &ce) && (ce.Code == core.CodeAccessDenied || ce.Code == core.CodeInvalidState || ce.Code == core.CodeUnauthn) {
				_ = os.Remove(filepath.Join(o.StateDir, pendingJoinFile))
				_ = os.Remove(filepath.Join(o.StateDir, pendingKeyFile))
			}
			return nil, e
		}
		t := time.NewTimer(o.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// finish keeps the identity: the key, the certificate, the CA, then
// identity.json, each written atomically (0600).
func finish(dir string, res joinResult) (Identity, error) {
	if err := os.Rename(filepath.Join(dir, pendingKeyFile), filepath.Join(dir, KeyFile)); err != nil {
		return Identity{}, fmt.Errorf("join: %w", err)
	}
	doc, err := json.Marshal(identityDoc{NodeID: res.NodeID, AgentEndpoint: res.AgentEndpoint})
	if err != nil {
		return Identity{}, err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{CertFile, []byte(res.Certificate)}, {CAFile, []byte(res.CACertificate)}, {IdentityFile, doc}} {
		if err := writeFile(dir, f.name, f.data); err != nil {
			return Identity{}, err
		}
	}
	_ = os.Remove(filepath.Join(dir, pendingJoinFile))
	return LoadIdentity(dir)
}

// post sends a JSON body and answers the status and the (bounded) body.
func post(ctx context.Context, c *http.Client, url string, body any) (int, []byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		// The URL error repeats no body: the token is not in it.
		return 0, nil, fmt.Errorf("join: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return 0, nil, fmt.Errorf("join: %w", err)
	}
	return resp.StatusCode, raw, nil
}

// apiError is the API's error answer as a *core.Error, when it is one.
func apiError(status int, raw []byte) error {
	var e struct {
		Error *core.Error `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Error != nil {
		return e.Error
	}
	return fmt.Errorf("join: HTTP %d", status)
}

var notLabel = regexp.MustCompile(`[^a-z0-9-]+`)

// defaultName is the hostname's first label as a DNS label.
func defaultName(inv *inventory.NodeInventory) string {
	h := inv.System.Hostname
	if h == "" {
		h, _ = os.Hostname()
	}
	h, _, _ = strings.Cut(strings.ToLower(h), ".")
	h = strings.Trim(notLabel.ReplaceAllString(h, "-"), "-")
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-")
	}
	if h == "" {
		h = "node"
	}
	return h
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// writeFile writes dir/name atomically, mode 0600: a temporary file,
// synced, renamed over the name.
func writeFile(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op once renamed
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("join: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("join: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("join: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	return nil
}

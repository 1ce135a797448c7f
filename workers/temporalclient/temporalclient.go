// Package temporalclient is how processes reach the Temporal frontend. It
// imports no workflow, activity or store, so that `bcd site` can dial
// Temporal without linking the control plane's database code.
package temporalclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/workflow"
)

// Config says how to reach the Temporal frontend.
type Config struct {
	Address   string // host:port of the frontend
	Namespace string
	// TLS: a client certificate and key (mutual TLS), a CA bundle to trust,
	// and the server name to verify. TLS is on when any of them is set.
	TLSCert, TLSKey, TLSCA, TLSServerName string
}

// Dial connects to Temporal and checks that the frontend answers. The
// propagators carry values of a caller's context in the headers of what
// the client starts, updates and signals.
func Dial(ctx context.Context, cfg Config, logger *slog.Logger, propagators ...workflow.ContextPropagator) (client.Client, error) {
	if cfg.Address == "" || cfg.Namespace == "" {
		return nil, errors.New("temporal: address and namespace are required")
	}
	opts := client.Options{
		HostPort:  cfg.Address,
		Namespace: cfg.Namespace,
		Logger:    tlog.NewStructuredLogger(logger),

		ContextPropagators: propagators,
	}
	tlsCfg, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts.ConnectionOptions.TLS = tlsCfg
	}
	c, err := client.DialContext(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("temporal: dial %s: %w", cfg.Address, err)
	}
	return c, nil
}

func (cfg Config) tlsConfig() (*tls.Config, error) {
	if cfg.TLSCert == "" && cfg.TLSKey == "" && cfg.TLSCA == "" && cfg.TLSServerName == "" {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.TLSServerName}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return nil, errors.New("temporal: TLS certificate and key go together")
	}
	if cfg.TLSCert != "" {
		pair, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("temporal: TLS key pair: %w", err)
		}
		t.Certificates = []tls.Certificate{pair}
	}
	if cfg.TLSCA != "" {
		pem, err := os.ReadFile(cfg.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("temporal: TLS CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("temporal: no certificate in %s", cfg.TLSCA)
		}
		t.RootCAs = pool
	}
	return t, nil
}
